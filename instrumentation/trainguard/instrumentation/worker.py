"""The worker thread: turns the training thread's raw timestamps into metrics and spans.

The training thread hands over one :class:`StepRecord` per step through a queue and goes on.
Here, off the training thread: phase and step histograms (with the step's trace id as an
exemplar), DDP's reducer timers for the straggler signal (compute vs waiting on peers) and the
gradient sync, memory, and the step's spans.

DDP publishes an iteration's reducer timers at the start of the NEXT forward and overwrites
them at the forward after that. So the training thread pokes the worker right after each
forward (one queue put) and the worker reads the timers while that step's backward runs; they
are matched to their step by timestamp. A step whose timers never appear (sampling, the last
step before ``uninstrument``) is finished without them after :data:`MAX_AWAITING` steps.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable
from typing import Any

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.sdk.trace import TracerProvider

from trainguard import contract
from trainguard.events import log_event

from . import tracing
from .config import Identity
from .errors import ErrorBudget
from .memory import MemorySampler
from .metrics import RankMetrics
from .records import BucketTiming, StepRecord
from .reducer import ReducerStats, parse_logging_data

logger = logging.getLogger("trainguard.instrumentation")

MAX_AWAITING = 3
# Steps finished in a row without the reducer's timers before they are given up on (a torch
# whose logging data no longer parses, or clocks that no longer match): room for sampling
# every 32 steps.
MAX_STEPS_WITHOUT_TIMERS = 64


class ReducerTimersLostError(RuntimeError):
    """DDP's reducer timers stopped matching steps; compute time falls back to wall clock."""


_READ_REDUCER = "read-reducer"
# Reducer timestamps further than this from our own clock are not trusted for span placement
# (e.g. device-relative timestamps); the span is then anchored on the step's own timeline.
CLOCK_TOLERANCE_NS = 2_000_000_000
MATCH_TOLERANCE_NS = 1_000_000


def _seconds(ns: int) -> float:
    return ns / 1e9


class StepWorker:
    def __init__(
        self,
        *,
        identity: Identity,
        metrics: RankMetrics,
        errors: ErrorBudget,
        memory: MemorySampler | None,
        read_reducer: Callable[[], dict[str, Any]] | None,
        tracer_provider: TracerProvider | None,
        ids: tracing.DerivedIdGenerator | None,
        backend: str,
        on_allocator_oom: Callable[[int], None],
    ) -> None:
        self._identity = identity
        self._metrics = metrics
        self._errors = errors
        self._memory = memory
        self._read_reducer = read_reducer
        self._provider = tracer_provider
        self._tracer = (
            tracer_provider.get_tracer(contract.INSTRUMENTATION_SCOPE)
            if tracer_provider is not None
            else None
        )
        self._ids = ids
        self._backend = backend
        self._on_allocator_oom = on_allocator_oom
        # perf_counter_ns -> Unix epoch ns, fixed at start (both clocks are monotonic enough
        # over a job; spans only need to line up across ranks to NTP accuracy).
        self._epoch_offset_ns = time.time_ns() - time.perf_counter_ns()
        self._awaiting: dict[int, StepRecord] = {}
        self._last_iteration = -1
        self._unmatched: ReducerStats | None = None
        self._steps_without_timers = 0
        self._last_alloc_retries: int | None = None
        self._last_ooms: int | None = None
        if memory is not None:
            # The baseline: allocator counters from before instrumentation are not ours.
            with errors.guard("memory"):
                baseline = memory.sample()
                self._last_alloc_retries = baseline.alloc_retries
                self._last_ooms = baseline.ooms
        self.buckets_synced = 0  # fallback collective count when the Flight Recorder is absent
        self._queue: queue.SimpleQueue[StepRecord | str | None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name="trainguard-worker", daemon=True)
        # Plain counters, not an Event: the training thread's submit must not take a lock.
        self._submitted = 0
        self._processed = 0

    # -- lifecycle (training thread) ----------------------------------------------------------
    def start(self) -> None:
        self._thread.start()

    def submit(self, record: StepRecord) -> None:
        self._submitted += 1
        self._queue.put(record)

    def poke(self) -> None:
        """A forward has just published the previous iteration's reducer timers."""
        self._submitted += 1
        self._queue.put(_READ_REDUCER)

    def stop(self) -> None:
        """Finish every queued step, then stop."""
        if self._thread.is_alive():
            self._queue.put(None)
            self._thread.join(timeout=30)
        for record in sorted(self._awaiting.values(), key=lambda r: r.step):
            with self._errors.guard("worker"):
                self._finish(record, None)
        self._awaiting.clear()

    def flush(self, timeout: float = 10.0) -> bool:
        """Wait until everything submitted so far has been processed (tests, shutdown)."""
        target = self._submitted
        deadline = time.monotonic() + timeout
        while self._processed < target:
            if time.monotonic() > deadline or not self._thread.is_alive():
                return False
            time.sleep(0.001)
        return True

    def _run(self) -> None:
        while True:
            record = self._queue.get()
            if record is None:
                return
            with self._errors.guard("worker"):
                if record is _READ_REDUCER:
                    self._read_timers()
                elif isinstance(record, StepRecord):
                    self._process(record)
            self._processed += 1

    # -- per step (worker thread) ---------------------------------------------------------------
    def _process(self, record: StepRecord) -> None:
        m = self._metrics
        exemplar = {contract.EXEMPLAR_TRACE_ID: self.trace_id_hex(record.step)}
        m.steps.inc()
        m.step_duration.observe(_seconds(record.duration_ns), exemplar)
        m.last_step_timestamp.set(_seconds(record.end_ns + self._epoch_offset_ns))
        m.phase_duration[contract.Phase.DATA].observe(_seconds(record.data_wait_ns))
        m.phase_duration[contract.Phase.FORWARD].observe(_seconds(record.forward_ns))
        m.phase_duration[contract.Phase.BACKWARD].observe(_seconds(record.backward_ns))
        m.phase_duration[contract.Phase.OPTIMIZER].observe(_seconds(record.optimizer_ns))
        self._observe_buckets(record, exemplar)
        if self._memory is not None:
            with self._errors.guard("memory"):
                self._sample_memory()
        if self._read_reducer is None:
            self._finish_on_wall_clock(record)
            return
        self._awaiting[record.step] = record
        if self._unmatched is not None:
            with self._errors.guard("reducer_stats"):
                self._settle(self._unmatched)
        for step in sorted(self._awaiting):
            if step <= record.step - MAX_AWAITING:
                self._steps_without_timers += 1
                self._finish(self._awaiting.pop(step), None)
        if self._steps_without_timers >= MAX_STEPS_WITHOUT_TIMERS:
            self._give_up_timers()

    def _give_up_timers(self) -> None:
        """Stop waiting for timers that no longer come: from now on compute time is measured
        like on a plain module (wall clock, which includes waiting on peers), and the loss of
        the straggler signal is counted and logged instead of passing in silence."""
        self._read_reducer = None
        self._unmatched = None
        self._errors.record(
            "reducer_stats",
            ReducerTimersLostError(
                f"DDP's reducer timers matched no step for {self._steps_without_timers} steps; "
                "compute time now falls back to wall-clock phases, which include waiting on "
                "peers (is this torch newer than trainguard knows?)"
            ),
        )
        for step in sorted(self._awaiting):
            self._finish_on_wall_clock(self._awaiting.pop(step))

    def _finish_on_wall_clock(self, record: StepRecord) -> None:
        # No DDP timers (a plain module, a torch without them, timers given up on): the local
        # work is the wall time of data + forward + backward (on DDP that includes the wait).
        self._metrics.compute_duration.observe(
            _seconds(record.data_wait_ns + record.forward_ns + record.backward_ns)
        )
        self._finish(record, None)

    def _read_timers(self) -> None:
        if self._read_reducer is None or not self._awaiting:
            return
        with self._errors.guard("reducer_stats"):
            stats = parse_logging_data(self._read_reducer())
            if stats is None or stats.iteration == self._last_iteration:
                return
            self._last_iteration = stats.iteration
            self._settle(stats)

    def _match(self, stats: ReducerStats) -> StepRecord | None:
        """The awaiting step whose forward holds the reducer's forward start."""
        for record in self._awaiting.values():
            begin = record.forward_start_ns + self._epoch_offset_ns - MATCH_TOLERANCE_NS
            finish = record.forward_end_ns + self._epoch_offset_ns + MATCH_TOLERANCE_NS
            if begin <= stats.forward_start_ns <= finish:
                return record
        return None

    def _settle(self, stats: ReducerStats) -> None:
        """Finish the step ``stats`` belong to, or keep them until that step arrives (the
        worker can read them before it has processed their step's record)."""
        owner = self._match(stats)
        if owner is None:
            self._unmatched = stats
            return
        self._unmatched = None
        self._steps_without_timers = 0
        self._finish(self._awaiting.pop(owner.step), stats)

    def _observe_buckets(self, record: StepRecord, exemplar: dict[str, str]) -> None:
        for bucket in record.buckets:
            seconds = self._bucket_seconds(bucket)
            if bucket.cuda_events is not None:
                bucket.cuda_seconds = seconds
            if seconds is not None:
                self._metrics.grad_sync_duration.observe(seconds, exemplar)
            self._metrics.grad_sync_bytes.inc(bucket.nbytes)
            self.buckets_synced += 1

    def _bucket_seconds(self, bucket: BucketTiming) -> float | None:
        if bucket.cuda_events is None:
            return _seconds(bucket.end_ns - bucket.start_ns)
        start, end = bucket.cuda_events
        with self._errors.guard("bucket_timer"):
            end.synchronize()  # type: ignore[attr-defined]
            milliseconds: float = start.elapsed_time(end)  # type: ignore[attr-defined]
            return milliseconds / 1000
        return None

    def _sample_memory(self) -> None:
        assert self._memory is not None
        sample = self._memory.sample()
        m = self._metrics
        m.memory_allocated.set(sample.allocated_bytes)
        m.memory_reserved.set(sample.reserved_bytes)
        m.memory_capacity.set(sample.capacity_bytes)
        m.memory_fragmentation.set(sample.fragmentation_ratio)
        if self._last_alloc_retries is not None:
            m.memory_alloc_retries.inc(max(0, sample.alloc_retries - self._last_alloc_retries))
        if self._last_ooms is not None and sample.ooms > self._last_ooms:
            self._on_allocator_oom(sample.ooms - self._last_ooms)
        self._last_alloc_retries = sample.alloc_retries
        self._last_ooms = sample.ooms

    def _finish(self, record: StepRecord, stats: ReducerStats | None) -> None:
        m = self._metrics
        if stats is not None:
            # Local work: the whole step up to the optimizer (every micro-batch, where DDP's
            # timers cover only the synchronising one) less the time blocked on peers.
            before_optimizer = record.optimizer_start_ns - record.forward_start_ns
            local = record.data_wait_ns + before_optimizer - stats.sync_wait_ns
            m.compute_duration.observe(_seconds(max(0, local - record.peer_wait_ns)))
            m.sync_wait_duration.observe(_seconds(stats.sync_wait_ns + record.peer_wait_ns))
            if not record.buckets:
                exemplar = {contract.EXEMPLAR_TRACE_ID: self.trace_id_hex(record.step)}
                m.grad_sync_duration.observe(_seconds(stats.comm_ns), exemplar)
                m.grad_sync_bytes.inc(sum(stats.bucket_bytes))
                self.buckets_synced += len(stats.bucket_bytes)
        if self._tracer is not None:
            with self._errors.guard("spans"):
                self._emit_spans(record, stats)

    def trace_id_hex(self, step: int) -> str:
        return tracing.format_trace_id(tracing.trace_id_for(self._identity.job_id, step))

    # -- spans ----------------------------------------------------------------------------------
    def _epoch(self, perf_ns: int) -> int:
        return perf_ns + self._epoch_offset_ns

    def _emit_spans(self, record: StepRecord, stats: ReducerStats | None) -> None:
        assert self._tracer is not None and self._ids is not None
        ident = self._identity
        trace_id = tracing.trace_id_for(ident.job_id, record.step)
        root_id = tracing.root_span_id_for(ident.job_id, record.step)
        common: dict[str, str | int] = {
            contract.ATTR_JOB_ID: ident.job_id,
            contract.ATTR_RANK: ident.rank,
            contract.ATTR_WORLD_SIZE: ident.world_size,
            contract.ATTR_STEP: record.step,
            contract.ATTR_BACKEND: self._backend,
            contract.ATTR_NODE: ident.node,
        }
        start, end = self._epoch(record.start_ns), self._epoch(record.end_ns)
        if ident.rank == 0:
            self._ids.pending_trace_id = trace_id
            self._ids.pending_span_id = root_id
            root = self._tracer.start_span(
                contract.SPAN_STEP, context=Context(), start_time=start, attributes=common
            )
            root.end(end_time=end)
        self._ids.pending_span_id = tracing.rank_span_id_for(ident.job_id, record.step, ident.rank)
        rank_span = self._tracer.start_span(
            contract.SPAN_RANK_STEP,
            context=tracing.remote_parent(trace_id, root_id),
            start_time=start,
            attributes=common,
        )
        inside = trace.set_span_in_context(rank_span)

        def child(name: str, begin: int, finish: int, ctx: Context = inside) -> trace.Span:
            span = self._tracer.start_span(  # type: ignore[union-attr]
                name, context=ctx, start_time=begin, attributes=common
            )
            span.end(end_time=max(begin, finish))
            return span

        child(
            contract.SPAN_FORWARD,
            self._epoch(record.forward_start_ns),
            self._epoch(record.forward_end_ns),
        )
        child(
            contract.SPAN_BACKWARD,
            self._epoch(record.forward_end_ns),
            self._epoch(record.optimizer_start_ns),
        )
        child(contract.SPAN_OPTIMIZER, self._epoch(record.optimizer_start_ns), end)
        sync_span = self._grad_sync_span(record, stats, inside, common)
        if sync_span is not None and record.buckets:
            sync_ctx = trace.set_span_in_context(sync_span)
            for bucket in record.buckets:
                if bucket.cuda_events is None:
                    b_start, b_end = self._epoch(bucket.start_ns), self._epoch(bucket.end_ns)
                else:
                    b_end = self._epoch(record.optimizer_start_ns)
                    b_start = b_end - int((bucket.cuda_seconds or 0.0) * 1e9)
                span = self._tracer.start_span(
                    contract.SPAN_GRAD_SYNC_BUCKET,
                    context=sync_ctx,
                    start_time=b_start,
                    attributes={
                        **common,
                        contract.ATTR_BUCKET_INDEX: bucket.index,
                        contract.ATTR_BUCKET_BYTES: bucket.nbytes,
                    },
                )
                span.end(end_time=max(b_start, b_end))
        rank_span.end(end_time=end)

    def _grad_sync_span(
        self,
        record: StepRecord,
        stats: ReducerStats | None,
        ctx: Context,
        common: dict[str, str | int],
    ) -> trace.Span | None:
        """The step's gradient sync: the reducer's exact start/end when it has them."""
        assert self._tracer is not None
        backward_start = self._epoch(record.forward_end_ns)
        backward_end = self._epoch(record.optimizer_start_ns)
        if stats is not None:
            begin, finish = stats.comm_start_ns, stats.comm_end_ns
            if not (
                backward_start - CLOCK_TOLERANCE_NS <= begin
                and finish <= backward_end + CLOCK_TOLERANCE_NS
            ):
                finish = backward_end
                begin = finish - stats.comm_ns
        elif record.buckets:
            timed = [b for b in record.buckets if b.cuda_events is None]
            if timed:
                begin = self._epoch(min(b.start_ns for b in timed))
                finish = self._epoch(max(b.end_ns for b in timed))
            else:
                begin, finish = backward_start, backward_end
        else:
            return None
        span = self._tracer.start_span(
            contract.SPAN_GRAD_SYNC,
            context=ctx,
            start_time=begin,
            attributes=common,
        )
        span.end(end_time=max(begin, finish))
        return span


def log_oom(
    identity: Identity,
    step: int,
    where: str,
    summary: dict[str, Any],
    error: BaseException | None,
) -> None:
    log_event(
        f"rank {identity.rank} ran out of memory in {where} at step {step}",
        contract.EventKind.OOM,
        **identity.event_fields(),
        step=step,
        trace_id=tracing.format_trace_id(tracing.trace_id_for(identity.job_id, step)),
        outcome=contract.EventOutcome.FAILURE,
        details={"where": where, "error": str(error)[:2000] if error else None, **summary},
    )
