"""What every analysis of one job reads and writes: :class:`Context`, and small shared helpers.

Each failure's analysis (:mod:`~trainguard.diagnose.oom`, ``straggler``, ``job_slowdown``,
``dataloader_bound``, ``hang``, ``gpu_fault``, ``gpu_throttling``, ``rank_failure``) is a
function of a :class:`Context`: it
reads the signals, the evidence from logs and dumps and the thresholds, adds symptoms and
root-cause candidates to the report, and records what a later analysis or the charts need (the
worst straggler, the first rank to run out of memory, the ranks a hang waits for) in the
context's named fields.
"""

from __future__ import annotations

import math
import statistics
import time
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime

from trainguard.contract import Cause, Failure
from trainguard.diagnose.evidence import Event, LogEvidence, StallDump
from trainguard.diagnose.model import Candidate, Report, Scope, ScopeLevel, Symptom
from trainguard.diagnose.prometheus import Series
from trainguard.diagnose.signals import Signals
from trainguard.thresholds import Thresholds
from trainguard.triage import Finding


def utc(t: float | None) -> str:
    if t is None:
        return "unknown time"
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(t))


def mean(values: list[float]) -> float | None:
    clean = [v for v in values if not math.isnan(v)]
    return sum(clean) / len(clean) if clean else None


def between(series: Series | None, start: float, end: float) -> list[float]:
    if series is None:
        return []
    return [v for t, v in series.points if start <= t <= end and not math.isnan(v)]


def before(series: Series | None, t: float) -> float | None:
    """The last value of ``series`` strictly before ``t``."""
    if series is None:
        return None
    values = [v for ts, v in series.points if ts < t and not math.isnan(v)]
    return values[-1] if values else None


def runs(flags: list[tuple[float, bool]], min_points: int) -> tuple[float, float] | None:
    """The longest run of consecutive True flags of at least ``min_points``: (start, end)."""
    best: tuple[float, float, int] | None = None
    start: float | None = None
    count = 0
    last_t = 0.0
    for t, flag in [*flags, (math.inf, False)]:
        if flag:
            if start is None:
                start, count = t, 0
            count += 1
            last_t = t
        elif start is not None:
            if count >= min_points and (best is None or count > best[2]):
                best = (start, last_t, count)
            start = None
    return None if best is None else (best[0], best[1])


def job_median(per_rank: dict[int, Series], min_ranks: int = 2) -> dict[float, float]:
    """Median over ranks at each time of the grid, where at least ``min_ranks`` report."""
    at: dict[float, list[float]] = defaultdict(list)
    for series in per_rank.values():
        for t, v in series.points:
            if not math.isnan(v):
                at[t].append(v)
    return {t: statistics.median(vs) for t, vs in sorted(at.items()) if len(vs) >= min_ranks}


def ranks_text(ranks: list[int]) -> str:
    if not ranks:
        return "no rank"
    if len(ranks) > 2 and ranks == list(range(ranks[0], ranks[-1] + 1)):
        return f"ranks {ranks[0]}-{ranks[-1]}"
    return ("rank " if len(ranks) == 1 else "ranks ") + ", ".join(map(str, ranks))


@dataclass
class Context:
    """One job's inputs, the report being built, and what the analyses found so far."""

    sig: Signals
    report: Report
    thresholds: Thresholds
    logs: LogEvidence = field(default_factory=LogEvidence)
    dumps: list[StallDump] = field(default_factory=list)
    # (when, action) of each repair the remediation service carried out on the job (from the
    # incidents given to diagnose): what a restart right after one is explained by.
    repairs: list[tuple[float, str]] = field(default_factory=list)
    # Set by straggler.analyse: the slowest straggler and when it straggled.
    worst_rank: int | None = None
    worst_window: tuple[float, float] | None = None
    # Set by oom.analyse: the first rank to run out of memory.
    oom_rank: int | None = None
    # Set by hang.analyse: the ranks the others wait for.
    stall_ranks: list[int] = field(default_factory=list)
    # (severity, scope) of every symptom; the report's scope is the most severe one's.
    scopes: list[tuple[int, Scope]] = field(default_factory=list)

    # --- building the report ------------------------------------------------------------
    def symptom(self, symptom: Symptom, scope: Scope, *, first: bool = False) -> None:
        """Add a symptom; ``first`` puts it before the others of its severity (the report is
        ordered by severity alone, earlier symptoms first among equals)."""
        at = 0 if first else len(self.report.symptoms)
        self.report.symptoms.insert(at, symptom)
        self.scopes.insert(at if first else len(self.scopes), (symptom.severity, scope))

    def consequence(self, symptom: Symptom, of: str) -> None:
        """Mark a symptom reported earlier as the consequence of another (``of`` says which):
        degraded at most, its scope ranked with it."""
        index = next(i for i, s in enumerate(self.report.symptoms) if s is symptom)
        symptom.severity = min(symptom.severity, 2)
        symptom.summary += f" ({of})"
        self.scopes[index] = (symptom.severity, self.scopes[index][1])

    def candidate(self, candidate: Candidate) -> None:
        self.report.candidates.append(candidate)

    def has_cause(self, *causes: Cause) -> bool:
        return any(c.cause in causes for c in self.report.candidates)

    def has_symptom(self, *failures: Failure) -> bool:
        return any(s.failure in failures for s in self.report.symptoms)

    # --- evidence from logs -------------------------------------------------------------
    def findings(self, failure: Failure) -> list[Finding]:
        """triage's findings of one failure in the logs."""
        return [f for f in self.logs.findings if f.failure is failure]

    def events(self, *kinds: str) -> list[Event]:
        """The hook's events of these kinds (``contract.EventKind`` values)."""
        return [e for e in self.logs.events if e.kind in kinds]

    def first_event_at(self, *kinds: str) -> float | None:
        """When the hook first logged an event of these kinds within the window (its ECS
        timestamp, to the millisecond: a symptom's first evidence, where a counter shows it a
        scrape later)."""
        times = [t for e in self.events(*kinds) if (t := self.event_time(e)) is not None]
        return min(times, default=None)

    def event_time(self, event: Event) -> float | None:
        """An event's ECS timestamp, if it is one and within the window."""
        try:
            stamp = datetime.fromisoformat(event.timestamp.replace("Z", "+00:00")).timestamp()
        except ValueError:
            return None
        return stamp if self.sig.start <= stamp <= self.sig.end else None

    # --- signals ------------------------------------------------------------------------
    @property
    def min_points(self) -> int:
        """Grid points a condition must hold for to count (``sig.sustain_seconds``)."""
        return max(3, math.ceil(self.sig.sustain_seconds / self.sig.step))

    def ranks_on_gpu(self, node: str, gpu: str) -> list[int]:
        sig = self.sig
        return [
            r for r in sig.ranks_on(node) if sig.gpu_of_rank.get(r) in (gpu, None, "")
        ] or sig.ranks_on(node)

    def stopped(self, rank: int) -> float | None:
        """When a rank's series ended, if it stopped reporting before the window's end."""
        sig = self.sig
        last = [
            s.points[-1][0]
            for s in (sig.compute.get(rank), sig.last_step.get(rank))
            if s is not None and s.points
        ]
        if not last or max(last) >= sig.end - 3 * sig.step:
            return None
        # Range queries repeat a vanished series' last sample for 5 minutes (staleness); the
        # rank's own last-step timestamp says when it really stopped.
        stamps = sig.last_step[rank].values() if rank in sig.last_step else []
        return max(stamps) if stamps else max(last)

    def rank_scope(self, ranks: list[int], why: str) -> Scope:
        sig = self.sig
        nodes = sorted({sig.node_of(r) for r in ranks if sig.node_of(r)})
        if len(nodes) == 1 and len(ranks) > 1 and sorted(ranks) == sig.ranks_on(nodes[0]):
            return Scope(ScopeLevel.NODE, f"every rank of node {nodes[0]}: {why}", ranks, nodes)
        if not ranks:
            return Scope(ScopeLevel.JOB, f"the whole job ({why})")
        return Scope(
            ScopeLevel.RANK,
            f"{ranks_text(ranks)} on {', '.join(nodes) or 'an unknown node'}: {why}",
            ranks,
            nodes,
            [sig.gpu_of_rank[r] for r in ranks if sig.gpu_of_rank.get(r)],
        )
