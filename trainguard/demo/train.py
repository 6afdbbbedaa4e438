"""The demo trainer: a small DDP job, instrumented by trainguard, that injects faults on cue.

Run it under torchrun (``trainguard demo`` / ``make demo`` do, as two elastic nodes):

    torchrun --nproc-per-node 2 -m trainguard.demo.train --steps 300 --checkpoint-dir ckpt \\
        --faults "straggler:rank=2,at=20s,factor=1.5;hang:rank=1,at=60s;oom:rank=0,at=90s"

It is also the integration example: ``trainguard.instrument`` on the DDP model, checkpoints
every N steps and on the remediation service's ``checkpoint_now``, resumes from the last one
on restart (torchrun elastic restarts the worker group after a node is excluded or the job is
restarted), and ``guarded_step`` so an out-of-memory step is retried in micro-batches.

Compute is simulated with a sleep in ``forward`` (``--step-seconds``, varied by ``--jitter``
per step and rank) so four ranks fit on a laptop; a straggler sleeps ``factor`` times as long.
Data comes through ``wrap_dataloader`` (``--data-seconds`` per batch) and the gradient sync
through a comm hook, so the faults of :class:`~trainguard.demo.faults.FaultKind` can slow or
stop each of them. Rank 0 appends one JSON line per event to ``<checkpoint-dir>/events.jsonl``
(start, step, checkpoint, finish) for the drill to read.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import random
import signal
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
from trainguard.demo.faults import DEFAULT_PLAN, Fault, FaultKind, FaultLedger, parse_plan
from trainguard.demo.sabotage import Sabotage
from trainguard.instrumentation.directives import Directive

WIDTH = 256
HANG_SECONDS = 900.0  # "forever": the job is restarted long before


class DemoNet(nn.Module):
    """Four linear layers; ``forward`` also "computes" for ``work_seconds``."""

    def __init__(self, jitter: float = 0.0, seed: int = 0) -> None:
        super().__init__()
        self.layers = nn.Sequential(*[nn.Linear(WIDTH, WIDTH) for _ in range(4)])
        self.work_seconds = 0.0
        self.oom_above: int | None = None  # batch sizes above this "run out of memory"
        self.jitter = jitter
        self._random = random.Random(seed)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.oom_above is not None and x.shape[0] > self.oom_above:
            raise torch.OutOfMemoryError(
                f"CUDA out of memory. Tried to allocate {x.shape[0] * 64} MiB "
                "(injected by the demo's fault plan)"
            )
        if self.work_seconds:
            noise = self._random.uniform(1 - self.jitter, 1 + self.jitter) if self.jitter else 1
            time.sleep(self.work_seconds * noise * x.shape[0] / BATCH_SIZE)
        out: torch.Tensor = self.layers(x)
        return out


BATCH_SIZE = 32


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
    parser.add_argument("--step-seconds", type=float, default=0.1, help="simulated compute")
    parser.add_argument(
        "--jitter", type=float, default=0.0, help="compute varies by +- this share per step"
    )
    parser.add_argument("--seed", type=int, default=0, help="seeds the jitter")
    parser.add_argument("--data-seconds", type=float, default=0.0, help="simulated data loading")
    parser.add_argument("--faults", default=DEFAULT_PLAN, help='fault plan ("" for none)')
    parser.add_argument("--spans-dir", type=Path, help="also write spans as JSON lines here")
    return parser.parse_args(argv)


def batch(step: int, rank: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(step * 7919 + rank)
    return torch.randn(BATCH_SIZE, WIDTH, generator=generator)


# How much each step's memory grows on a rank whose memory creeps (about 40 MB/s at the
# demo's ten steps a second).
LEAK_BYTES_PER_STEP = 4 << 20


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
    net = DemoNet(jitter=args.jitter, seed=args.seed * 1_000_003 + rank * 1009 + restart)
    net.work_seconds = args.step_seconds
    model = DistributedDataParallel(net)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    step = checkpoints.load(model.module, optimizer)
    sabotage = Sabotage(batch, data_seconds=args.data_seconds)
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
        inject(plan, ledger, rank, node, elapsed, net, args, sabotage)
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
            if stops_at_barrier(plan, ledger, rank, node, elapsed):
                time.sleep(HANG_SECONDS)
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


def stops_at_barrier(
    plan: list[Fault], ledger: FaultLedger, rank: int, node: str, elapsed: float
) -> bool:
    """Whether a barrier hang is due on this rank now (it fires here, at a checkpoint)."""
    for fault in plan:
        due = elapsed >= fault.at_seconds and ledger.fired(fault.kind) is None
        if fault.kind is FaultKind.BARRIER_HANG and fault.rank == rank and due:
            ledger.fire(fault, node)
            return True
    return False


def inject(
    plan: list[Fault],
    ledger: FaultLedger,
    rank: int,
    node: str,
    elapsed: float,
    net: DemoNet,
    args: argparse.Namespace,
    sabotage: Sabotage,
) -> None:
    """Fire the faults that are due on this rank; keep a slow rank slow while it lives."""
    base = args.step_seconds
    for fault in plan:
        if fault.kind is FaultKind.BARRIER_HANG:
            continue  # fires at the next checkpoint (stops_at_barrier)
        fired = ledger.fired(fault.kind)
        if fired is None and elapsed >= fault.at_seconds and rank == fault.rank:
            fired = ledger.fire(fault, node)
            if fault.kind in (FaultKind.HANG, FaultKind.DATA_STALL):
                # This rank stops joining collectives (in its data loader, for a data stall):
                # its peers wait in the gradient sync.
                time.sleep(HANG_SECONDS)
            if fault.kind is FaultKind.OOM:
                # From now on a whole batch no longer fits on this rank.
                net.oom_above = BATCH_SIZE // 2
            if fault.kind is FaultKind.KILL:
                os.kill(os.getpid(), signal.SIGKILL)
            if fault.kind is FaultKind.PG_ERROR:
                sabotage.comm_error = True
            if fault.kind is FaultKind.MEMORY_CREEP:
                # The process that fired it leaks; a restarted one starts clean.
                sabotage.leak_bytes_per_step = LEAK_BYTES_PER_STEP
        if fired is None:
            continue
        # Slowdowns last as long as the rank runs on the node it fired on (until excluded).
        slow = fired.node == node and fired.rank == rank
        extra = (fault.factor - 1.0) * base if slow else 0.0
        if fault.kind is FaultKind.STRAGGLER:
            net.work_seconds = base * (fault.factor if slow else 1.0)
        if fault.kind is FaultKind.DATA_SLOW:
            sabotage.data_seconds = args.data_seconds + extra
        if fault.kind is FaultKind.COMM_SLOW:
            sabotage.comm_delay_seconds = extra


if __name__ == "__main__":
    raise SystemExit(main())
