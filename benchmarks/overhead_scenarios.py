"""What the overhead benchmark measures: the models (DDP and FSDP2, large and tiny), the hook's
variants on them (plain, default, per bucket, production, ...), and one training step.

Each replica is a model with its optimizer, built the same way for every variant, so that the
variants of one round differ only in what the hook attaches (:func:`attach`).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import fully_shard
from torch.nn.parallel import DistributedDataParallel

import trainguard
from benchmarks.harness.sinks import DiscardingExporter
from benchmarks.harness.threads import python_threads
from trainguard.instrumentation.timeline import INTERCEPTOR, Timeline, _signature

WIDTH = 2048


LAYERS = 6


BATCH = 32


TINY_WIDTH = 16


TINY_BATCH = 4


TINY_FSDP2_UNITS = 3


MODELS = ("ddp", "fsdp2")


VARIANTS: dict[str, tuple[str, ...]] = {
    "ddp": ("plain", "hook_floor", "default", "per_bucket", "all", "production"),
    "fsdp2": ("plain", "default", "per_bucket", "production"),
}


TINY_VARIANTS = ("plain", "default", "production")


# The FSDP2 training-thread measurement (one process, a fake process group, see the docstring):
# a second plain replica is the A/A self-check, whose figure should be about 0.
FAKE_VARIANTS = ("plain", "default", "production", "plain_aa")


UNINSTRUMENTED = frozenset({"plain", "hook_floor", "plain_aa"})


# -- replicas -------------------------------------------------------------------------------------
@dataclass
class Replica:
    model: nn.Module
    optimizer: torch.optim.Optimizer
    handle: Any = None
    threads: set[int] = field(default_factory=set)  # idents of the threads it started


@dataclass
class Setup:
    kind: str
    mesh: DeviceMesh | None
    otlp_endpoint: str
    tmp: Path


def build_model(setup: Setup, tiny: bool) -> nn.Module:
    torch.manual_seed(0)
    if setup.kind == "ddp":
        layers = (
            [nn.Linear(TINY_WIDTH, TINY_WIDTH)]
            if tiny
            else [nn.Linear(WIDTH, WIDTH) for _ in range(LAYERS)]
        )
        return DistributedDataParallel(nn.Sequential(*layers))
    width, count = (TINY_WIDTH, TINY_FSDP2_UNITS) if tiny else (WIDTH, LAYERS)
    model = nn.Sequential(*[nn.Linear(width, width) for _ in range(count)])
    for layer in model:
        fully_shard(layer, mesh=setup.mesh)
    fully_shard(model, mesh=setup.mesh)
    return model


def make_replica(setup: Setup, variant: str, tiny: bool) -> Replica:
    model = build_model(setup, tiny)
    replica = Replica(model, torch.optim.SGD(model.parameters(), lr=1e-4))
    attach(setup, replica, variant, tiny)
    return replica


def attach(setup: Setup, replica: Replica, variant: str, tiny: bool) -> None:
    """Make ``replica`` the variant: a comm hook, or ``trainguard.instrument`` (the handle and
    the threads it started go into the replica)."""
    model, optimizer = replica.model, replica.optimizer
    job = f"bench-{setup.kind}{'-tiny' if tiny else ''}-{variant}"
    before = python_threads()
    if variant == "hook_floor":
        assert isinstance(model, DistributedDataParallel)
        model.register_comm_hook(dist.group.WORLD, allreduce_hook)
    elif variant == "default":
        replica.handle = trainguard.instrument(model, optimizer, job_id=job, metrics_port=-1)
    elif variant == "per_bucket":
        replica.handle = trainguard.instrument(
            model, optimizer, job_id=job, metrics_port=-1, per_bucket=True
        )
    elif variant == "all":
        replica.handle = trainguard.instrument(
            model,
            optimizer,
            job_id=job,
            metrics_port=0,
            metrics_addr="127.0.0.1",
            per_bucket=True,
            span_exporter=DiscardingExporter(),
            dump_dir=setup.tmp / job,
        )
    elif variant == "production":
        replica.handle = trainguard.instrument(
            model,
            optimizer,
            job_id=job,
            metrics_port=0,
            metrics_addr="127.0.0.1",
            span_exporter=OTLPSpanExporter(endpoint=setup.otlp_endpoint),
            dump_dir=setup.tmp / job,
        )
    # What instrument started: worker, watchdog, span processor, /metrics server (not a
    # request thread of another replica's server that happened to be alive).
    replica.threads = {
        t.ident
        for t in threading.enumerate()
        if t.ident is not None and t.ident not in before and "process_request" not in t.name
    }


def step(model: nn.Module, optimizer: torch.optim.Optimizer, x: torch.Tensor) -> float:
    start = time.perf_counter()
    optimizer.zero_grad(set_to_none=True)
    model(x).square().mean().backward()
    optimizer.step()
    return time.perf_counter() - start


def enter_block(variant: str) -> None:
    """An uninstrumented variant runs with no timeline current (see the module docstring)."""
    if variant in UNINSTRUMENTED:
        INTERCEPTOR.current = None


def rotated(variants: Sequence[str], index: int) -> list[str]:
    shift = index % len(variants)
    return [*variants[shift:], *variants[:shift]]


def timing_sources(replicas: dict[str, Replica]) -> dict[str, str]:
    """Where each instrumented replica's compute time comes from by now (DDP's reducer timers,
    the collective timeline, or wall clock once the timers were given up on)."""
    return {
        variant: str(replica.handle.timing_source.value)
        for variant, replica in replicas.items()
        if replica.handle is not None
    }


def count_collectives(plain: Replica, instrumented: Any, x: torch.Tensor) -> int:
    """Collectives one plain step issues through the wrapped torch.distributed functions."""
    probe = Timeline(instrumented.errors)
    INTERCEPTOR.current = probe
    step(plain.model, plain.optimizer, x)
    INTERCEPTOR.current = None
    return len(probe.entries) + probe.overflow


def idle_wrapper_ns(calls: int = 200_000) -> float:
    """What a wrapped torch.distributed function costs with no timeline current, per call."""
    signature = _signature("all_reduce", "all_reduce", "tensor")
    assert signature is not None

    def original(*args: Any, **kwargs: Any) -> None:
        return None

    wrapped = INTERCEPTOR._wrapper("all_reduce", signature, original)
    saved, INTERCEPTOR.current = INTERCEPTOR.current, None
    tensor = torch.zeros(1)
    best = []
    try:
        for function in (original, wrapped):
            samples = []
            for _ in range(5):
                start = time.thread_time_ns()
                for _ in range(calls):
                    function(tensor, group=None)
                samples.append((time.thread_time_ns() - start) / calls)
            best.append(min(samples))
    finally:
        INTERCEPTOR.current = saved
    return best[1] - best[0]
