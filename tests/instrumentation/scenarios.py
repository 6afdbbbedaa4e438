"""Training scenarios run on real gloo ranks by the instrumentation tests.

Compute is simulated with ``time.sleep`` inside ``forward`` where a test needs controlled
timing (a straggler, a hang): these machines have 2 cores shared by up to 4 ranks, so real
arithmetic would time the scheduler rather than the rank.
"""

from __future__ import annotations

import json
import logging
import statistics
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from prometheus_client import CollectorRegistry
from prometheus_client.openmetrics.exposition import generate_latest
from torch import nn
from torch.nn.parallel import DistributedDataParallel

import trainguard
from trainguard import contract
from trainguard.events import EVENTS_LOGGER

# Four 256x256 layers with a 0.25 MB bucket cap: several gradient buckets per step.
WIDTH = 256
BUCKET_CAP_MB = 0.25


class Net(nn.Module):
    def __init__(self, delay: float = 0.0, oom_above: int | None = None) -> None:
        super().__init__()
        self.layers = nn.Sequential(*[nn.Linear(WIDTH, WIDTH) for _ in range(4)])
        self.delay = delay  # seconds of simulated compute in forward
        self.oom_above = oom_above  # batch sizes above this "run out of memory"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.oom_above is not None and x.shape[0] > self.oom_above:
            raise torch.OutOfMemoryError(
                f"CUDA out of memory. Tried to allocate {x.shape[0]} MiB (simulated)"
            )
        if self.delay:
            time.sleep(self.delay)
        out: torch.Tensor = self.layers(x)
        return out


def make_ddp(seed: int = 0, **kwargs: Any) -> DistributedDataParallel:
    torch.manual_seed(seed)
    return DistributedDataParallel(Net(**kwargs), bucket_cap_mb=BUCKET_CAP_MB)


def batch(step: int, rank: int, size: int = 16, width: int = WIDTH) -> torch.Tensor:
    generator = torch.Generator().manual_seed(1000 * step + rank)
    return torch.randn(size, width, generator=generator)


def loss_of(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    out: torch.Tensor = model(x).square().mean()
    return out


def train(
    model: nn.Module, optimizer: torch.optim.Optimizer, steps: int, rank: int, first: int = 0
) -> None:
    for step in range(first, first + steps):
        optimizer.zero_grad()
        loss_of(model, batch(step, rank)).backward()
        optimizer.step()


def publish_last_timers(model: nn.Module, rank: int) -> None:
    """DDP publishes an iteration's reducer timers at the next forward: run one."""
    model(batch(0, rank)).sum()


def span_rows(exporter: InMemorySpanExporter) -> list[dict[str, Any]]:
    return rows_of(exporter.get_finished_spans())


def rows_of(spans: Sequence[ReadableSpan]) -> list[dict[str, Any]]:
    rows = []
    for span in spans:
        ctx = span.get_span_context()
        assert ctx is not None
        rows.append(
            {
                "name": span.name,
                "trace_id": f"{ctx.trace_id:032x}",
                "span_id": f"{ctx.span_id:016x}",
                "parent_id": f"{span.parent.span_id:016x}" if span.parent else None,
                "attributes": dict(span.attributes or {}),
                "status": span.status.status_code.name,
            }
        )
    return rows


def labels_of(handle: trainguard.Instrumentation) -> dict[str, str]:
    return handle.identity.labels()


def value(registry: CollectorRegistry, name: str, labels: dict[str, str]) -> float:
    return registry.get_sample_value(name, labels) or 0.0


class Traced(SimpleNamespace):
    """An instrumented DDP model with its optimizer, in-memory span exporter and registry."""

    model: DistributedDataParallel
    optimizer: torch.optim.SGD
    exporter: InMemorySpanExporter
    registry: CollectorRegistry
    handle: trainguard.Instrumentation


def traced_ddp(job_id: str, delay: float = 0.0, **options: Any) -> Traced:
    """DDP instrumented with spans kept in memory and metrics in a private registry."""
    model = make_ddp(delay=delay)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    exporter = InMemorySpanExporter()
    registry = CollectorRegistry()
    handle = trainguard.instrument(
        model,
        optimizer,
        job_id=job_id,
        registry=registry,
        span_exporter=exporter,
        metrics_port=-1,
        **options,
    )
    return Traced(
        model=model, optimizer=optimizer, exporter=exporter, registry=registry, handle=handle
    )


def spans_and_metrics(
    rank: int, world: int, out: Path, per_bucket: bool, steps: int
) -> dict[str, Any]:
    """Train with spans captured in memory; report spans, exposition and histogram counts."""
    traced = traced_ddp("job-spans", delay=0.02, per_bucket=per_bucket)
    model, optimizer, exporter = traced.model, traced.optimizer, traced.exporter
    registry, handle = traced.registry, traced.handle
    train(model, optimizer, steps, rank)
    publish_last_timers(model, rank)
    handle.force_flush_spans()
    buckets = len(model._get_ddp_logging_data()["rebuilt_bucket_sizes"].split(","))
    labels = labels_of(handle)
    result = {
        "buckets": buckets,
        "exposition": generate_latest(registry).decode(),
        "grad_sync_count": value(registry, "trainguard_grad_sync_duration_seconds_count", labels),
        "compute_count": value(registry, "trainguard_step_compute_duration_seconds_count", labels),
        "steps": value(registry, "trainguard_steps_total", labels),
    }
    handle.uninstrument()
    result["spans"] = span_rows(exporter)
    return result


def ddp_defaults_spans(rank: int, world: int, out: Path, steps: int) -> dict[str, Any]:
    """DDP at the hook's defaults, ``steps`` steps, then ``flush()`` alone: the spans exported
    by then, and after ``uninstrument()``."""
    traced = traced_ddp("job-flush")
    model, optimizer, exporter = traced.model, traced.optimizer, traced.exporter
    registry, handle = traced.registry, traced.handle
    train(model, optimizer, steps, rank)
    handle.force_flush_spans()
    at_flush = span_rows(exporter)
    labels = labels_of(handle)
    grad_sync_count = value(registry, "trainguard_grad_sync_duration_seconds_count", labels)
    handle.uninstrument()
    return {
        "at_flush": at_flush,
        "after_uninstrument": span_rows(exporter),
        "grad_sync_count": grad_sync_count,
    }


class JsonLinesSpanExporter(SpanExporter):
    """Appends each exported span's row to a file: what a process exported outlives it."""

    def __init__(self, path: Path) -> None:
        self._path = path

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        with self._path.open("a") as file:
            for row in rows_of(spans):
                file.write(json.dumps(row) + "\n")
        return SpanExportResult.SUCCESS


def exit_without_flush(rank: int, world: int, out: Path, steps: int) -> dict[str, Any]:
    """Train and return at once: no flush, no uninstrument (the process then exits)."""
    model = make_ddp()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    exporter = JsonLinesSpanExporter(out / f"spans-rank{rank}.jsonl")
    trainguard.instrument(
        model, optimizer, job_id="job-exit", span_exporter=exporter, metrics_port=-1
    )
    train(model, optimizer, steps, rank)
    return {}


def sampled_timers(rank: int, world: int, out: Path, steps: int, every: int) -> dict[str, Any]:
    """DDP timing every ``every``-th iteration: what the hook observes of it."""
    model = make_ddp(delay=0.002)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    registry = CollectorRegistry()
    handle = trainguard.instrument(
        model,
        optimizer,
        job_id="job-sampled",
        registry=registry,
        metrics_port=-1,
        runtime_stats_every=every,
    )
    train(model, optimizer, steps, rank)
    publish_last_timers(model, rank)
    handle.flush()
    data = model._get_ddp_logging_data()
    labels = labels_of(handle)
    result = {
        "bucket_bytes": sum(int(b) for b in data["rebuilt_bucket_sizes"].split(",")),
        "compute_count": value(registry, "trainguard_step_compute_duration_seconds_count", labels),
        "wait_count": value(registry, "trainguard_sync_wait_duration_seconds_count", labels),
        "grad_sync_count": value(registry, "trainguard_grad_sync_duration_seconds_count", labels),
        "grad_sync_bytes": value(registry, "trainguard_grad_sync_bytes_total", labels),
        "steps": value(registry, "trainguard_steps_total", labels),
        "timing_source": handle.timing_source.value,
    }
    handle.uninstrument()
    return result


STRAGGLER_SERIES = (
    "trainguard_step_duration_seconds_sum",
    "trainguard_step_duration_seconds_count",
    "trainguard_step_compute_duration_seconds_sum",
    "trainguard_step_compute_duration_seconds_count",
    "trainguard_sync_wait_duration_seconds_sum",
)


def step_totals(
    handle: trainguard.Instrumentation, registry: CollectorRegistry
) -> dict[str, float]:
    """The step, compute and sync-wait histograms' sums and counts, once every step is in."""
    handle.flush()
    labels = labels_of(handle)
    return {name: value(registry, name, labels) for name in STRAGGLER_SERIES}


# The straggler scenario's result: each rank's recent compute share as it ended (a level, not a
# difference of totals).
SHARE = "share"


def assert_slow_rank_singled_out(
    totals: list[dict[str, float]], slow: int, injected: float
) -> None:
    """What the straggler split guarantees, from every rank's :func:`step_totals` differences:
    equal step times; the slow rank's compute the highest, above every other rank's by at least
    half of ``injected`` (the extra seconds per step only it takes: not a ratio, since load on
    the machine adds time to every rank alike, shrinking ratios, but cannot remove that sleep);
    its peers waiting on it longer than it waits on them."""

    def mean(total: dict[str, float], name: str) -> float:
        return total[f"{name}_sum"] / total[f"{name}_count"]

    step_means = [mean(t, "trainguard_step_duration_seconds") for t in totals]
    compute_means = [mean(t, "trainguard_step_compute_duration_seconds") for t in totals]
    waits = [
        t["trainguard_sync_wait_duration_seconds_sum"] / t["trainguard_step_duration_seconds_count"]
        for t in totals
    ]
    median_step = statistics.median(step_means)
    for step_mean in step_means:
        assert abs(step_mean - median_step) / median_step < 0.05, step_means
    others = [value for rank, value in enumerate(compute_means) if rank != slow]
    assert compute_means[slow] == max(compute_means), compute_means
    assert compute_means[slow] >= max(others) + 0.5 * injected, (compute_means, injected)
    assert waits[slow] < min(w for rank, w in enumerate(waits) if rank != slow), waits
    # The hook's fast signal agrees: the slow rank spends the largest share of its step on its
    # own work (it waits least).
    shares = [total[SHARE] for total in totals]
    assert min(shares) > 0, shares
    assert shares[slow] > max(v for rank, v in enumerate(shares) if rank != slow), shares


def straggler(
    rank: int, world: int, out: Path, slow_rank: int, steps: int, guarded: bool = False
) -> dict[str, Any]:
    """Every rank "computes" 40 ms per forward; ``slow_rank`` 1.6x as long. ``guarded`` trains
    through ``guarded_step`` with OOM recovery (its agreement all-reduce waits on the slow
    rank between forward and backward, which must not count as the fast ranks' compute)."""
    base = 0.04
    model = make_ddp(delay=base * 1.6 if rank == slow_rank else base)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    registry = CollectorRegistry()
    handle = trainguard.instrument(
        model,
        optimizer,
        job_id="job-straggler",
        registry=registry,
        metrics_port=-1,
        oom_recovery=guarded,
        recent_compute_seconds=0.2,  # a few steps: no share before its window has filled
    )

    def run(count: int, first: int) -> None:
        if not guarded:
            train(model, optimizer, count, rank, first)
            return
        for step in range(first, first + count):
            optimizer.zero_grad()
            handle.guarded_step(batch(step, rank), lambda micro: loss_of(model, micro))
            optimizer.step()

    def totals() -> dict[str, float]:
        return step_totals(handle, registry)

    run(3, 0)  # warm-up: bucket rebuild, first-iteration costs
    before = totals()
    run(steps, 3)
    publish_last_timers(model, rank)
    after = totals()
    share = value(registry, contract.STEP_COMPUTE_SHARE.name, labels_of(handle))
    handle.uninstrument()
    return {**{name: after[name] - before[name] for name in after}, SHARE: share}


class _EventList(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.events: list[dict[str, Any]] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.events.append(
            {
                "message": record.getMessage(),
                "action": getattr(record, contract.FIELD_EVENT_ACTION, None),
                "details": getattr(record, contract.FIELD_DETAILS, None),
            }
        )


def hang(rank: int, world: int, out: Path, sleeper: int, sleep_s: float) -> dict[str, Any]:
    """``sleeper`` sleeps inside step 4's forward; the others wait in the gradient sync. What
    the span exporter held when the first stall span reached it is kept (``at_stall``)."""
    events = _EventList()
    logging.getLogger(EVENTS_LOGGER).addHandler(events)
    logging.getLogger(EVENTS_LOGGER).setLevel(logging.INFO)
    traced = traced_ddp(
        "job-hang",
        delay=0.01,
        dump_dir=out / "dumps",
        stall_floor_seconds=1.5,
        stall_factor=3.0,
        watchdog_interval_seconds=0.2,
    )
    model, optimizer, exporter = traced.model, traced.optimizer, traced.exporter
    registry, handle = traced.registry, traced.handle
    labels = labels_of(handle)
    ages: list[float] = []
    at_stall: list[dict[str, Any]] = []
    done = threading.Event()

    def watch() -> None:
        while not done.wait(0.1):
            ages.append(value(registry, "trainguard_collective_oldest_inflight_seconds", labels))
            if not at_stall:
                rows = span_rows(exporter)
                if any(row["name"] == contract.SPAN_STALL for row in rows):
                    at_stall.extend(rows)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    for step in range(8):
        optimizer.zero_grad()
        if step == 4 and rank == sleeper:
            time.sleep(sleep_s)
        loss_of(model, batch(step, rank)).backward()
        optimizer.step()
    done.set()
    watcher.join()
    stalls = value(registry, "trainguard_collective_stalls_total", labels)
    dumps = [str(p) for p in (handle.watchdog.dumps if handle.watchdog else [])]
    handle.uninstrument()
    return {
        "ages": ages,
        "stalls": stalls,
        "events": [e for e in events.events if e["action"] == "collective_stalled"],
        "dumps": dumps,
        "at_stall": at_stall,
        "spans": span_rows(exporter),
    }


def hang_between_steps(rank: int, world: int, out: Path, sleep_s: float) -> dict[str, Any]:
    """After step 3 every rank all-reduces a metric; rank 1 first sleeps ``sleep_s``."""
    import torch.distributed as dist

    events = _EventList()
    logging.getLogger(EVENTS_LOGGER).addHandler(events)
    logging.getLogger(EVENTS_LOGGER).setLevel(logging.INFO)
    model = make_ddp(delay=0.01)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    handle = trainguard.instrument(
        model,
        optimizer,
        job_id="job-between",
        registry=CollectorRegistry(),
        metrics_port=-1,
        dump_dir=out / "dumps",
        stall_floor_seconds=1.5,
        stall_factor=3.0,
        watchdog_interval_seconds=0.2,
    )
    for step in range(6):
        optimizer.zero_grad()
        loss = loss_of(model, batch(step, rank))
        loss.backward()
        optimizer.step()
        if step == 3:
            if rank == 1:
                time.sleep(sleep_s)
            dist.all_reduce(loss.detach().clone())  # outside any step
    handle.uninstrument()
    return {"events": [e for e in events.events if e["action"] == "collective_stalled"]}


class _LoggerWithoutTimers:
    """DDP's C++ logger, whose logging data has lost the timer keys."""

    def __init__(self, logger: Any) -> None:
        self._logger = logger

    def __getattr__(self, name: str) -> Any:
        return getattr(self._logger, name)

    def _get_ddp_logging_data(self) -> Any:
        return SimpleNamespace(ints_map={"iteration": 1}, strs_map={})


def reducer_timers_lost(rank: int, world: int, out: Path, steps: int) -> dict[str, Any]:
    """DDP whose logging data no longer has the keys trainguard reads (a future torch)."""
    model = make_ddp()
    model.logger = _LoggerWithoutTimers(model.logger)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    registry = CollectorRegistry()
    handle = trainguard.instrument(
        model, optimizer, job_id="job-lost", registry=registry, metrics_port=-1
    )
    for step in range(steps):
        optimizer.zero_grad()
        loss_of(model, batch(step, rank)).backward()
        optimizer.step()
    handle.flush()
    labels = labels_of(handle)
    result = {
        "compute_observed": value(
            registry, "trainguard_step_compute_duration_seconds_count", labels
        ),
        "errors": value(
            registry,
            "trainguard_instrumentation_errors_total",
            {**labels, "component": "reducer_stats"},
        ),
    }
    handle.uninstrument()
    return result


def without_launcher_env(rank: int, world: int, out: Path) -> dict[str, Any]:
    """No job id and no LOCAL_RANK in the environment: a job started without torchrun."""
    import os

    for name in ("LOCAL_RANK", contract.ENV_JOB_ID, "TORCHELASTIC_RUN_ID"):
        os.environ.pop(name, None)
    model = make_ddp()
    handle = trainguard.instrument(model, registry=CollectorRegistry(), metrics_port=-1)
    identity = handle.identity
    handle.uninstrument()
    return {"job_id": identity.job_id, "local_rank": identity.local_rank}


def composed_comm_hook(rank: int, world: int, out: Path, steps: int) -> dict[str, Any]:
    """Per-bucket mode around the user's fp16_compress_hook against DDP with that hook alone."""
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import fp16_compress_hook

    ours, theirs = make_ddp(), make_ddp()
    theirs.register_comm_hook(None, fp16_compress_hook)
    registry = CollectorRegistry()
    handle = trainguard.instrument(
        ours,
        job_id="job-fp16",
        registry=registry,
        metrics_port=-1,
        per_bucket=True,
        comm_hook=fp16_compress_hook,
    )
    for step in range(steps):
        for model in (ours, theirs):
            model.zero_grad()
            loss_of(model, batch(step, rank)).backward()
    handle.flush()
    same = all(
        torch.equal(a.grad, b.grad)  # type: ignore[arg-type]
        for a, b in zip(ours.parameters(), theirs.parameters(), strict=True)
    )
    timed = value(registry, "trainguard_grad_sync_duration_seconds_count", labels_of(handle))
    handle.uninstrument()
    already = make_ddp()
    already.register_comm_hook(None, fp16_compress_hook)
    try:
        trainguard.instrument(
            already, registry=CollectorRegistry(), metrics_port=-1, per_bucket=True
        )
        refused = ""
    except ValueError as error:
        refused = str(error)
    return {"same_gradients": same, "buckets_timed": timed, "refused": refused}


def oom_recovery(rank: int, world: int, out: Path, recovery: bool) -> dict[str, Any]:
    """Rank 0 cannot fit a 16-sample batch; compare gradients with an unsplit reference."""
    model = make_ddp(oom_above=8 if rank == 0 else None)
    model.broadcast_buffers = False
    reference = make_ddp()
    registry = CollectorRegistry()
    handle = trainguard.instrument(
        model,
        job_id="job-oom",
        registry=registry,
        metrics_port=-1,
        oom_recovery=recovery,
    )
    x = batch(0, rank)
    loss = handle.guarded_step(x, lambda micro: loss_of(model, micro))
    loss_of(reference, x).backward()
    labels = labels_of(handle)
    differences = [
        float((a.grad - b.grad).abs().max())  # type: ignore[operator]
        for a, b in zip(model.parameters(), reference.parameters(), strict=True)
    ]
    reference_loss = float(loss_of(reference, x).detach())
    result = {
        "max_grad_difference": max(differences),
        "loss": float(loss),
        "reference_loss": reference_loss,
        "oom_events": value(registry, "trainguard_oom_events_total", labels),
        "recoveries": value(registry, "trainguard_oom_recoveries_total", labels),
    }
    handle.uninstrument()
    return result


def uninstrument_roundtrip(rank: int, world: int, out: Path, per_bucket: bool) -> dict[str, Any]:
    """Instrument, train, uninstrument, train: parameters must equal plain DDP's."""
    plain = make_ddp()
    plain_opt = torch.optim.SGD(plain.parameters(), lr=0.05)
    model = make_ddp()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    handle = trainguard.instrument(
        model, optimizer, job_id="job-roundtrip", metrics_port=0, per_bucket=per_bucket
    )
    again = trainguard.instrument(model, optimizer, job_id="job-roundtrip", metrics_port=0)
    train(model, optimizer, 3, rank)
    handle.uninstrument()
    handle.uninstrument()
    train(model, optimizer, 3, rank, first=3)
    train(plain, plain_opt, 6, rank)
    threads = [t.name for t in threading.enumerate() if t.name.startswith("trainguard")]
    return {
        "same_handle": again is handle,
        "max_param_difference": max(
            float((a - b).abs().max())
            for a, b in zip(model.parameters(), plain.parameters(), strict=True)
        ),
        "forward_restored": "forward" not in model.__dict__,
        "step_restored": "step" not in optimizer.__dict__,
        "threads_left": threads,
        "reinstrument_steps": _reinstrument(model, optimizer, rank, per_bucket),
    }


def _reinstrument(
    model: DistributedDataParallel, optimizer: torch.optim.Optimizer, rank: int, per_bucket: bool
) -> float:
    registry = CollectorRegistry()
    handle = trainguard.instrument(
        model, optimizer, registry=registry, metrics_port=-1, per_bucket=per_bucket
    )
    train(model, optimizer, 2, rank)
    handle.flush()
    steps = value(registry, "trainguard_steps_total", labels_of(handle))
    handle.uninstrument()
    return steps


def flight_recorder_dump_names(out: Path) -> list[str]:
    return sorted(p.name for p in out.rglob(f"{contract.FLIGHT_RECORDER_DUMP_PREFIX}*"))
