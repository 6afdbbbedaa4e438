"""Hangs: a collective that never completes (HANG) or that the NCCL watchdog aborted
(NCCL_TIMEOUT), and the rank the others wait for.

The rank is named by torch's Flight Recorder analyzer over the dumps when there are any, else
by the collective counts (the rank that launched the fewest), else by the rank whose series
ended (it died), else by triage's reading of the NCCL watchdog's log lines.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from trainguard import contract
from trainguard.contract import Cause, EventKind, Failure
from trainguard.diagnose.analysis import explains
from trainguard.diagnose.context import Context, ranks_text, utc
from trainguard.diagnose.evidence import Mismatch, StallDump
from trainguard.diagnose.job_slowdown import socket_nodes
from trainguard.diagnose.model import Candidate, Scope, ScopeLevel, Setting, Symptom
from trainguard.diagnose.prevent import ENV, SCRIPT, prevents
from trainguard.diagnose.signals import increments

# An adaptive collective timeout: this many times the slowest 0.1% of gradient syncs, and
# never under the floor. Diagnose's own advice: the rules have no such threshold.
TIMEOUT_MULTIPLIER = 10.0
TIMEOUT_FLOOR_SECONDS = 60.0

_HANG_EVENTS = (EventKind.COLLECTIVE_STALLED.value, EventKind.COLLECTIVE_TIMEOUT.value)


@dataclass
class _Seen:
    """What the signals and evidence say about a possible hang."""

    threshold: float
    peak_rank: int | None = None
    peak_age: float = 0.0
    peak_t: float | None = None
    stalls: bool = False
    timeouts: bool = False
    events: list[str] = field(default_factory=list)  # kinds of the hook's hang events
    mismatches: list[tuple[StallDump, Mismatch]] = field(default_factory=list)
    nccl_logs: bool = False

    @property
    def any(self) -> bool:
        return bool(
            self.peak_age > self.threshold
            or self.stalls
            or self.timeouts
            or self.events
            or self.mismatches
            or self.nccl_logs
        )

    def signals(self) -> list[str]:
        out = []
        if self.peak_age:
            out.append(contract.COLLECTIVE_OLDEST_INFLIGHT.name)
        if self.stalls:
            out.append(contract.COLLECTIVE_STALLS.name)
        if self.timeouts:
            out.append(contract.COLLECTIVE_TIMEOUTS.name)
        if self.events:
            out.append("hook events: " + ", ".join(sorted(set(self.events))))
        if self.mismatches:
            out.append("Flight Recorder dumps")
        if self.nccl_logs:
            out.append("NCCL watchdog timeout in logs")
        return out


def _seen(ctx: Context) -> _Seen:
    sig = ctx.sig
    floor = ctx.thresholds.collective_stall_floor_seconds
    seen = _Seen((sig.stall_threshold.last() if sig.stall_threshold else None) or floor)
    for rank, s in sig.oldest_inflight.items():
        for t, v in s.points:
            if v > seen.peak_age:
                seen.peak_rank, seen.peak_age, seen.peak_t = rank, v, t
    seen.stalls = any(increments(s) for s in sig.stalls.values())
    seen.timeouts = any(increments(s) for s in sig.timeouts.values())
    seen.events = [e.kind for e in ctx.events(*_HANG_EVENTS)]
    seen.mismatches = [(d, m) for d in ctx.dumps for m in d.mismatches]
    seen.nccl_logs = bool(ctx.findings(Failure.NCCL_TIMEOUT))
    return seen


@explains(Failure.HANG, Failure.NCCL_TIMEOUT, after=(Failure.GPU_FAULT,))
def analyse(ctx: Context) -> None:
    """A collective hang (HANG), or NCCL_TIMEOUT when a collective timed out."""
    seen = _seen(ctx)
    if not seen.any:
        return
    sig = ctx.sig
    since = _began(ctx, seen)
    laggard = _laggard(ctx)
    suspects = _suspects(ctx, seen, laggard)
    ctx.stall_ranks = suspects
    failure = Failure.NCCL_TIMEOUT if (seen.timeouts or seen.nccl_logs) else Failure.HANG
    what = (
        f"the oldest in-flight collective reached {seen.peak_age:.0f} s "
        f"(threshold {seen.threshold:.0f} s) on rank {seen.peak_rank}"
        if seen.peak_age
        else "collectives stopped completing"
    )
    repair = _repair_before(ctx, since if since is not None else ctx.first_event_at(*_HANG_EVENTS))
    if repair is not None:
        # The survivors of a node the service took away, or of a restart it signalled, wait in
        # their collective until the others are gone: the repair's teardown, not a hang.
        _repair_teardown(ctx, what, since, repair, seen.signals())
        return
    ctx.symptom(
        Symptom(
            failure,
            f"Collective hang: {what}",
            seen.signals(),
            since,
            suspects,
            sorted({sig.node_of(r) for r in suspects if sig.node_of(r)}),
            3,
        ),
        ctx.rank_scope(
            suspects,
            "the rank(s) the others wait for; the rest of the job is blocked in the "
            "collective, not broken",
        ),
    )
    _candidate(ctx, bool(seen.mismatches), laggard, suspects, seen.threshold)


# A stall that begins at most this long after one of the service's repairs (or a few seconds
# before it: the scrape) is that repair's teardown.
TEARDOWN_SECONDS = 30.0
_TEARDOWN_LEAD = 5.0
_TEARING_DOWN = (contract.Action.EXCLUDE_NODE.value, contract.Action.RESTART_FROM_CHECKPOINT.value)


def _began(ctx: Context, seen: _Seen) -> float | None:
    """When the stalled collective began: the hook's own report of it (its stall event's time
    less the collective's age then, both read together) where it made one, else the peak of
    the oldest in-flight collective's age less that age (a scrape and a watchdog turn later)."""
    starts = []
    for event in ctx.events(EventKind.COLLECTIVE_STALLED.value):
        at, age = ctx.event_time(event), event.details.get("age_seconds")
        if at is not None and isinstance(age, (int, float)):
            starts.append(at - age)
    if seen.peak_t is not None and seen.peak_age:
        starts.append(seen.peak_t - seen.peak_age)
    return min(starts, default=None)


def _repair_before(ctx: Context, start: float | None) -> str | None:
    """The repair (exclude, restart) of the service whose teardown a stall starting at
    ``start`` is, if any."""
    if start is None:
        return None
    for at, action in ctx.repairs:
        if action in _TEARING_DOWN and at - _TEARDOWN_LEAD <= start <= at + TEARDOWN_SECONDS:
            return action
    return None


def _repair_teardown(
    ctx: Context, what: str, since: float | None, repair: str, signals: list[str]
) -> None:
    summary = (
        f"Collectives waited while the remediation service's {repair} took ranks away ({what}): "
        "the repair's teardown, not a hang"
    )
    ctx.symptom(
        Symptom(Failure.HANG, summary, signals, since, [], [], 1),
        Scope(ScopeLevel.JOB, "the job, while it was being repaired"),
    )


def _suspects(ctx: Context, seen: _Seen, laggard: int | None) -> list[int]:
    suspects: list[int] = sorted({r for _, m in seen.mismatches for r in m.missing_ranks})
    if not suspects and laggard is not None:
        suspects = [laggard]
    if not suspects:
        # A rank that died (its series end) is what the others wait for.
        suspects = [r.rank for r in ctx.sig.ranks if ctx.stopped(r.rank) is not None]
    if not suspects:
        for finding in ctx.findings(Failure.NCCL_TIMEOUT):
            never = finding.fields.get("laggard_ranks")
            if isinstance(never, list):
                suspects = sorted(int(r) for r in never if str(r).isdigit())
    return suspects


def _laggard(ctx: Context) -> int | None:
    """The rank that launched the fewest collectives, when the counts differ."""
    latest = {r: v for r, s in ctx.sig.launched.items() if (v := s.last()) is not None}
    if len(set(latest.values())) <= 1:
        return None
    # The recording rule also prefers, among equal counts, the rank with nothing in flight.
    recorded = [s for s in ctx.sig.laggard if s.points and s.label(contract.LABEL_RANK)]
    if recorded:
        newest = max(recorded, key=lambda s: s.points[-1][0])
        if newest.label(contract.LABEL_RANK).isdigit():
            return int(newest.label(contract.LABEL_RANK))
    return min(latest, key=lambda r: (latest[r], r))


def adaptive_timeout(ctx: Context) -> tuple[float, str] | None:
    """A process-group timeout from the observed gradient-sync tail, and why."""
    p999 = ctx.sig.grad_sync_p999_seconds
    if p999 is None or p999 <= 0:
        return None
    timeout = max(TIMEOUT_FLOOR_SECONDS, math.ceil(TIMEOUT_MULTIPLIER * p999 / 10) * 10)
    return timeout, (
        f"the slowest 0.1% of gradient syncs took {p999:.3g} s in this window; "
        f"{TIMEOUT_MULTIPLIER:g}x that, at least {TIMEOUT_FLOOR_SECONDS:g} s, is "
        f"{timeout:.0f} s"
    )


def _dump_evidence(ctx: Context, suspects: list[int], facts: dict[str, object]) -> list[str]:
    """What the Flight Recorder analyzer and the stack dumps say; the first mismatch's
    collective goes into ``facts``."""
    evidence: list[str] = []
    for dump in ctx.dumps:
        found = sorted(dump.mismatches, key=lambda m: m.collective_seq_id)
        if not found:
            continue
        m = found[0]
        later = [x.collective_seq_id for x in found[1:]]
        evidence.append(
            f"torch's Flight Recorder analyzer over {dump.folder} (ranks "
            f"{dump.ranks_dumped} dumped): collective #{m.collective_seq_id} "
            f"{m.name} of process group {m.process_group} never joined by "
            f"{ranks_text(m.missing_ranks)}"
            + (
                f"; {len(later)} later collective(s) (#{later[0]}-#{later[-1]}) queued behind it"
                if later
                else ""
            )
        )
        facts.setdefault("collective_seq_id", m.collective_seq_id)
        facts.setdefault("collective", m.name)
        facts.setdefault("process_group", m.process_group)
    for dump in ctx.dumps:
        if dump.error:
            ctx.report.notes.append(dump.error)
        for rank in suspects:
            if dump.stacks.get(rank):
                evidence.append(
                    f"main-thread stack of rank {rank} at the stall ({dump.folder}):\n"
                    f"```\n{dump.stacks[rank]}\n```"
                )
    return evidence


def _other_evidence(ctx: Context, laggard: int | None) -> list[str]:
    """The collective counts, the first hook event and triage's NCCL timeout findings."""
    evidence: list[str] = []
    if laggard is not None:
        counts = {r: s.last() or 0.0 for r, s in ctx.sig.launched.items()}
        own, most = counts.get(laggard, 0.0), max(counts.values())
        evidence.append(
            f"rank {laggard} launched the fewest collectives ({own:.0f} vs up to {most:.0f})"
            if own < most
            else f"rank {laggard} had no collective in flight while others waited in one "
            f"(it launched {own:.0f}, as many as any rank)"
        )
    for event in ctx.events(*_HANG_EVENTS)[:1]:
        evidence.append(f"event {event.kind} from rank {event.rank}: {event.message}")
    evidence += [f"log: {f.summary}" for f in ctx.findings(Failure.NCCL_TIMEOUT)]
    return evidence


def _do_now(ctx: Context, suspects: list[int], evidence: list[str]) -> list[str]:
    do_now = [
        "Restart the job from its last checkpoint (torchrun elastic restarts the worker "
        "group; trainguard-remediation does it for TrainingCollectiveStalled)."
    ]
    dead = [r for r in suspects if ctx.stopped(r) is not None]
    if dead:
        evidence += [f"rank {r} stopped reporting at {utc(ctx.stopped(r))}" for r in dead]
        do_now.insert(
            0,
            f"{ranks_text(dead).capitalize()} died: the others wait for it in the "
            "collective. Find why (its log's last lines, its node's faults above).",
        )
    elif suspects:
        stacks = any(d.stacks.get(r) for d in ctx.dumps for r in suspects)
        do_now.insert(
            0,
            f"Look at what {ranks_text(suspects)} was doing"
            + (" (its stack above)" if stacks else " (py-spy dump --pid, or the hook's stacks)")
            + ": a rank stuck outside the collective (data loading, checkpoint I/O, a branch "
            "the others did not take) is a code path, not the network.",
        )
    return do_now


def _prevention(ctx: Context, facts: dict[str, object]) -> list[str]:
    """Practices; the settings (timeout, NCCL error handling, Flight Recorder) are the
    Prevent section's (:mod:`trainguard.diagnose.prevent`), from ``facts``."""
    timeout = adaptive_timeout(ctx)
    if timeout is not None:
        facts["recommended_timeout_seconds"] = timeout[0]
    return [
        "Keep trainguard's collective watchdog on and its dump folder where diagnose can read "
        "it: it flags a stall long before NCCL's timeout and dumps every rank's stack."
    ]


def _summary(suspects: list[int], facts: dict[str, object]) -> str:
    if not suspects:
        return "A collective stalled; the rank it waits for is unknown"
    if "collective_seq_id" in facts:
        return (
            f"{ranks_text(suspects).capitalize()} never joined collective "
            f"#{facts['collective_seq_id']} ({facts['collective']})"
        )
    return f"The job waits in a collective for {ranks_text(suspects)}"


def _candidate(
    ctx: Context, dumped: bool, laggard: int | None, suspects: list[int], threshold: float
) -> None:
    facts: dict[str, object] = {"suspect_ranks": suspects}
    evidence = _dump_evidence(ctx, suspects, facts) + _other_evidence(ctx, laggard)
    do_now = _do_now(ctx, suspects, evidence)
    prevention = _prevention(ctx, facts)
    node_faults = [
        c
        for c in ctx.report.candidates
        if c.cause in (Cause.GPU_XID, Cause.GPU_ECC_UNCORRECTABLE)
        and set(c.facts.get("ranks", [])) & set(suspects)
    ]
    confidence = 0.9 if dumped else (0.7 if laggard is not None else 0.4)
    if node_faults:
        confidence = min(confidence, 0.6)
    ctx.candidate(
        Candidate(
            Cause.RANK_NEVER_JOINED,
            _summary(suspects, facts),
            confidence,
            evidence or [f"oldest in-flight collective past {threshold:.0f} s"],
            do_now,
            prevention,
            facts,
        )
    )


# --- prevention -------------------------------------------------------------------------------
def _timed_out(ctx: Context) -> Failure:
    """A rank that never joined is an NCCL timeout once NCCL's watchdog fired, else a hang."""
    return Failure.NCCL_TIMEOUT if ctx.has_symptom(Failure.NCCL_TIMEOUT) else Failure.HANG


@prevents(Cause.RANK_NEVER_JOINED, answers=_timed_out)
def _hang_settings(ctx: Context, c: Candidate) -> list[Setting]:
    settings = []
    timeout = adaptive_timeout(ctx)
    if timeout is not None:
        settings.append(
            Setting(
                "init_process_group(timeout=...)",
                f"timedelta(seconds={timeout[0]:.0f})",
                SCRIPT,
                [timeout[1] + ", instead of NCCL's default 10 min"],
            )
        )
    peak = max((v for s in ctx.sig.oldest_inflight.values() for v in s.values()), default=0.0)
    settings.append(
        Setting(
            "TORCH_NCCL_ASYNC_ERROR_HANDLING",
            "3",
            ENV,
            [
                f"a collective stayed in flight {peak:.0f} s (oldest in-flight collective)"
                if peak
                else "collectives stopped completing",
                "on a timeout the process must exit (3, torch >= 2.2's default; never 0) so "
                "torchrun restarts the group instead of waiting in NCCL's teardown",
            ],
        )
    )
    dumps = [d for d in ctx.dumps if d.mismatches]
    dumped = (
        f"this hang's Flight Recorder dumps ({len(dumps)} folder(s)) named "
        f"{ranks_text(ctx.stall_ranks)} as the rank that never joined"
        if dumps
        else "no Flight Recorder dump was read for this hang, so the rank the others wait for "
        + (
            f"was named from weaker signals ({ranks_text(ctx.stall_ranks)})"
            if ctx.stall_ranks
            else "is unknown"
        )
    )
    settings += [
        Setting("TORCH_NCCL_DUMP_ON_TIMEOUT", "1", ENV, [dumped]),
        Setting(
            "TORCH_FR_BUFFER_SIZE",
            "2000",
            ENV,
            ["the Flight Recorder keeps this many collectives per rank for the dump"],
        ),
    ]
    sockets = socket_nodes(ctx)
    if sockets:
        settings.append(
            Setting(
                "NCCL_IB_HCA",
                "the nodes' InfiniBand HCAs (e.g. mlx5), with NCCL_IB_DISABLE unset",
                ENV,
                [
                    f"{contract.NCCL_INFO.name} shows the TCP socket transport on "
                    f"{', '.join(sockets)}: collectives over sockets are slower and time out "
                    "first"
                ],
            )
        )
    return settings
