"""The demo trainer: a small DDP job, instrumented by trainguard, that injects faults on cue.

Run it under torchrun (``trainguard demo`` / ``make demo`` do, as two elastic nodes):

    torchrun --nproc-per-node 2 -m trainguard.demo.train --steps 300 --checkpoint-dir ckpt \\
        --faults "straggler:rank=2,at=20s,factor=1.5;hang:rank=1,at=60s;oom:rank=0,at=90s"

It is also the integration example: ``trainguard.instrument`` on the DDP model, checkpoints
every N steps and on the remediation service's ``checkpoint_now``, resumes from the last one
on restart (torchrun elastic restarts the worker group after a node is excluded or the job is
restarted), and ``guarded_step`` so an out-of-memory step is retried in micro-batches.

Compute takes ``--step-seconds`` per step in ``forward``: ``--compute-share`` of it is real
arithmetic (square matmuls, as many as that share of the step takes on this machine, counted once
for the job), the rest a sleep that stands for the time a GPU job's host thread waits on its
kernels, so four ranks fit on a laptop and still feel CPU contention. A healthy job's noise
(``--noise``, :class:`~trainguard.demo.noise.Noise`) varies it per step and rank (a batch's
sequences vary in length, and its compute with them), pauses the whole job now and then, and can
slow one node in bursts; a straggler computes ``factor`` times as long.
Data comes through ``wrap_dataloader`` (``--data-seconds`` per batch) and the gradient sync
through a comm hook, so the faults of ``trainguard.demo.faults`` can slow or stop each of them
(through :class:`~trainguard.demo.sabotage.Sabotage`, the knobs they turn). Rank 0 appends one
JSON line per event to ``<checkpoint-dir>/events.jsonl`` (start, step, checkpoint, finish) for
the drill to read.
"""

from __future__ import annotations

import argparse
import datetime
import functools
import json
import os
import threading
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from opentelemetry.sdk.trace.export import ConsoleSpanExporter
from torch import nn
from torch.nn.parallel import DistributedDataParallel

import trainguard
from trainguard import contract
from trainguard.demo.config import compute_share
from trainguard.demo.faults import DEFAULT_PLAN, Fault, FaultLedger, parse_plan
from trainguard.demo.noise import Noise, NoiseError
from trainguard.demo.sabotage import Sabotage
from trainguard.instrumentation.directives import Directive

WIDTH = 256


class Work:
    """Compute that takes a given number of seconds: ``share`` of it real matmuls, the rest a
    sleep (a GPU job's host thread waiting on its kernels). The matmul count per second is
    measured once, by rank 0, and shared, so every rank does the same arithmetic for the same
    seconds: a rank whose matmuls run slower (a busy core) is slower, as it would be."""

    SIZE = 256

    def __init__(self, share: float, matmuls_per_second: float) -> None:
        self.share = share
        self.matmuls_per_second = matmuls_per_second
        self._a = torch.randn(self.SIZE, self.SIZE)
        self._b = torch.randn(self.SIZE, self.SIZE)

    @classmethod
    def measure(cls, seconds: float = 0.3) -> float:
        """Matmuls of ``SIZE`` x ``SIZE`` this process does per second."""
        a, b = torch.randn(cls.SIZE, cls.SIZE), torch.randn(cls.SIZE, cls.SIZE)
        count, started = 0, time.perf_counter()
        while (elapsed := time.perf_counter() - started) < seconds:
            a @ b
            count += 1
        return count / elapsed

    @classmethod
    def for_job(cls, share: float) -> Work:
        """Rank 0 measures, every rank gets its figure (a collective: call it on every rank)."""
        rate = torch.tensor([cls.measure() if share and dist.get_rank() == 0 else 0.0])
        dist.broadcast(rate, src=0)
        return cls(share, float(rate.item()))

    def __call__(self, seconds: float) -> None:
        real = seconds * self.share
        for _ in range(round(real * self.matmuls_per_second)):
            self._a @ self._b
        if seconds > real:
            time.sleep(seconds - real)


class DemoNet(nn.Module):
    """Four linear layers; ``forward`` also computes for ``sabotage.work_seconds`` times the
    step's ``noise_factor`` (set by the loop), and runs out of memory on batches above
    ``sabotage.oom_above``."""

    def __init__(self, sabotage: Sabotage, work: Work) -> None:
        super().__init__()
        self.layers = nn.Sequential(*[nn.Linear(WIDTH, WIDTH) for _ in range(4)])
        self.sabotage = sabotage
        self.work = work
        self.noise_factor = 1.0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        oom_above = self.sabotage.oom_above
        if oom_above is not None and x.shape[0] > oom_above:
            raise torch.OutOfMemoryError(
                f"CUDA out of memory. Tried to allocate {x.shape[0] * 64} MiB "
                "(injected by the demo's fault plan)"
            )
        seconds = self.sabotage.work_seconds * self.noise_factor * x.shape[0] / BATCH_SIZE
        if seconds:
            self.work(seconds)
        # Sequences of one batch: the layers see each sequence's mean (the arithmetic that
        # stands for a sequence's cost is the work above).
        out: torch.Tensor = self.layers(x.mean(dim=1))
        return out


BATCH_SIZE = 32
# A batch's sequences are this long at the mean; each batch's length varies with the noise
# model's batch size (padded per batch), and its compute with it.
SEQUENCE_LENGTH = 64


class Checkpoints:
    """Rank 0 writes ``latest.pt`` atomically; every rank resumes from it."""

    def __init__(self, folder: Path) -> None:
        self.path = folder / "latest.pt"

    def load(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> int:
        if not self.path.exists():
            return 0
        state = torch.load(self.path, weights_only=True)
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        return int(state["step"])

    def save(self, model: nn.Module, optimizer: torch.optim.Optimizer, step: int) -> None:
        tmp = self.path.with_suffix(".tmp")
        state = {"step": step, "model": model.state_dict(), "optimizer": optimizer.state_dict()}
        torch.save(state, tmp)
        tmp.replace(self.path)


class EventLog:
    def __init__(self, path: Path, enabled: bool) -> None:
        self.path = path
        self.enabled = enabled

    def write(self, event: str, **fields: Any) -> None:
        if self.enabled:
            with self.path.open("a") as out:
                out.write(json.dumps({"event": event, "t": time.time(), **fields}) + "\n")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="trainguard's fault-injecting demo trainer")
    parser.add_argument("--steps", type=int, default=300, help="train until this step")
    parser.add_argument("--checkpoint-dir", type=Path, required=True)
    parser.add_argument("--checkpoint-every", type=int, default=10)
    parser.add_argument("--step-seconds", type=float, default=0.1, help="compute per step")
    parser.add_argument(
        "--compute-share",
        type=compute_share,
        default=0.25,
        help="share of the compute that is real matmuls, the rest a sleep (0-1, default 0.25)",
    )
    parser.add_argument(
        "--noise",
        default="default",
        help='a healthy job\'s noise: "default", "none" or key=value overrides '
        '("sigma=0.05,neighbour_node=node-b"; trainguard.demo.noise.Noise)',
    )
    parser.add_argument("--seed", type=int, default=0, help="seeds the noise")
    parser.add_argument("--data-seconds", type=float, default=0.0, help="simulated data loading")
    parser.add_argument("--faults", default=DEFAULT_PLAN, help='fault plan ("" for none)')
    parser.add_argument("--spans-dir", type=Path, help="also write spans as JSON lines here")
    args = parser.parse_args(argv)
    try:
        args.noise = Noise.parse(args.noise, seed=args.seed)
    except NoiseError as error:
        parser.error(str(error))
    return args


def batch(noise: Noise, step: int, rank: int) -> torch.Tensor:
    """The batch of ``step`` on ``rank``: its sequences as long as the noise model's batch
    size says (what the hook reads a batch's work from, as from a real padded batch)."""
    generator = torch.Generator().manual_seed(step * 7919 + rank)
    length = max(1, round(SEQUENCE_LENGTH * noise.batch_size(step, rank)))
    return torch.randn(BATCH_SIZE, length, WIDTH, generator=generator)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    plan = parse_plan(args.faults)
    dist.init_process_group(
        "cuda:nccl,cpu:gloo" if torch.cuda.is_available() else "gloo",
        timeout=datetime.timedelta(minutes=5),
    )
    rank, world = dist.get_rank(), dist.get_world_size()
    node = os.environ.get("TRAINGUARD_NODE", "node-0")
    ledger = FaultLedger(args.checkpoint_dir)
    job_started = ledger.job_started_at()
    events = EventLog(args.checkpoint_dir / "events.jsonl", enabled=rank == 0)
    checkpoints = Checkpoints(args.checkpoint_dir)

    torch.manual_seed(0)
    restart = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    noise: Noise = args.noise
    sabotage = Sabotage(
        functools.partial(batch, noise), args.step_seconds, args.data_seconds, BATCH_SIZE
    )
    net = DemoNet(sabotage, Work.for_job(args.compute_share))
    model = DistributedDataParallel(net)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    step = checkpoints.load(model.module, optimizer)
    # The gradient sync goes through the fault plan's hook (DDP's allreduce until one fires).
    model.register_comm_hook(dist.group.WORLD, sabotage.comm_hook)

    checkpoint_requested = threading.Event()

    def on_directive(directive: Directive) -> None:
        if directive.kind is not contract.Action.CHECKPOINT_NOW:
            raise RuntimeError(f"the demo trainer does not do {directive.kind.value!r}")
        checkpoint_requested.set()

    logs = None
    log_dir = os.environ.get(contract.ENV_LOG_DIR)
    if log_dir:
        # ECS JSON lines (with the hook's events, trace ids) for Filebeat -> Elasticsearch, set
        # up before instrument() so its first event (this process's pid and rank: what
        # `trainguard diagnose` joins torchrun's failure lines with) is in the file.
        from trainguard.logs import configure_logging

        logs = configure_logging(
            service_name="trainguard-demo-trainer",
            job_id=contract.job_id_from_environment(os.environ) or None,
            rank=rank,
            node=node,
            file=Path(log_dir) / f"rank{rank}.ndjson",
        )
    span_exporter = None
    if args.spans_dir is not None:
        args.spans_dir.mkdir(parents=True, exist_ok=True)
        spans_file = (args.spans_dir / f"spans-rank{rank}-{os.getpid()}.jsonl").open("a")
        span_exporter = ConsoleSpanExporter(
            out=spans_file, formatter=lambda span: span.to_json(indent=None) + "\n"
        )
    handle = trainguard.instrument(
        model,
        optimizer,
        start_step=step,
        oom_recovery=True,
        span_exporter=span_exporter,
        on_directive=on_directive,
    )
    events.write("start", world=world, node=node, restart=restart, resumed_from=step)
    data = handle.wrap_dataloader(sabotage.batches(step, rank))
    while step < args.steps:
        elapsed = time.time() - job_started
        inject(plan, ledger, rank, node, elapsed, sabotage)
        # A whole-job pause (a collection, an evaluation) between steps, on every rank at once.
        pause = noise.pause_seconds(step)
        if pause:
            time.sleep(pause)
        net.noise_factor = noise.compute_factor(step, rank) * noise.neighbour_factor(node, elapsed)
        optimizer.zero_grad(set_to_none=True)
        if logs is not None:
            logs.set_step(step)
        handle.guarded_step(next(data), lambda micro: model(micro).square().mean())
        optimizer.step()
        sabotage.leak()
        step += 1
        events.write("step", step=step, world=world)
        if step % args.checkpoint_every == 0 or checkpoint_requested.is_set():
            checkpoint(checkpoints, model, optimizer, step, rank, handle)
            checkpoint_requested.clear()
            events.write("checkpoint", step=step)
            fire_at_checkpoint(plan, ledger, rank, node, elapsed, sabotage)
            # Every rank waits for the checkpoint to be written, as sharded checkpoints do.
            dist.barrier()
    if rank == 0:
        checkpoints.save(model.module, optimizer, step)
    events.write("finish", step=step, world=world)
    handle.uninstrument()
    if logs is not None:
        logs.close()
    dist.destroy_process_group()
    return 0


def checkpoint(
    checkpoints: Checkpoints,
    model: DistributedDataParallel,
    optimizer: torch.optim.Optimizer,
    step: int,
    rank: int,
    handle: trainguard.Instrumentation,
) -> None:
    if rank == 0:
        checkpoints.save(model.module, optimizer, step)
        handle.record_checkpoint(checkpoints.path)


def _due(fault: Fault, ledger: FaultLedger, rank: int, elapsed: float) -> bool:
    return fault.rank == rank and elapsed >= fault.at_seconds and ledger.fired(fault.kind) is None


def fire_at_checkpoint(
    plan: list[Fault], ledger: FaultLedger, rank: int, node: str, elapsed: float, knobs: Sabotage
) -> None:
    """Fire the faults due on this rank that wait for a checkpoint (a barrier hang)."""
    for fault in plan:
        if fault.kind.at_checkpoint and _due(fault, ledger, rank, elapsed):
            ledger.fire(fault, node)
            if fault.kind.fire is not None:
                fault.kind.fire(knobs)


def inject(
    plan: list[Fault],
    ledger: FaultLedger,
    rank: int,
    node: str,
    elapsed: float,
    knobs: Sabotage,
) -> None:
    """Fire the faults that are due on this rank; keep a slow rank slow while it lives."""
    for fault in plan:
        kind = fault.kind
        if kind.at_checkpoint:
            continue  # fires at the next checkpoint (fire_at_checkpoint)
        fired = ledger.fired(kind)
        if fired is None and _due(fault, ledger, rank, elapsed):
            fired = ledger.fire(fault, node)
            if kind.fire is not None:
                kind.fire(knobs)
        if fired is not None and kind.sustain is not None:
            # Slowdowns last as long as the rank runs on the node it fired on (until excluded).
            slow = fired.node == node and fired.rank == rank
            kind.sustain(knobs, fault.factor if slow else 1.0)


if __name__ == "__main__":
    raise SystemExit(main())
