"""The hook in one process: plain modules, the /metrics endpoint, faults inside the hook,
the OOM guard and the watchdog's decisions."""

from __future__ import annotations

import json
import logging
import socket
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import torch
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from prometheus_client import CollectorRegistry
from torch import nn

import trainguard
from tests.ports import free_port
from trainguard import contract
from trainguard.events import EVENTS_LOGGER
from trainguard.instrumentation import tracing
from trainguard.instrumentation.config import Identity, job_id_from_rank0
from trainguard.instrumentation.errors import ErrorBudget
from trainguard.instrumentation.memory import MemorySample, MemorySampler
from trainguard.instrumentation.metrics import RankMetrics
from trainguard.instrumentation.watchdog import CollectiveWatchdog, StepClock
from trainguard.logs import configure_logging


class Tiny(nn.Module):
    def __init__(self, oom_above: int | None = None) -> None:
        super().__init__()
        self.linear = nn.Linear(8, 1)
        self.oom_above = oom_above

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.oom_above is not None and x.shape[0] > self.oom_above:
            raise torch.OutOfMemoryError("CUDA out of memory (simulated)")
        out: torch.Tensor = self.linear(x)
        return out


def run_steps(model: nn.Module, optimizer: torch.optim.Optimizer, steps: int) -> None:
    for step in range(steps):
        optimizer.zero_grad()
        model(torch.full((4, 8), float(step))).mean().backward()
        optimizer.step()


def sample(registry: CollectorRegistry, name: str, **extra: str) -> float:
    labels = {"job_id": "job-1", "rank": "0", "local_rank": "0", "node": "node-a", **extra}
    return registry.get_sample_value(name, labels) or 0.0


def instrument(
    model: nn.Module, optimizer: Any = None, **settings: Any
) -> trainguard.Instrumentation:
    settings.setdefault("metrics_port", -1)
    return trainguard.instrument(model, optimizer, job_id="job-1", node="node-a", **settings)


def test_plain_module_steps_phases_and_compute(tmp_path: Path) -> None:
    model = Tiny()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    handle = instrument(model, optimizer, registry=(registry := CollectorRegistry()))
    run_steps(model, optimizer, 6)
    handle.flush()
    assert sample(registry, "trainguard_steps_total") == 6
    for phase in contract.Phase:
        count = sample(registry, "trainguard_step_phase_duration_seconds_count", phase=phase.value)
        assert count == 6, phase
    assert sample(registry, "trainguard_step_compute_duration_seconds_count") == 6
    # One process waits on no peer: no share of local work to compare, the gauge stays 0.
    assert sample(registry, contract.STEP_COMPUTE_SHARE.name) == 0
    assert sample(registry, "trainguard_last_step_timestamp_seconds") == pytest.approx(
        time.time(), abs=60
    )
    assert sample(registry, "trainguard_memory_allocated_bytes") > 0
    assert sample(registry, "trainguard_memory_capacity_bytes") > 0
    with torch.no_grad():
        model(torch.zeros(2, 8))  # evaluation forwards are not steps
    handle.flush()
    assert sample(registry, "trainguard_steps_total") == 6
    handle.uninstrument()


def test_flush_returns_with_the_memory_of_its_steps_sampled(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The worker samples memory after the steps of a wake: flush waits for that too (it once
    # returned between the two, and the gauges read 0 on a loaded machine).
    real = MemorySampler.sample

    def slow(self: MemorySampler) -> MemorySample:
        time.sleep(0.3)
        return real(self)

    monkeypatch.setattr(MemorySampler, "sample", slow)
    model = Tiny()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    handle = instrument(model, optimizer, registry=(registry := CollectorRegistry()))
    run_steps(model, optimizer, 2)
    assert handle.flush()
    assert sample(registry, "trainguard_steps_total") == 2
    assert sample(registry, "trainguard_memory_allocated_bytes") > 0
    handle.uninstrument()


def test_steps_end_at_the_next_forward_without_an_optimizer() -> None:
    model = Tiny()
    handle = instrument(model, registry=(registry := CollectorRegistry()))
    for _ in range(4):
        model(torch.ones(2, 8)).sum().backward()
    handle.flush()
    assert sample(registry, "trainguard_steps_total") == 3
    handle.uninstrument()


def test_metrics_are_served_with_exemplars_and_announced_by_file_sd(tmp_path: Path) -> None:
    model = Tiny()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    handle = instrument(
        model, optimizer, metrics_port=0, metrics_addr="127.0.0.1", file_sd_dir=tmp_path
    )
    run_steps(model, optimizer, 3)
    handle.flush()
    request = urllib.request.Request(
        f"http://127.0.0.1:{handle.metrics_port}/metrics",
        headers={"Accept": "application/openmetrics-text; version=1.0.0"},
    )
    with urllib.request.urlopen(request, timeout=5) as response:
        body = response.read().decode()
    series = 'trainguard_steps_total{job_id="job-1",local_rank="0",node="node-a",rank="0"}'
    assert f"{series} 3.0" in body
    assert f'# {{trace_id="{handle.trace_id(2)}"}}' in body
    sd_file = tmp_path / "job-1-rank0.json"
    assert f"127.0.0.1:{handle.metrics_port}" in sd_file.read_text()
    handle.uninstrument()
    assert not sd_file.exists(), "the target disappears with the rank"


def test_a_taken_port_moves_the_rank_to_the_next_one() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        model = Tiny()
        handle = instrument(model, metrics_port=port, metrics_addr="127.0.0.1")
        assert handle.metrics_port not in (None, port)
        handle.uninstrument()


def test_a_metrics_server_that_cannot_start_is_counted_and_training_goes_on(
    tmp_path: Path,
) -> None:
    model = Tiny()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("")
    handle = instrument(
        model,
        optimizer,
        registry=(registry := CollectorRegistry()),
        metrics_port=free_port(),
        metrics_addr="203.0.113.1",  # TEST-NET address not on this host: bind fails
        file_sd_dir=blocker,
    )
    run_steps(model, optimizer, 3)
    handle.flush()
    assert handle.metrics_port is None
    errors = "trainguard_instrumentation_errors_total"
    assert sample(registry, errors, component="metrics_server") == 1
    assert sample(registry, "trainguard_steps_total") == 3
    handle.uninstrument()


def test_a_file_sd_dir_that_cannot_be_written_is_counted(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    model = Tiny()
    handle = instrument(
        model,
        registry=(registry := CollectorRegistry()),
        metrics_port=0,
        metrics_addr="127.0.0.1",
        file_sd_dir=blocker / "sd",
    )
    assert handle.metrics_port is not None
    assert sample(registry, "trainguard_instrumentation_errors_total", component="file_sd") == 1
    handle.uninstrument()


def test_an_unreachable_otlp_endpoint_costs_a_counter(caplog: pytest.LogCaptureFixture) -> None:
    exporter = OTLPSpanExporter(endpoint=f"http://127.0.0.1:{free_port()}/v1/traces", timeout=1)
    model = Tiny()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    handle = instrument(
        model, optimizer, registry=(registry := CollectorRegistry()), span_exporter=exporter
    )
    started = time.monotonic()
    run_steps(model, optimizer, 5)
    training_seconds = time.monotonic() - started
    handle.force_flush_spans()
    assert sample(registry, "trainguard_spans_dropped_total") >= 5
    assert sample(registry, "trainguard_steps_total") == 5
    assert training_seconds < 5, "export happens off the training thread"
    handle.uninstrument()


class ExplodingExporter(SpanExporter):
    def export(self, spans: Any) -> SpanExportResult:
        raise RuntimeError("exporter bug")

    def shutdown(self) -> None:
        return None


def test_a_broken_span_exporter_never_reaches_training() -> None:
    model = Tiny()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    handle = instrument(
        model,
        optimizer,
        registry=(registry := CollectorRegistry()),
        span_exporter=ExplodingExporter(),
    )
    run_steps(model, optimizer, 3)
    handle.force_flush_spans()
    assert sample(registry, "trainguard_spans_dropped_total") >= 3
    handle.uninstrument()


class Events(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)

    def actions(self, action: str) -> list[logging.LogRecord]:
        return [r for r in self.records if getattr(r, contract.FIELD_EVENT_ACTION, None) == action]


@pytest.fixture
def events() -> Any:
    handler = Events()
    logger = logging.getLogger(EVENTS_LOGGER)
    logger.addHandler(handler)
    previous = logger.level
    logger.setLevel(logging.DEBUG)
    yield handler
    logger.removeHandler(handler)
    logger.setLevel(previous)


def test_oom_is_counted_logged_and_reraised(events: Events) -> None:
    model = Tiny(oom_above=4)
    handle = instrument(model, registry=(registry := CollectorRegistry()))
    with pytest.raises(torch.OutOfMemoryError):
        handle.guarded_step(torch.ones(8, 8), lambda micro: model(micro).mean())
    with pytest.raises(torch.OutOfMemoryError):
        model(torch.ones(6, 8))
    assert sample(registry, "trainguard_oom_events_total") == 2
    first, second = events.actions("oom")
    assert getattr(first, contract.FIELD_JOB_ID) == "job-1"
    assert getattr(first, contract.FIELD_DETAILS)["where"] == "forward"
    assert getattr(first, contract.FIELD_TRACE_ID) == handle.trace_id(0)
    assert getattr(second, contract.FIELD_DETAILS)["where"] == "forward"
    handle.uninstrument()


def test_oom_recovery_in_one_process_gives_the_unsplit_gradients(events: Events) -> None:
    torch.manual_seed(0)
    model = Tiny(oom_above=3)
    torch.manual_seed(0)
    reference = Tiny()
    handle = instrument(model, registry=(registry := CollectorRegistry()), oom_recovery=True)
    x = torch.randn(10, 8)
    handle.guarded_step(x, lambda micro: model(micro).square().mean())
    reference(x).square().mean().backward()
    for ours, theirs in zip(model.parameters(), reference.parameters(), strict=True):
        assert torch.allclose(ours.grad, theirs.grad, atol=1e-6)  # type: ignore[arg-type]
    assert sample(registry, "trainguard_oom_recoveries_total") == 1
    assert len(events.actions("oom")) == 2, "1 -> 2 -> 4 micro-batches: two OOMs on the way"
    (recovered,) = events.actions("oom_recovered")
    assert getattr(recovered, contract.FIELD_DETAILS) == {"micro_batches": 4}
    # The next step starts split in four and needs no recovery: nothing more is counted.
    model.zero_grad()
    handle.guarded_step(x, lambda micro: model(micro).square().mean())
    assert sample(registry, "trainguard_oom_recoveries_total") == 1
    assert len(events.actions("oom_recovered")) == 1
    handle.uninstrument()


def test_oom_recovery_gives_up_at_the_split_limit() -> None:
    model = Tiny(oom_above=0)
    handle = instrument(model, oom_recovery=True, oom_split_max=4)
    with pytest.raises(torch.OutOfMemoryError):
        handle.guarded_step(torch.ones(8, 8), lambda micro: model(micro).mean())
    handle.uninstrument()


def test_rank_info_says_where_the_job_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SLURM_JOB_ID", "4242")
    monkeypatch.delenv(contract.ENV_SCHEDULER, raising=False)
    registry = CollectorRegistry()
    handle = instrument(Tiny(), registry=registry)
    try:
        info = sample(
            registry,
            contract.RANK_INFO.name,
            backend="none",
            world_size="1",
            device="cpu",
            parallelism="none",
            timing_source="wall_clock",
            scheduler="slurm",
            namespace="",
            slurm_job_id="4242",
        )
        assert info == 1.0
    finally:
        handle.uninstrument()


def test_a_pod_without_its_node_name_is_warned_about(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.0.0.1")
    monkeypatch.delenv(contract.ENV_NODE, raising=False)
    for env in ("SLURM_JOB_ID", contract.ENV_SCHEDULER):
        monkeypatch.delenv(env, raising=False)
    with caplog.at_level(logging.WARNING, logger="trainguard.instrumentation"):
        trainguard.instrument(Tiny(), job_id="job-1", metrics_port=-1).uninstrument()
        named = trainguard.instrument(Tiny(), job_id="job-1", node="gpu-node-7", metrics_port=-1)
        named.uninstrument()
    warnings = [r.getMessage() for r in caplog.records if "spec.nodeName" in r.getMessage()]
    assert len(warnings) == 1, warnings
    assert contract.ENV_NODE in warnings[0]


def test_an_unknown_scheduler_fails_instrument_before_training() -> None:
    with pytest.raises(ValueError, match="'nomad'"):
        instrument(Tiny(), scheduler="nomad")


def test_unknown_settings_are_refused() -> None:
    with pytest.raises(TypeError, match="unknown setting"):
        trainguard.instrument(Tiny(), per_bukket=True)


# -- the watchdog's decisions, with a scripted Flight Recorder and store --------------------


class FakeStore:
    def __init__(self) -> None:
        self.data: dict[str, bytes] = {}

    def set(self, key: str, value: str) -> None:
        self.data[key] = value.encode()

    def check(self, keys: list[str]) -> bool:
        return all(k in self.data for k in keys)

    def get(self, key: str) -> bytes:
        return self.data[key]


def make_watchdog(
    tmp_path: Path, state: dict[str, Any], store: FakeStore, clock: StepClock
) -> tuple[CollectiveWatchdog, CollectorRegistry]:
    registry = CollectorRegistry()
    identity = Identity(job_id="job-w", rank=1, local_rank=1, world_size=2, node="n")
    metrics = RankMetrics(registry, identity.labels())
    watchdog = CollectiveWatchdog(
        identity=identity,
        metrics=metrics,
        errors=ErrorBudget(metrics.instrumentation_errors, identity.labels()),
        clock=clock,
        dump_dir=tmp_path,
        stall_floor_seconds=2.0,
        stall_factor=3.0,
        interval_seconds=0.05,
        store=store,
        read_state=lambda: state,
    )
    return watchdog, registry


def pending_state(age_seconds: float, seq: int = 7, timeout_ms: int = 600_000) -> dict[str, Any]:
    return {
        "entries": [
            {
                "collective_seq_id": seq,
                "retired": False,
                "state": "scheduled",
                "time_created_ns": time.time_ns() - int(age_seconds * 1e9),
                "profiling_name": "nccl:all_reduce",
                "timeout_ms": timeout_ms,
            }
        ]
    }


def gauge(registry: CollectorRegistry, name: str) -> float:
    labels = {"job_id": "job-w", "rank": "1", "local_rank": "1", "node": "n"}
    return registry.get_sample_value(name, labels) or 0.0


def test_watchdog_reports_a_stall_once_and_flags_peers(tmp_path: Path, events: Events) -> None:
    clock = StepClock()
    clock.recent.extend([0.2, 0.25])
    clock.started_ns = time.perf_counter_ns() - 10 * 10**9
    store = FakeStore()
    state = pending_state(age_seconds=9.0)
    watchdog, registry = make_watchdog(tmp_path, state, store, clock)
    watchdog.check()
    watchdog.check()
    assert gauge(registry, "trainguard_collective_inflight") == 1
    oldest = gauge(registry, "trainguard_collective_oldest_inflight_seconds")
    assert oldest == pytest.approx(9, abs=1)
    assert gauge(registry, "trainguard_collective_stalls_total") == 1
    assert store.data[watchdog.store_key] == b"seq7"
    (event,) = events.actions("collective_stalled")
    assert getattr(event, contract.FIELD_DETAILS)["collective_seq_id"] == 7
    folder = tmp_path / "job-w" / "stall-seq7"
    assert (folder / f"{contract.STACKS_DUMP_PREFIX}1.txt").exists()


def test_watchdog_stays_quiet_below_the_adaptive_threshold(tmp_path: Path) -> None:
    clock = StepClock()
    clock.recent.extend([1.0, 1.2])  # slow steps: threshold is 3 x 1.2 s = 3.6 s
    clock.started_ns = time.perf_counter_ns() - 3 * 10**9
    watchdog, registry = make_watchdog(tmp_path, pending_state(2.9), FakeStore(), clock)
    watchdog.check()
    assert watchdog.stall_threshold() == pytest.approx(3.6)
    assert gauge(registry, "trainguard_collective_oldest_inflight_seconds") > 2
    assert gauge(registry, "trainguard_collective_stalls_total") == 0


def test_watchdog_does_not_read_the_recorder_while_steps_are_normal(tmp_path: Path) -> None:
    clock = StepClock()
    clock.recent.extend([1.0])
    clock.started_ns = time.perf_counter_ns() - int(0.5 * 10**9)

    def must_not_read() -> dict[str, Any]:
        raise AssertionError("read the Flight Recorder during a normal step")

    watchdog, registry = make_watchdog(tmp_path, {}, FakeStore(), clock)
    watchdog._read_state = must_not_read
    watchdog.check()
    assert gauge(registry, "trainguard_collective_inflight") == 0
    assert gauge(registry, "trainguard_instrumentation_errors_total") == 0


def test_watchdog_dumps_when_a_peer_flags_a_stall(tmp_path: Path) -> None:
    store = FakeStore()
    watchdog, _ = make_watchdog(tmp_path, {}, store, StepClock())
    store.set(watchdog.store_key, "seq42")
    watchdog.check()
    watchdog.check()
    stacks = list((tmp_path / "job-w").glob("stall-seq42/*.txt"))
    assert len(stacks) == 1


def test_watchdog_counts_a_collective_past_its_timeout(tmp_path: Path, events: Events) -> None:
    clock = StepClock()
    clock.started_ns = time.perf_counter_ns() - 20 * 10**9
    watchdog, registry = make_watchdog(
        tmp_path, pending_state(15.0, timeout_ms=10_000), FakeStore(), clock
    )
    watchdog.check()
    watchdog.check()
    assert gauge(registry, "trainguard_collective_timeouts_total") == 1
    assert len(events.actions("collective_timeout")) == 1


class KeepingExporter(SpanExporter):
    def __init__(self) -> None:
        self.spans: list[Any] = []

    def export(self, spans: Any) -> SpanExportResult:
        self.spans.extend(spans)
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        return None


def test_logs_of_a_step_carry_its_trace_and_this_rank_s_span(tmp_path: Path) -> None:
    log_file = tmp_path / "rank0.ndjson"
    logger = logging.getLogger("test.correlated")
    setup = configure_logging(service_name="trainer", file=log_file, logger=logger)
    model = Tiny()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    exporter = KeepingExporter()
    handle = instrument(model, optimizer, span_exporter=exporter)
    for step in range(3):
        optimizer.zero_grad()
        model(torch.ones(4, 8)).mean().backward()
        logger.info("loss of step %d", step)
        optimizer.step()
    handle.force_flush_spans()
    handle.uninstrument()
    logger.info("after uninstrument")
    setup.close()
    records = [json.loads(line) for line in log_file.read_text().splitlines()]
    rank_spans = {
        span.attributes[contract.ATTR_STEP]: span.context
        for span in exporter.spans
        if span.name == contract.SPAN_RANK_STEP
    }
    for step, record in enumerate(records[:3]):
        assert record["trace"]["id"] == handle.trace_id(step)
        assert record["trace"]["id"] == f"{rank_spans[step].trace_id:032x}"
        assert record["span"]["id"] == f"{rank_spans[step].span_id:016x}"
    assert "trace" not in records[3] and "span" not in records[3]


class ExportCounter(SpanExporter):
    """Passes spans on to ``inner``, counting those it exported."""

    def __init__(self, inner: SpanExporter) -> None:
        self.inner = inner
        self.exported = 0

    def export(self, spans: Any) -> SpanExportResult:
        result = self.inner.export(spans)
        if result is SpanExportResult.SUCCESS:
            self.exported += len(spans)
        return result

    def shutdown(self) -> None:
        self.inner.shutdown()


def record_every_span(monkeypatch: pytest.MonkeyPatch) -> InMemorySpanExporter:
    """Every span the hook's tracer provider makes, exported or not."""
    made = InMemorySpanExporter()
    build = tracing.build_provider

    def build_and_record(*args: Any, **kwargs: Any) -> Any:
        provider, ids = build(*args, **kwargs)
        provider.add_span_processor(SimpleSpanProcessor(made))
        return provider, ids

    monkeypatch.setattr(tracing, "build_provider", build_and_record)
    return made


def test_an_unreachable_otlp_endpoint_counts_every_span_and_logs_once(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(tracing, "MAX_QUEUED_SPANS", 16)
    made = record_every_span(monkeypatch)
    otlp = OTLPSpanExporter(endpoint=f"http://127.0.0.1:{free_port()}/v1/traces", timeout=2)
    exporter = ExportCounter(otlp)
    model = Tiny()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    handle = instrument(
        model, optimizer, registry=(registry := CollectorRegistry()), span_exporter=exporter
    )
    with caplog.at_level(logging.DEBUG, logger=tracing.OTLP_EXPORTER_LOGGERS):
        for _ in range(3):  # several exports, each retried, fail meanwhile
            run_steps(model, optimizer, 40)
            handle.flush()
            time.sleep(1)
        run_steps(model, optimizer, 40)  # spans queued behind an export that is retrying
        handle.flush()
        started = time.monotonic()
        handle.uninstrument()
        uninstrument_seconds = time.monotonic() - started
    spans = len(made.get_finished_spans())
    assert spans >= 160 > 2 * tracing.MAX_QUEUED_SPANS, "the queue overflowed"
    assert sample(registry, "trainguard_spans_dropped_total") == spans - exporter.exported
    assert uninstrument_seconds < 3
    errors = "trainguard_instrumentation_errors_total"
    assert sample(registry, errors, component="tracing") >= 1, "failed exports are counted"
    otlp_lines = [r.msg for r in caplog.records if r.name.startswith(tracing.OTLP_EXPORTER_LOGGERS)]
    assert otlp_lines, "the first failure of each kind is still logged"
    assert len(otlp_lines) == len(set(otlp_lines)), f"one line per kind: {otlp_lines}"
    assert not [
        name
        for name, existing in logging.Logger.manager.loggerDict.items()
        if isinstance(existing, logging.Logger)
        and any(isinstance(f, tracing.ExporterLogLimiter) for f in existing.filters)
    ], "uninstrument removes the log filter"


class HangingExporter(SpanExporter):
    """An exporter whose export blocks until released, ignoring shutdown."""

    def __init__(self) -> None:
        self.release = threading.Event()

    def export(self, spans: Any) -> SpanExportResult:
        self.release.wait(30)
        return SpanExportResult.FAILURE

    def shutdown(self) -> None:
        return None


def test_uninstrument_is_bounded_when_an_export_hangs(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tracing, "MAX_QUEUED_SPANS", 16)
    made = record_every_span(monkeypatch)
    exporter = HangingExporter()
    model = Tiny()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    handle = instrument(
        model, optimizer, registry=(registry := CollectorRegistry()), span_exporter=exporter
    )
    run_steps(model, optimizer, 20)
    handle.flush()
    time.sleep(1.5)  # the first batch is taken and hangs in export
    started = time.monotonic()
    handle.uninstrument()
    assert time.monotonic() - started < 3
    exporter.release.set()
    spans = len(made.get_finished_spans())
    assert spans >= 100 > tracing.MAX_QUEUED_SPANS, "the queue overflowed"
    deadline = time.monotonic() + 10
    while (
        sample(registry, "trainguard_spans_dropped_total") < spans and time.monotonic() < deadline
    ):
        time.sleep(0.05)
    # The hung batch is counted when its export finally fails, the rest at shutdown.
    assert sample(registry, "trainguard_spans_dropped_total") == spans


class SilentStore:
    """A store in which rank 0 never writes."""

    def set(self, key: str, value: str) -> None:
        raise AssertionError("only rank 0 writes")

    def wait(self, keys: list[str], timeout: Any) -> None:
        raise TimeoutError(f"{keys} not set within {timeout}")

    def get(self, key: str) -> bytes:
        raise AssertionError("not reached")


def test_a_rank_that_gets_no_job_id_from_rank_0_goes_on_with_its_own(
    caplog: pytest.LogCaptureFixture,
) -> None:
    agree = job_id_from_rank0(SilentStore(), rank=3)
    assert agree("job-mine") == "job-mine"
    assert contract.ENV_JOB_ID in caplog.text


def test_a_failure_is_counted_every_time_and_logged_once_per_kind(events: Events) -> None:
    registry = CollectorRegistry()
    identity = Identity(job_id="job-e", rank=2, local_rank=0, world_size=4, node="n")
    metrics = RankMetrics(registry, identity.labels())
    errors = ErrorBudget(metrics.instrumentation_errors, identity.labels())
    for _ in range(3):
        with errors.guard("memory"):
            raise OSError("cgroup file vanished")
    with errors.guard("memory"):
        raise ValueError("garbage in memory.stat")
    labels = {**identity.labels(), "component": "memory"}
    assert registry.get_sample_value("trainguard_instrumentation_errors_total", labels) == 4
    logged = events.actions("instrumentation_error")
    assert [getattr(r, contract.FIELD_DETAILS)["error"] for r in logged] == [
        "OSError",
        "ValueError",
    ]
    assert getattr(logged[0], contract.FIELD_RANK) == "2"


def test_a_saved_checkpoint_is_an_event_of_the_last_finished_step(
    tmp_path: Path, events: Events
) -> None:
    model = Tiny()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    handle = instrument(model, optimizer)
    run_steps(model, optimizer, 2)
    handle.record_checkpoint(tmp_path / "latest.pt")
    handle.uninstrument()
    (saved,) = events.actions("checkpoint")
    assert getattr(saved, contract.FIELD_STEP) == "1"
    assert getattr(saved, contract.FIELD_DETAILS) == {"path": str(tmp_path / "latest.pt")}
    assert getattr(saved, contract.FIELD_TRACE_ID) == handle.trace_id(1)


def test_the_same_registry_can_be_instrumented_again_after_uninstrument() -> None:
    registry = CollectorRegistry()  # as prometheus_client's global REGISTRY would be
    model = Tiny()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(2):
        handle = instrument(model, optimizer, registry=registry)
        run_steps(model, optimizer, 2)
        handle.uninstrument()
        # Readable after uninstrument; the next handle starts from zero.
        assert sample(registry, "trainguard_steps_total") == 2


def test_step_world_size_and_rank_index_are_exported_as_values() -> None:
    model = Tiny()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    registry = CollectorRegistry()
    handle = instrument(model, optimizer, registry=registry, rank=3, world_size=4)
    labels = {"rank": "3", "local_rank": "3"}
    # Set at instrument time, before any step: the rules need membership from the first scrape.
    assert sample(registry, "trainguard_world_size", **labels) == 4
    assert sample(registry, "trainguard_rank_index", **labels) == 3
    assert sample(registry, "trainguard_step", **labels) == 0
    run_steps(model, optimizer, 3)
    handle.flush()
    # The hook's counter after the last step ended: three steps done.
    assert sample(registry, "trainguard_step", **labels) == 3
    handle.uninstrument()


def test_the_step_continues_from_start_step_after_a_restart_from_a_checkpoint() -> None:
    model = Tiny()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    registry = CollectorRegistry()
    handle = instrument(model, optimizer, registry=registry)
    run_steps(model, optimizer, 5)
    handle.flush()
    assert sample(registry, "trainguard_step") == 5
    handle.uninstrument()
    # The job restarts from a checkpoint of step 2: it reports that step until a step ends,
    # then counts on from it (the verifier waits for it to pass 5).
    handle = instrument(model, optimizer, registry=registry, start_step=2)
    assert sample(registry, "trainguard_step") == 2
    run_steps(model, optimizer, 4)
    handle.flush()
    assert sample(registry, "trainguard_step") == 6
    assert sample(registry, "trainguard_world_size") == 1
    assert sample(registry, "trainguard_rank_index") == 0
    # Numbering set after instrument (set_step) counts the same way.
    handle.set_step(40)
    assert sample(registry, "trainguard_step") == 40
    run_steps(model, optimizer, 1)
    handle.flush()
    assert sample(registry, "trainguard_step") == 41
    handle.uninstrument()
