"""The worker thread: turns the training thread's raw timestamps into metrics and spans.

The training thread appends one step per step to an inbox, as a plain tuple
(:data:`.records.RawStep`, made a :class:`StepRecord` here), and goes on; it never wakes this
thread (a wake-up per step cost the training thread more than all its own work).
The worker wakes on its own and does everything else: phase and step histograms (with the step's
trace id as an exemplar), the step's collective timeline (see :mod:`.timeline`: gradient syncs,
parameter all-gathers, time blocked on peers), DDP's reducer timers for the part of the
gradient sync the timeline cannot see, memory, and the step's spans.

Each wake takes the GIL from the training thread, so the worker wakes rarely: every
:data:`WAKE_SECONDS`, backing off to :data:`IDLE_WAKE_SECONDS` while no step arrives.

DDP publishes a sampled iteration's reducer timers at the start of the NEXT syncing forward and
keeps them until the next sampled iteration's. Reading them in that window from here would take
a wake-up per publish, which costs the training thread more than reading them itself (a copy of
the C++ logger's record, see :func:`.reducer.logging_data_reader`): so the training thread reads
them right after each forward that publishes (:class:`.reducer.TimerReads`; one step in
``runtime_stats_every``) and hands the record over in that step's record; here its maps are
converted and parsed, and the timers matched to their step by timestamp. A step whose timers
never appear (not sampled) is finished without them once a later step's timers match or
:data:`MAX_AWAITING` newer steps have arrived: its compute and sync wait are not observed.

Spans never wait for those timers: a DDP step's spans leave as soon as the step is processed,
and its gradient sync's span follows when the step is finished (DDP's timing, or the backward
pass it overlapped, marked ``untimed``). Whatever is still awaited when spans must leave at once
(:meth:`StepWorker.flush`, :meth:`StepWorker.stop`, a stall the watchdog reports) leaves then,
marked ``unread``: every step that ran is exported, with the timing known at that moment.
"""

from __future__ import annotations

import collections
import logging
import time
from collections.abc import Callable

from opentelemetry.sdk.trace import TracerProvider

from trainguard import contract
from trainguard.background import BackgroundThread
from trainguard.instrumentation import timeline, tracing
from trainguard.instrumentation.config import Identity
from trainguard.instrumentation.errors import ErrorBudget
from trainguard.instrumentation.memory import MemorySampler
from trainguard.instrumentation.metrics import RankMetrics
from trainguard.instrumentation.recent import RecentMean, RecentMedian
from trainguard.instrumentation.records import BucketTiming, RawStep, StepRecord
from trainguard.instrumentation.reducer import RawLoggingData, ReducerStats, parse_logging_data
from trainguard.instrumentation.step_spans import StepSpans, by_role
from trainguard.instrumentation.watchdog import StallReport

logger = logging.getLogger("trainguard.instrumentation")

MAX_AWAITING = 3
# Steps finished in a row without the reducer's timers before they are given up on (a torch
# whose logging data no longer parses, or clocks that no longer match): room for sampling
# every 32 steps (runtime_stats_every; the default is 8).
MAX_STEPS_WITHOUT_TIMERS = 64
# ... and reads of the timers in a row that gave nothing usable (with runtime_stats_every > 1
# most steps have none, which alone is no sign of loss).
MIN_READS_WITHOUT_TIMERS = 8
WAKE_SECONDS = 0.1
IDLE_WAKE_SECONDS = 1.0


class _Timers:
    """DDP's logging data handed over apart from a step (see :meth:`StepWorker.submit_timers`)."""

    __slots__ = ("data",)

    def __init__(self, data: RawLoggingData) -> None:
        self.data = data


class _Flush:
    """Send every awaited step's sync span now (:meth:`StepWorker.flush`)."""

    __slots__ = ()


class _Stall:
    """The watchdog reported the step in progress stalled (:meth:`StepWorker.submit_stall`)."""

    __slots__ = ("report",)

    def __init__(self, report: StallReport) -> None:
        self.report = report


class ReducerTimersLostError(RuntimeError):
    """DDP's reducer timers stopped matching steps; compute time falls back to wall clock."""


MATCH_TOLERANCE_NS = 1_000_000


def _seconds(ns: int) -> float:
    return ns / 1e9


class StepWorker(BackgroundThread):
    """Turns each step the training thread submits into metrics and spans (its own thread)."""

    def __init__(
        self,
        *,
        identity: Identity,
        metrics: RankMetrics,
        errors: ErrorBudget,
        memory: MemorySampler | None,
        ddp_timers: bool,
        tracer_provider: TracerProvider | None,
        ids: tracing.DerivedIdGenerator | None,
        backend: str,
        on_allocator_oom: Callable[[int], None],
        roles: timeline.Roles | None = None,
        per_bucket: bool = False,
        on_timers_lost: Callable[[], None] | None = None,
        recent_seconds: float = contract.RECENT_COMPUTE_SECONDS,
    ) -> None:
        super().__init__("trainguard-worker")
        self._identity = identity
        self._metrics = metrics
        self._errors = errors
        self._memory = memory
        self._ddp_timers = ddp_timers  # records carry DDP's reducer timers
        # A DDP model: its gradient sync, which the timeline cannot see, gets a span each step.
        self._ddp = ddp_timers
        self._backend = backend
        self._on_allocator_oom = on_allocator_oom
        # None: no timeline (a single process), compute time is wall clock.
        self._roles = roles
        self._per_bucket = per_bucket
        self._on_timers_lost = on_timers_lost
        self._overflow_logged = False
        # perf_counter_ns -> Unix epoch ns, fixed at start (both clocks are monotonic enough
        # over a job; spans only need to line up across ranks to NTP accuracy).
        self._epoch_offset_ns = time.time_ns() - time.perf_counter_ns()
        self._spans = (
            StepSpans(
                tracer_provider,
                ids,
                identity,
                backend,
                self._epoch_offset_ns,
                roles,
                per_bucket,
            )
            if tracer_provider is not None and ids is not None
            else None
        )
        self._awaiting: dict[int, StepRecord] = {}
        self._last_iteration = -1
        self._unmatched: ReducerStats | None = None
        # (bytes, buckets) of DDP's gradient sync as the last timed step had them.
        self._sync_bytes = (0, 0)
        # Of the latest timed steps, compute per input element; of many more, input elements
        # and compute + sync wait in seconds (see _observe_compute).
        self._recent_compute = RecentMedian(
            recent_seconds,
            contract.RECENT_COMPUTE_MIN_OBSERVATIONS,
            contract.RECENT_COMPUTE_MAX_OBSERVATIONS,
        )
        self._usual_inputs = RecentMean(contract.USUAL_OBSERVATIONS)
        self._usual_busy = RecentMean(contract.USUAL_OBSERVATIONS)
        self._steps_without_timers = 0
        self._reads_without_timers = 0
        self._last_alloc_retries: int | None = None
        self._last_ooms: int | None = None
        if memory is not None:
            # The baseline: allocator counters from before instrumentation are not ours.
            with errors.guard("memory"):
                baseline = memory.sample()
                self._last_alloc_retries = baseline.alloc_retries
                self._last_ooms = baseline.ooms
        self.buckets_synced = 0  # fallback collective count when the Flight Recorder is absent
        # The training thread appends (atomic under the GIL) and never waits or wakes anyone.
        self._inbox: collections.deque[RawStep | StepRecord | _Timers | _Flush | _Stall] = (
            collections.deque()
        )
        self._interval = WAKE_SECONDS
        # Plain counters, not an Event: the training thread's submit must not take a lock.
        self._submitted = 0
        self._processed = 0

    # -- lifecycle (training thread) ----------------------------------------------------------
    def submit(self, record: RawStep | StepRecord) -> None:
        self._submitted += 1
        self._inbox.append(record)

    def submit_timers(self, data: RawLoggingData) -> None:
        """DDP timers read at a forward whose step has not ended (flush, uninstrument)."""
        self._submitted += 1
        self._inbox.append(_Timers(data))

    def submit_stall(self, report: StallReport) -> None:
        """The watchdog's report of a stalled step (its thread): the spans of the steps still
        awaited and of the stalled one leave at the worker's next wake (:meth:`wake` it)."""
        self._submitted += 1
        self._inbox.append(_Stall(report))

    def stop(self, timeout: float | None = 30.0) -> None:
        """Finish every queued step, then stop (waiting ``timeout`` seconds at most for the
        thread; the steps it left are finished here, their sync spans ``unread``)."""
        super().stop(timeout=timeout)
        for record in sorted(self._awaiting.values(), key=lambda r: r.step):
            with self._errors.guard("worker"):
                self._finish(record, None, contract.SyncTiming.UNREAD)
        self._awaiting.clear()

    def flush(self, timeout: float = 10.0) -> bool:
        """Wait until everything submitted so far has been processed, every step's spans
        handed to the tracer provider included (tests, shutdown, a stall)."""
        self._submitted += 1
        self._inbox.append(_Flush())
        target = self._submitted
        deadline = time.monotonic() + timeout
        self.wake()
        while self._processed < target:
            if time.monotonic() > deadline or not self.alive:
                return False
            time.sleep(0.001)
        return True

    def run(self) -> None:
        while True:
            woken = self.wait_for_work(self._interval)
            if not woken and not self._inbox and not self._awaiting:  # idle: wait longer
                self._interval = min(IDLE_WAKE_SECONDS, self._interval * 2)
            with self._errors.guard("worker"):
                self._drain()
            if self.stopping:
                with self._errors.guard("worker"):
                    self._drain()
                return

    def _drain(self) -> None:
        """Process every step in the inbox, then sample memory (once per wake: the gauges are
        scraped every few seconds). The items count as processed once the memory is sampled
        too, so that :meth:`flush` returns with the gauges of its steps set."""
        processed = 0
        while self._inbox:
            item = self._inbox.popleft()
            with self._errors.guard("worker"):
                if isinstance(item, tuple):
                    self._process(StepRecord.from_raw(item))
                elif isinstance(item, StepRecord):
                    self._process(item)
                elif isinstance(item, _Flush):
                    self._send_awaited_syncs()
                elif isinstance(item, _Stall):
                    self._send_awaited_syncs()
                    if self._spans is not None:
                        with self._errors.guard("spans"):
                            self._spans.emit_stall(item.report)
                elif self._ddp_timers:
                    self._take_timers(item.data)
            processed += 1
        if processed and self._memory is not None:
            with self._errors.guard("memory"):
                self._sample_memory()
        self._processed += processed

    # -- per step (worker thread) ---------------------------------------------------------------
    def _process(self, record: StepRecord) -> None:
        m = self._metrics
        duration = record.duration_ns
        self._interval = WAKE_SECONDS
        exemplar = {contract.EXEMPLAR_TRACE_ID: self.trace_id_hex(record.step)}
        m.steps.inc()
        m.step_duration.observe(_seconds(duration), exemplar)
        m.last_step_timestamp.set(_seconds(record.end_ns + self._epoch_offset_ns))
        # The hook's counter once this step ended: what a checkpoint saved now resumes from,
        # and what the remediation service's verifier compares across a repair.
        m.training_step.set(record.step + 1)
        m.phase_duration[contract.Phase.DATA].observe(_seconds(record.data_wait_ns))
        m.phase_duration[contract.Phase.FORWARD].observe(_seconds(record.forward_ns))
        m.phase_duration[contract.Phase.BACKWARD].observe(_seconds(record.backward_ns))
        m.phase_duration[contract.Phase.OPTIMIZER].observe(_seconds(record.optimizer_ns))
        self._observe_buckets(record, exemplar)
        self._observe_timeline(record, exemplar)
        if not self._ddp_timers:
            self._finish_without_reducer(record)
            return
        if self._spans is not None:
            # The step's spans leave now; its sync's follows once its timers are known.
            with self._errors.guard("spans"):
                record.sync_sent = self._spans.emit(record, None, untimed=None)
                record.spans_sent = True
        self._awaiting[record.step] = record
        with self._errors.guard("reducer_stats"):
            if self._unmatched is not None:
                self._settle(self._unmatched)
            if record.reducer_data is not None:
                self._take_timers(record.reducer_data)
        self._expire()

    def _expire(self) -> None:
        """Finish the steps whose timers did not come in time; give the timers up when none
        have matched for :data:`MAX_STEPS_WITHOUT_TIMERS` steps and
        :data:`MIN_READS_WITHOUT_TIMERS` reads."""
        if not self._awaiting:
            return
        newest = max(self._awaiting)
        for step in sorted(self._awaiting):
            if step <= newest - MAX_AWAITING:
                self._steps_without_timers += 1
                self._finish(self._awaiting.pop(step), None)
                if (
                    self._steps_without_timers >= MAX_STEPS_WITHOUT_TIMERS
                    and self._reads_without_timers >= MIN_READS_WITHOUT_TIMERS
                ):
                    self._give_up_timers()
                    return

    def _give_up_timers(self) -> None:
        """Stop waiting for timers that no longer come: from now on compute time comes from
        the collective timeline alone (on DDP that includes the gradient sync: wall clock), and
        the loss of the straggler signal is counted, logged and shown in ``rank_info``."""
        self._ddp_timers = False
        self._unmatched = None
        self._errors.record(
            "reducer_stats",
            ReducerTimersLostError(
                f"DDP's reducer timers matched no step for {self._steps_without_timers} steps; "
                "compute time now falls back to wall-clock phases, which include waiting on "
                "peers (is this torch newer than trainguard knows?)"
            ),
        )
        if self._on_timers_lost is not None:
            self._on_timers_lost()
        for step in sorted(self._awaiting):
            self._finish_without_reducer(self._awaiting.pop(step))

    def _take_timers(self, data: RawLoggingData) -> None:
        """DDP's logging data as the training thread read it at a step's first forward."""
        stats = parse_logging_data(data)
        if stats is None:
            self._reads_without_timers += 1
            return
        if stats.iteration == self._last_iteration:
            return  # nothing new published since the last read (runtime_stats_every > 1)
        self._last_iteration = stats.iteration
        self._settle(stats)
        if self._unmatched is not None:
            self._reads_without_timers += 1

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
        self._reads_without_timers = 0
        # DDP publishes in iteration order: the steps before this one that are still waiting
        # were not sampled (or their timers were overwritten), and nothing will come for them.
        for step in sorted(s for s in self._awaiting if s < owner.step):
            self._finish(self._awaiting.pop(step), None)
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

    def _observe_timeline(self, record: StepRecord, exemplar: dict[str, str]) -> None:
        """Gradient syncs and parameter all-gathers from the step's collective timeline: one
        observation per step, or one per collective (an FSDP unit) in bucket mode."""
        if self._roles is None or not record.collectives:
            return
        if record.collectives_overflow and not self._overflow_logged:
            self._overflow_logged = True
            logger.warning(
                "trainguard: step %d issued more than %d collectives; the timeline keeps the "
                "first %d of each step",
                record.step,
                timeline.MAX_COLLECTIVES_PER_STEP,
                timeline.MAX_COLLECTIVES_PER_STEP,
            )
        m = self._metrics
        syncs = by_role(record, self._roles, timeline.Role.GRAD_SYNC)
        gathers = by_role(record, self._roles, timeline.Role.PARAM_GATHER)
        for entries, histogram in (
            (syncs, m.grad_sync_duration),
            (gathers, m.param_gather_duration),
        ):
            if not entries:
                continue
            durations = [_seconds(max(0, c.end_ns - c.start_ns)) for c in entries]
            if self._per_bucket:
                for seconds in durations:
                    histogram.observe(seconds, exemplar)
            else:
                histogram.observe(sum(durations), exemplar)
        if syncs:
            m.grad_sync_bytes.inc(sum(c.nbytes for c in syncs))
            self.buckets_synced += len(syncs)

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

    def _split(self, record: StepRecord, reducer_wait_ns: int) -> tuple[int, int]:
        """(compute, sync wait) of a step: local work, and time blocked on peers.

        Blocked time is the step's blocking collectives (see :func:`timeline.blocked_ns`) plus
        what DDP's timers say of its gradient sync. Collectives before the first forward (an
        FSDP root's all-gather) are part of the data wait when that was not measured.
        """
        forward, optimizer = record.forward_start_ns, record.optimizer_start_ns
        before = timeline.blocked_ns(record.collectives, record.start_ns, forward)
        inside = timeline.blocked_ns(record.collectives, forward, optimizer)
        local = record.data_wait_ns + max(0, optimizer - forward)
        idle_before = before if record.data_wait_ns >= forward - record.start_ns else 0
        compute = local - reducer_wait_ns - inside - idle_before
        return max(0, compute), reducer_wait_ns + before + inside

    def _finish_without_reducer(self, record: StepRecord) -> None:
        # No DDP timers (FSDP, a plain module, a torch without them, timers given up on): the
        # timeline's blocking collectives are the wait; without a timeline (one process), or
        # on DDP without its timers, the local work is wall time and includes any wait.
        if self._roles is None:
            self._observe_compute(
                record, record.data_wait_ns + record.forward_ns + record.backward_ns, None
            )
        else:
            self._observe_compute(record, *self._split(record, 0))
        self._finish(record, None)

    def _observe_compute(self, record: StepRecord, compute_ns: int, wait_ns: int | None) -> None:
        """One step's local work and its wait on peers (None: not known, one process), and the
        rank's recent share of local work (the fast straggler signal; :mod:`.recent`): the
        median compute of its steps of the last
        :data:`~trainguard.contract.RECENT_COMPUTE_SECONDS`, at its usual batch, over its usual
        step, the mean compute + wait of its last :data:`~trainguard.contract.USUAL_OBSERVATIONS`.

        A median, so an outlier step moves nothing and a transient shorter than half the window
        only nudges it. At the usual batch: the median of compute per input element times the
        mean input size (the median compute where the inputs keep one size); where batches vary,
        most of a rank's step-to-step spread is its batch (docs/demo.md), and a straggler would
        have to outlast that spread before the median showed it. Over the usual step, which
        every rank of a synchronous job shares: a share for the gauge, on the same footing on
        every rank. Not over the window's median step: a step lasts as long as the job's slowest
        rank, and in a large job, where most steps have some rank's outlier, that median jumps
        as they come and go, on every rank at the same step but read at different moments. A
        step that counted no inputs counts as a usual one."""
        m = self._metrics
        compute = _seconds(compute_ns)
        m.compute_duration.observe(compute)
        if wait_ns is None:
            return
        wait = _seconds(wait_ns)
        m.sync_wait_duration.observe(wait)
        inputs = float(record.input_elements) or self._usual_inputs.mean() or 1.0
        self._usual_inputs.add(inputs)
        self._usual_busy.add(compute + wait)
        self._recent_compute.add(_seconds(record.end_ns), compute / inputs)
        if not self._recent_compute.ready:  # 0 until its window has filled once
            return
        per_input, usual_inputs = self._recent_compute.median(), self._usual_inputs.mean()
        usual_step = self._usual_busy.mean()
        if usual_step and per_input is not None and usual_inputs is not None:
            m.compute_share.set(per_input * usual_inputs / usual_step)

    def _send_awaited_syncs(self) -> None:
        """The sync spans of the steps still awaiting DDP's timers, now, marked ``unread``
        (their metrics still wait for the timers)."""
        if self._spans is None:
            return
        for record in sorted(self._awaiting.values(), key=lambda r: r.step):
            if record.spans_sent and not record.sync_sent:
                with self._errors.guard("spans"):
                    self._spans.emit_sync(
                        record, None, self._sync_bytes, contract.SyncTiming.UNREAD
                    )
                    record.sync_sent = True

    def _finish(
        self,
        record: StepRecord,
        stats: ReducerStats | None,
        untimed: contract.SyncTiming = contract.SyncTiming.UNTIMED,
    ) -> None:
        """Observe the step's compute and sync and send what is left of its spans; ``untimed``:
        what a DDP sync without ``stats`` is marked."""
        m = self._metrics
        if stats is not None:
            self._observe_compute(record, *self._split(record, stats.sync_wait_ns))
            if not record.buckets:
                exemplar = {contract.EXEMPLAR_TRACE_ID: self.trace_id_hex(record.step)}
                m.grad_sync_duration.observe(_seconds(stats.comm_ns), exemplar)
                self._sync_bytes = sum(stats.bucket_bytes), len(stats.bucket_bytes)
                m.grad_sync_bytes.inc(self._sync_bytes[0])
                self.buckets_synced += self._sync_bytes[1]
        elif self._ddp_timers and not record.buckets and self._sync_bytes[1]:
            # A step DDP did not time (sampling) synced its buckets all the same: their sizes
            # change only when DDP rebuilds them, so the last timed step's are counted.
            m.grad_sync_bytes.inc(self._sync_bytes[0])
            self.buckets_synced += self._sync_bytes[1]
        if self._spans is None:
            return
        ddp_sync = self._sync_bytes if self._ddp else None
        with self._errors.guard("spans"):
            if not record.spans_sent:
                self._spans.emit(record, stats, ddp_sync=ddp_sync, untimed=untimed)
            elif not record.sync_sent:
                self._spans.emit_sync(record, stats, ddp_sync, untimed)
            record.spans_sent = record.sync_sent = True

    def trace_id_hex(self, step: int) -> str:
        return tracing.format_trace_id(tracing.trace_id_for(self._identity.job_id, step))
