"""The collective watchdog: notices a hang long before NCCL's own timeout, at no per-step cost.

A daemon thread wakes every ``interval`` seconds and compares the time since the last step
ended (the step in progress, or whatever the training loop does between steps) with how long
recent steps took. Only when that runs suspiciously long does it ask the
Flight Recorder which collectives are pending and how old the oldest is; the gauges
``collective_inflight`` and ``collective_oldest_inflight_seconds`` report that (0 otherwise).
When the oldest passes the stall threshold — ``max(floor, factor x slowest recent step)``, so
it adapts to the job — it logs one ``collective_stalled`` event per stalled step, dumps
this rank's Flight Recorder trace and every thread's stack, and raises a flag in the job's
c10d store so that every other rank, including the one that never joined, dumps too. The
folder then holds one dump per rank, which torch's analyzer turns into "rank N never joined
collective S". Each rank that dumps also hands its stalled step to ``on_stall`` (the hook exports
its spans then: the step may never end, and the job may soon be killed).
"""

from __future__ import annotations

import collections
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trainguard import contract
from trainguard.background import BackgroundThread
from trainguard.events import log_event
from trainguard.instrumentation import flight_recorder
from trainguard.instrumentation.config import Identity
from trainguard.instrumentation.errors import ErrorBudget
from trainguard.instrumentation.metrics import RankMetrics

logger = logging.getLogger("trainguard.instrumentation")

STORE_KEY_PREFIX = "trainguard/stall/"
# A step is only inspected once it has run this many times longer than the slowest recent one.
SUSPICION_FACTOR = 2.0
MIN_SUSPICION_SECONDS = 0.5
RECENT_STEPS = 32
# What a rank that dumps on another's report says of the collective (it may have none pending).
PEER_REPORTED = "reported by a peer"


@dataclass(frozen=True)
class StallReport:
    """A step the watchdog found stalled, as it reported it (``perf_counter_ns`` times)."""

    step: int
    started_ns: int
    reported_ns: int
    collective: str
    seq: int | None
    process_group: str
    age_seconds: float
    dump_dir: str


@dataclass
class StepClock:
    """What the training thread tells the watchdog: plain attribute stores, no locks.

    ``started_ns`` is the ``perf_counter_ns`` since which the rank has not finished a step: the
    end of the previous step, during a step and between steps alike (0 before the first step);
    ``recent`` holds the durations of the last steps in seconds.
    """

    started_ns: int = 0
    step: int = 0

    def __post_init__(self) -> None:
        self.recent: collections.deque[float] = collections.deque(maxlen=RECENT_STEPS)


class CollectiveWatchdog(BackgroundThread):
    def __init__(
        self,
        *,
        identity: Identity,
        metrics: RankMetrics,
        errors: ErrorBudget,
        clock: StepClock,
        dump_dir: Path,
        stall_floor_seconds: float,
        stall_factor: float,
        interval_seconds: float,
        store: Any | None,
        read_state: Callable[[], dict[str, Any]] = flight_recorder.read_state,
        on_stall: Callable[[StallReport], None] | None = None,
    ) -> None:
        super().__init__("trainguard-watchdog")
        self._identity = identity
        self._metrics = metrics
        self._errors = errors
        self._clock = clock
        self._dump_dir = dump_dir / identity.job_id
        self._floor = stall_floor_seconds
        self._factor = stall_factor
        self._interval = interval_seconds
        self._store = store
        self._read_state = read_state
        self._on_stall_report = on_stall
        self._reported: set[str] = set()  # stall ids this rank has already handled
        self._stalled_step: int | None = None  # the step of this rank's last reported stall
        self._timed_out: set[int] = set()
        self.dumps: list[Path] = []

    @property
    def store_key(self) -> str:
        return STORE_KEY_PREFIX + self._identity.job_id

    def stop(self, timeout: float | None = None) -> None:
        super().stop(5 * self._interval + 5 if timeout is None else timeout)

    def stall_threshold(self) -> float:
        slowest = max(self._clock.recent, default=0.0)
        return max(self._floor, self._factor * slowest)

    def run(self) -> None:
        while not self.sleep(self._interval):
            with self._errors.guard("watchdog"):
                self.check()

    def check(self) -> None:
        """One look: update the gauges, detect a stall, answer other ranks' stall flags."""
        pending = flight_recorder.NOTHING_PENDING
        started = self._clock.started_ns
        if started:
            age = (time.perf_counter_ns() - started) / 1e9
            slowest = max(self._clock.recent, default=0.0)
            if age > max(MIN_SUSPICION_SECONDS, SUSPICION_FACTOR * slowest):
                pending = flight_recorder.pending_collectives(self._read_state(), time.time_ns())
        self._metrics.collective_inflight.set(pending.count)
        self._metrics.collective_oldest_inflight.set(pending.oldest_age_seconds)
        if pending.count and pending.oldest_age_seconds > self.stall_threshold():
            self._on_stall(pending)
        self._check_timeout(pending)
        self._answer_peers()

    def _check_timeout(self, pending: flight_recorder.PendingCollectives) -> None:
        timeout = pending.oldest_timeout_seconds
        seq = pending.oldest_seq
        late = timeout is not None and pending.oldest_age_seconds > timeout
        if late and seq is not None and seq not in self._timed_out:
            self._timed_out.add(seq)
            self._metrics.collective_timeouts.inc()
            log_event(
                f"collective {pending.oldest_name} #{seq} on process group {pending.oldest_group} "
                f"ran past its {timeout:.0f}s timeout",
                contract.EventKind.COLLECTIVE_TIMEOUT,
                job_id=self._identity.job_id,
                rank=self._identity.rank,
                node=self._identity.node,
                step=self._clock.step,
                outcome=contract.EventOutcome.FAILURE,
                details={
                    "collective_seq_id": seq,
                    "process_group": pending.oldest_group,
                    "timeout_seconds": timeout,
                },
            )

    def _on_stall(self, pending: flight_recorder.PendingCollectives) -> None:
        stall_id = f"seq{pending.oldest_seq}" if pending.oldest_seq is not None else "unknown"
        # One report per stalled step: once the stalled collective completes, the dumps its
        # report set off on every rank can hold the step's next collective past the floor (the
        # slow step is not yet among the recent ones the threshold scales with); that wait is
        # the same incident, not a second one.
        if stall_id in self._reported or self._stalled_step == self._clock.step:
            return
        self._stalled_step = self._clock.step
        self._metrics.collective_stalls.inc()
        folder = self._dump(stall_id)
        log_event(
            f"collective {pending.oldest_name} #{pending.oldest_seq} on process group "
            f"{pending.oldest_group} has been in flight for "
            f"{pending.oldest_age_seconds:.1f}s (threshold {self.stall_threshold():.1f}s); "
            f"Flight Recorder dumps in {folder}",
            contract.EventKind.COLLECTIVE_STALLED,
            **self._identity.event_fields(),
            step=self._clock.step,
            outcome=contract.EventOutcome.FAILURE,
            details={
                "collective_seq_id": pending.oldest_seq,
                "collective": pending.oldest_name,
                "process_group": pending.oldest_group,
                "age_seconds": pending.oldest_age_seconds,
                "inflight": pending.count,
                "dump_dir": str(folder),
            },
        )
        if self._store is not None:
            with self._errors.guard("watchdog_store"):
                self._store.set(self.store_key, stall_id)
        self._report(
            pending.oldest_name or "unknown",
            pending.oldest_seq,
            pending.oldest_group or "",
            pending.oldest_age_seconds,
            folder,
        )

    def _report(
        self, collective: str, seq: int | None, group: str, age: float, folder: Path
    ) -> None:
        if self._on_stall_report is None:
            return
        report = StallReport(
            step=self._clock.step,
            started_ns=self._clock.started_ns,
            reported_ns=time.perf_counter_ns(),
            collective=collective,
            seq=seq,
            process_group=group,
            age_seconds=age,
            dump_dir=str(folder),
        )
        with self._errors.guard("stall_spans"):
            self._on_stall_report(report)

    def _answer_peers(self) -> None:
        """Dump when another rank flagged a stall (the rank that never joined must dump too)."""
        if self._store is None:
            return
        with self._errors.guard("watchdog_store"):
            if not self._store.check([self.store_key]):
                return
            stall_id = self._store.get(self.store_key).decode()
            if stall_id not in self._reported:
                folder = self._dump(stall_id)
                logger.warning(
                    "trainguard: a peer reported stalled collective %s; dumped rank %d to %s",
                    stall_id,
                    self._identity.rank,
                    folder,
                )
                started = self._clock.started_ns
                age = (time.perf_counter_ns() - started) / 1e9 if started else 0.0
                self._report(PEER_REPORTED, None, "", age, folder)

    def _dump(self, stall_id: str) -> Path:
        self._reported.add(stall_id)
        folder = self._dump_dir / f"stall-{stall_id}"
        with self._errors.guard("flight_recorder_dump"):
            self.dumps.append(flight_recorder.write_dump(folder, self._identity.rank))
        with self._errors.guard("stack_dump"):
            self.dumps.append(flight_recorder.write_stacks(folder, self._identity.rank))
        return folder
