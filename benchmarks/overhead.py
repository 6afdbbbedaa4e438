"""What trainguard's hook costs a training step, measured against plain DDP in one run.

Two gloo ranks on the CPU (this machine has 2 cores), DDP's default 25 MB buckets, a model of
six 2048x2048 layers (about 100 MB of gradients: five buckets) and a step of a few hundred ms.
Every variant is its own DDP replica in the same process group, and the variants run
interleaved in blocks, round after round, so drift in the machine's load hits them all alike:

- plain: DDP as it comes;
- hook_floor: DDP with torch's own ``allreduce_hook`` (what any Python comm hook pays);
- default: ``trainguard.instrument`` with its defaults (reducer timers, no comm hook);
- per_bucket: ``per_bucket=True`` (a comm hook timing every bucket, span per bucket);
- all: per-bucket, spans exported, /metrics served, watchdog on.

Each variant's figure for a round is the median of its block; its ratio for the round is that
over plain's in the same round, and the reported ratio is the median over rounds (the spread
across rounds is printed too: on a shared 2-core machine it is wider than the targets).
The CPU time of the whole rank process per step (every thread: training, gloo, our worker)
is printed beside it: steadier than wall time here, and what the hook really adds.
The added microseconds on the training thread are measured separately, on a tiny model where
the hook's own work is not lost in the noise of a 300 ms step. The last line is
``overhead_ratio=<default/plain> bucket_mode_ratio=<per_bucket/plain>
hook_floor_ratio=<allreduce_hook/plain>``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
from torch.multiprocessing.spawn import start_processes
from torch.nn.parallel import DistributedDataParallel

import trainguard

WIDTH = 2048
LAYERS = 6
BATCH = 32
VARIANTS = ("plain", "hook_floor", "default", "per_bucket", "all")


class DiscardingExporter(SpanExporter):
    """Receives every span (so they are built and batched) and keeps none."""

    def __init__(self) -> None:
        self.spans = 0

    def export(self, spans: Sequence[Any]) -> SpanExportResult:
        self.spans += len(spans)
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        return None


def make_replica(variant: str) -> tuple[nn.Module, torch.optim.Optimizer, Any]:
    torch.manual_seed(0)
    model = DistributedDataParallel(
        nn.Sequential(*[nn.Linear(WIDTH, WIDTH) for _ in range(LAYERS)])
    )
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-4)
    handle = None
    if variant == "hook_floor":
        model.register_comm_hook(dist.group.WORLD, allreduce_hook)
    elif variant == "default":
        handle = trainguard.instrument(model, optimizer, job_id="bench", metrics_port=-1)
    elif variant == "per_bucket":
        handle = trainguard.instrument(
            model, optimizer, job_id="bench-b", metrics_port=-1, per_bucket=True
        )
    elif variant == "all":
        handle = trainguard.instrument(
            model,
            optimizer,
            job_id="bench-all",
            metrics_port=0,
            metrics_addr="127.0.0.1",
            per_bucket=True,
            span_exporter=DiscardingExporter(),
            dump_dir=Path(tempfile.mkdtemp()),
        )
    return model, optimizer, handle


def step(model: nn.Module, optimizer: torch.optim.Optimizer, x: torch.Tensor) -> float:
    start = time.perf_counter()
    optimizer.zero_grad(set_to_none=True)
    model(x).square().mean().backward()
    optimizer.step()
    return time.perf_counter() - start


def block(
    model: nn.Module, optimizer: torch.optim.Optimizer, x: torch.Tensor, steps: int
) -> tuple[list[float], float]:
    """Wall time of each step, and the process's CPU time (every thread) per step."""
    cpu = time.process_time()
    walls = [step(model, optimizer, x) for _ in range(steps)]
    return walls, (time.process_time() - cpu) / steps


def rank_main(rank: int, world: int, port: int, rounds: int, steps: int, out: str) -> None:
    os.environ.update({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "RANK": str(rank)})
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    replicas = {variant: make_replica(variant) for variant in VARIANTS}
    x = torch.randn(BATCH, WIDTH, generator=torch.Generator().manual_seed(rank))
    times: dict[str, list[list[float]]] = {variant: [] for variant in VARIANTS}
    cpu: dict[str, list[float]] = {variant: [] for variant in VARIANTS}
    for variant in VARIANTS:  # warm-up: bucket rebuild, allocator, first-iteration costs
        model, optimizer, _ = replicas[variant]
        for _ in range(2):
            step(model, optimizer, x)
    for round_index in range(rounds):
        # Rotate the order every round; both ranks use the same order.
        order = VARIANTS[round_index % len(VARIANTS) :] + VARIANTS[: round_index % len(VARIANTS)]
        for variant in order:
            model, optimizer, _ = replicas[variant]
            walls, cpu_per_step = block(model, optimizer, x, steps)
            times[variant].append(walls)
            cpu[variant].append(cpu_per_step)
        if rank == 0:
            print(f"round {round_index + 1}/{rounds} done", file=sys.stderr, flush=True)
    plain_model = replicas["plain"][0]
    assert isinstance(plain_model, DistributedDataParallel)
    sizes = plain_model._get_ddp_logging_data()["rebuilt_bucket_sizes"]
    buckets = len(str(sizes).split(","))
    for _, _, handle in replicas.values():
        if handle is not None:
            handle.uninstrument()
    if rank == 0:
        Path(out).write_text(json.dumps({"times": times, "cpu": cpu, "buckets": buckets}))
    dist.destroy_process_group()


def training_thread_cost(iterations: int) -> float:
    """Added µs per step of the hook's training-thread work, on a model too small to hide it.

    Counted in the training thread's own CPU time, so the worker thread's processing (which
    in real training overlaps the GIL-free C++ of forward and backward) is not charged here.
    """
    model = nn.Linear(4, 4)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.0)
    x = torch.zeros(1, 4)

    def loop() -> float:
        start = time.thread_time_ns()
        for _ in range(iterations):
            model(x)
            optimizer.step()
        return (time.thread_time_ns() - start) / iterations / 1000

    samples_plain, samples_hooked = [], []
    for _ in range(5):
        samples_plain.append(loop())
        handle = trainguard.instrument(model, optimizer, job_id="micro", metrics_port=-1)
        samples_hooked.append(loop())
        handle.uninstrument()
    return statistics.median(samples_hooked) - statistics.median(samples_plain)


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=16, help="interleaved rounds")
    parser.add_argument("--steps", type=int, default=4, help="steps per variant per round")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        out = str(Path(tmp) / "times.json")
        entry: Callable[..., None] = rank_main
        start_processes(
            entry,
            args=(2, free_port(), args.rounds, args.steps, out),
            nprocs=2,
            join=True,
            start_method="spawn",
        )
        result = json.loads(Path(out).read_text())
    times: dict[str, list[list[float]]] = result["times"]
    block_medians = {v: [statistics.median(block) for block in times[v]] for v in VARIANTS}
    ratios = {
        v: [b / p for b, p in zip(block_medians[v], block_medians["plain"], strict=True)]
        for v in VARIANTS
    }
    ratio = {v: statistics.median(r) for v, r in ratios.items()}
    medians = {v: statistics.median(s for block in times[v] for s in block) for v in VARIANTS}
    cpu = {v: statistics.median(result["cpu"][v]) for v in VARIANTS}
    print(f"model: {LAYERS}x Linear({WIDTH},{WIDTH}), batch {BATCH}, {result['buckets']} buckets")
    print(f"{args.rounds} rounds x {args.steps} steps per variant, interleaved")
    for variant in VARIANTS:
        quartiles = statistics.quantiles(ratios[variant], n=4) if args.rounds > 1 else [0, 0, 0]
        print(
            f"{variant:>10}: median step {medians[variant] * 1e3:8.2f} ms   "
            f"ratio {ratio[variant]:.4f} (rounds' quartiles {quartiles[0]:.3f}..{quartiles[2]:.3f})"
            f"   CPU/step {cpu[variant] * 1e3:7.1f} ms (ratio {cpu[variant] / cpu['plain']:.4f})"
        )
    per_step_us = training_thread_cost(20000)
    per_bucket_us = (
        (ratio["per_bucket"] - ratio["hook_floor"]) * medians["plain"] * 1e6 / result["buckets"]
    )
    print(f"training-thread work added per step: {per_step_us:.2f} us (measured on a tiny model)")
    print(f"per-bucket mode over the hook floor: {per_bucket_us:.1f} us per bucket (from medians)")
    print(
        f"overhead_ratio={ratio['default']:.4f} "
        f"bucket_mode_ratio={ratio['per_bucket']:.4f} "
        f"hook_floor_ratio={ratio['hook_floor']:.4f}"
    )


if __name__ == "__main__":
    main()
