"""Sharded-training scenarios (FSDP2 ``fully_shard`` and FSDP1 ``FullyShardedDataParallel``)
run on real gloo ranks by ``test_sharded.py``.

As in :mod:`.scenarios`, compute is simulated with ``time.sleep`` (2 cores shared by up to 4
ranks). The model is a stack of :class:`Block` units, each one FSDP unit, under a root that has
parameters of its own (a head), so that the root is a unit too.
"""

from __future__ import annotations

import logging
import time
import traceback
from collections import Counter
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from prometheus_client import CollectorRegistry
from prometheus_client.openmetrics.exposition import generate_latest
from torch import nn

import trainguard
from tests.instrumentation import scenarios
from tests.instrumentation.scenarios import (
    _EventList,
    labels_of,
    loss_of,
    span_rows,
    step_totals,
    value,
)
from trainguard import contract
from trainguard.events import EVENTS_LOGGER
from trainguard.instrumentation import flight_recorder

FSDP2 = "fsdp2"
FSDP1 = "fsdp1"
WIDTH = 128
BLOCKS = 2
TP_GROUP = "tp"  # group_desc of the stand-in tensor-parallel group


def _out_of_memory(grad: torch.Tensor) -> None:
    raise torch.OutOfMemoryError("CUDA out of memory in backward (simulated)")


class Block(nn.Module):
    """One FSDP unit: a linear layer whose forward "computes" ``delay`` seconds and whose next
    backward can be made to sleep (``stall``) or to run out of memory (``fail_backward``)."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(WIDTH, WIDTH)
        self.delay = 0.0  # seconds of simulated compute per forward
        self.stall = 0.0  # seconds the next backward through this block sleeps
        self.fail_backward = False  # the next backward through this block runs out of memory

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.delay:
            time.sleep(self.delay)
        hidden: torch.Tensor = self.linear(x)
        if self.stall and hidden.requires_grad:
            seconds, self.stall = self.stall, 0.0
            # Runs in the backward, after FSDP gathered this unit's parameters and before its
            # post-backward reduce-scatters the gradients.
            hidden.register_hook(lambda grad: time.sleep(seconds))
        if self.fail_backward and hidden.requires_grad:
            self.fail_backward = False
            hidden.register_hook(_out_of_memory)
        return torch.relu(hidden)


class ShardedNet(nn.Module):
    def __init__(self, delay: float = 0.0, oom_above: int | None = None) -> None:
        super().__init__()
        blocks = [Block() for _ in range(BLOCKS)]
        for block in blocks:
            block.delay = delay / BLOCKS  # simulated compute, spread over the units
        self.blocks = nn.ModuleList(blocks)
        self.head = nn.Linear(WIDTH, WIDTH)  # the root unit's own parameters
        self.oom_above = oom_above  # batch sizes above this "run out of memory"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.oom_above is not None and x.shape[0] > self.oom_above:
            raise torch.OutOfMemoryError(
                f"CUDA out of memory. Tried to allocate {x.shape[0]} MiB (simulated)"
            )
        for block in self.blocks:
            x = block(x)
        out: torch.Tensor = self.head(x)
        return out


def build(
    parallelism: str, delay: float = 0.0, oom_above: int | None = None, seed: int = 0
) -> tuple[nn.Module, list[Block]]:
    """The sharded model (same initial weights for a seed) and its blocks, unwrapped (FSDP1's
    wrappers would take attribute writes meant for the block)."""
    torch.manual_seed(seed)
    net = ShardedNet(delay, oom_above)
    blocks = [block for block in net.blocks if isinstance(block, Block)]
    if parallelism == FSDP2:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        mesh = init_device_mesh("cpu", (dist.get_world_size(),))
        for block in blocks:
            fully_shard(block, mesh=mesh)
        fully_shard(net, mesh=mesh)
        return net, blocks
    assert parallelism == FSDP1, parallelism
    from torch.distributed.fsdp import FullyShardedDataParallel
    from torch.distributed.fsdp.wrap import ModuleWrapPolicy

    model = FullyShardedDataParallel(
        net, device_id=torch.device("cpu"), auto_wrap_policy=ModuleWrapPolicy({Block})
    )
    return model, blocks


def units_with_parameters(model: nn.Module) -> int:
    """FSDP units that own parameters (not counting those of the units nested in them)."""
    from torch.distributed.fsdp import FSDPModule, FullyShardedDataParallel

    units = [m for m in model.modules() if isinstance(m, FSDPModule | FullyShardedDataParallel)]
    count = 0
    for unit in units:
        nested = {
            id(p) for m in unit.modules() if m is not unit and m in units for p in m.parameters()
        }
        count += any(id(p) not in nested for p in unit.parameters())
    return count


def batch(step: int, rank: int) -> torch.Tensor:
    return scenarios.batch(step, rank, width=WIDTH)


def fr_collectives(group: str) -> Counter[str]:
    """The Flight Recorder's count of this rank's collectives on ``group``, by name (torch's
    own record, independent of trainguard's timeline)."""
    state = flight_recorder.read_state(only_active=False, include_collectives=True)
    return Counter(
        str(e["profiling_name"])
        for e in state.get("entries", [])
        if flight_recorder.group_label(e.get("process_group")) == group
    )


def rank_info(registry: CollectorRegistry) -> dict[str, str]:
    for family in registry.collect():
        for sample in family.samples:
            if sample.name == contract.RANK_INFO.name:
                return dict(sample.labels)
    return {}


def _histogram_counts(registry: CollectorRegistry, labels: dict[str, str]) -> dict[str, float]:
    return {
        name: value(registry, f"trainguard_{name}_count", labels)
        for name in (
            "step_duration_seconds",
            "step_compute_duration_seconds",
            "sync_wait_duration_seconds",
            "grad_sync_duration_seconds",
            "param_gather_duration_seconds",
        )
    }


def sharded_training(
    rank: int,
    world: int,
    out: Path,
    parallelism: str,
    forward_s: float,
    slowdown: float,
    slow_rank: int,
    warmup: int,
    steps: int,
    bucket_steps: int,
) -> dict[str, Any]:
    """One job, three instrumented phases (the first two on the same model).

    ``traced``: every rank "computes" ``forward_s`` per forward, ``slow_rank`` ``slowdown``
    times as long; each step also all-reduces its loss over a second process group (``tp``,
    standing in for tensor parallel); spans in memory; totals of the compute/wait split after
    ``warmup`` steps.
    ``bucketed``: instrumented again with ``per_bucket=True`` for ``bucket_steps`` steps, with
    the Flight Recorder's count of the all-gathers they issued. ``oom``: see
    :func:`oom_recovery`.
    """
    delay = forward_s * slowdown if rank == slow_rank else forward_s
    model, blocks = build(parallelism, delay=delay)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    tp = dist.new_group(list(range(world)), group_desc=TP_GROUP)
    job = f"job-{parallelism}"

    def train(count: int, first: int) -> None:
        for step in range(first, first + count):
            optimizer.zero_grad()
            loss = loss_of(model, batch(step, rank))
            loss.backward()
            dist.all_reduce(loss.detach().clone(), group=tp)
            optimizer.step()

    # -- traced -----------------------------------------------------------------------------
    exporter = InMemorySpanExporter()
    registry = CollectorRegistry()
    handle = trainguard.instrument(
        model,
        optimizer,
        job_id=job,
        registry=registry,
        span_exporter=exporter,
        metrics_port=-1,
        recent_compute_seconds=0.2,  # a few steps: no share before its window has filled
    )
    labels = labels_of(handle)

    def totals() -> dict[str, float]:
        return step_totals(handle, registry)

    train(warmup, 0)  # first-iteration costs (FSDP's lazy init)
    before = totals()
    train(steps, warmup)
    after = totals()
    handle.force_flush_spans()
    traced = {
        "parallelism": handle.parallelism.value,
        "timing_source": handle.timing_source.value,
        "rank_info": rank_info(registry),
        "straggler": {
            **{name: after[name] - before[name] for name in after},
            scenarios.SHARE: value(registry, contract.STEP_COMPUTE_SHARE.name, labels),
        },
        "counts": _histogram_counts(registry, labels),
        "grad_sync_bytes": value(registry, "trainguard_grad_sync_bytes_total", labels),
        "exposition": generate_latest(registry).decode(),
        "units": units_with_parameters(model),
    }
    handle.uninstrument()
    traced["spans"] = span_rows(exporter)

    # -- bucketed ---------------------------------------------------------------------------
    for block in blocks:
        block.delay = 0.0
    exporter = InMemorySpanExporter()
    registry = CollectorRegistry()
    handle = trainguard.instrument(
        model,
        optimizer,
        job_id=job,
        registry=registry,
        span_exporter=exporter,
        metrics_port=-1,
        per_bucket=True,
    )
    first = warmup + steps
    handle.set_step(first)
    gathers_before = fr_collectives("default_pg")
    train(bucket_steps, first)
    gathers = fr_collectives("default_pg") - gathers_before
    handle.force_flush_spans()
    labels = labels_of(handle)
    bucketed = {
        "counts": _histogram_counts(registry, labels),
        "fr_all_gathers": sum(n for name, n in gathers.items() if "all_gather" in name),
        "first_step": first,
    }
    handle.uninstrument()
    bucketed["spans"] = span_rows(exporter)

    # -- oom ----------------------------------------------------------------------------------
    try:
        oom: dict[str, Any] = oom_recovery(rank, parallelism)
    except Exception:  # reported by the OOM test, not by every test of this run
        oom = {"error": traceback.format_exc()}
    return {"traced": traced, "bucketed": bucketed, "oom": oom}


def oom_recovery(rank: int, parallelism: str) -> dict[str, Any]:
    """No rank fits a 16-sample batch (a symmetric OOM at the top of the root's forward):
    ``guarded_step`` splits it; compare gradients and loss with an unsplit reference. Then a
    step in those micro-batches, and one whose first micro-batch runs out of memory in its
    backward, after some units' gradients were accumulated unsynchronised (split again).

    Symmetric on purpose: with FSDP, a rank that runs out of memory alone inside a forward that
    gathers parameters leaves its peers in an all-gather it never joins (a documented limit)."""
    model, blocks = build(parallelism, oom_above=8)
    reference, _ = build(parallelism)
    registry = CollectorRegistry()
    handle = trainguard.instrument(
        model, job_id="job-oom", registry=registry, metrics_port=-1, oom_recovery=True
    )
    labels = labels_of(handle)

    def local(grad: torch.Tensor | None) -> torch.Tensor:
        assert grad is not None
        # FSDP2's gradients are DTensors sharded alike in both models: compare the shards.
        shard: torch.Tensor = grad.to_local() if hasattr(grad, "to_local") else grad
        return shard

    def step(number: int) -> dict[str, float]:
        for m in (model, reference):
            m.zero_grad(set_to_none=True)
        x = batch(number, rank)
        loss = handle.guarded_step(x, lambda micro: loss_of(model, micro))
        reference_loss = loss_of(reference, x)
        reference_loss.backward()
        return {
            "max_grad_difference": max(
                float((local(a.grad) - local(b.grad)).abs().max())
                for a, b in zip(model.parameters(), reference.parameters(), strict=True)
            ),
            "loss": float(loss),
            "reference_loss": float(reference_loss.detach()),
            "micro_batches": handle.micro_batches,
            "oom_events": value(registry, "trainguard_oom_events_total", labels),
            "recoveries": value(registry, "trainguard_oom_recoveries_total", labels),
        }

    steps = {"forward_oom": step(0), "split": step(1)}
    blocks[0].fail_backward = True  # the first block's backward runs last
    steps["backward_oom"] = step(2)
    handle.uninstrument()
    return steps


def reduce_scatter_hang(
    rank: int, world: int, out: Path, parallelism: str, sleeper: int, sleep_s: float
) -> dict[str, Any]:
    """``sleeper`` sleeps inside the backward of step 3, in the last block: after the unit's
    parameters were gathered, before its gradients are reduce-scattered. The others wait in
    that reduce-scatter."""
    events = _EventList()
    logging.getLogger(EVENTS_LOGGER).addHandler(events)
    logging.getLogger(EVENTS_LOGGER).setLevel(logging.INFO)
    model, blocks = build(parallelism, delay=0.01)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)

    def step(number: int) -> None:
        optimizer.zero_grad()
        loss_of(model, batch(number, rank)).backward()
        optimizer.step()

    step(0)  # lazy init before instrumenting: the stall threshold follows steady steps
    registry = CollectorRegistry()
    handle = trainguard.instrument(
        model,
        optimizer,
        job_id=f"job-hang-{parallelism}",
        registry=registry,
        metrics_port=-1,
        dump_dir=out / "dumps",
        stall_floor_seconds=1.0,
        stall_factor=3.0,
        watchdog_interval_seconds=0.2,
    )
    for number in range(1, 6):
        if number == 3 and rank == sleeper:
            blocks[-1].stall = sleep_s
        step(number)
    stalls = value(registry, "trainguard_collective_stalls_total", labels_of(handle))
    dumps = [str(p) for p in (handle.watchdog.dumps if handle.watchdog else [])]
    handle.uninstrument()
    return {
        "stalls": stalls,
        "events": [e for e in events.events if e["action"] == "collective_stalled"],
        "dumps": dumps,
    }
