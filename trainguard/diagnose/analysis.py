"""From signals and evidence to symptoms, scope and ranked root-cause candidates.

Each detector looks at one failure the way an on-call engineer would: stragglers by compute
time against the job median (step time is equal on every rank of a synchronous job), then the
slow phase and what the GPUs of the same node did at the same time; OOMs by the memory curve
before the error (fragmentation, growth, or a step that never fit); hangs by the oldest
in-flight collective, the collective counts, and torch's Flight Recorder analyzer over the
dumps; GPU faults by Xid and ECC counters. Thresholds come from the rules' ``thresholds.yml``
so the report and the alerts agree on what "slow" means.
"""

from __future__ import annotations

import math
import statistics
import time
from collections import defaultdict
from dataclasses import dataclass

from trainguard import contract
from trainguard.diagnose.evidence import LogEvidence, Mismatch, StallDump
from trainguard.diagnose.model import Candidate, Failure, Report, Scope, ScopeLevel, Symptom
from trainguard.diagnose.prometheus import Series
from trainguard.diagnose.signals import (
    THROTTLE_REASONS_HARMFUL,
    Signals,
    increments,
    thresholds,
)
from trainguard.triage import Category, Finding
from trainguard.triage.xid import lookup as xid_lookup

DATA_WAIT_RATIO = 0.3
JOB_SLOWDOWN_FACTOR = 1.3
FRAGMENTATION_RATIO = 0.25
MEMORY_GROWTH = 1.2
NEAR_CAPACITY = 0.85
# An adaptive collective timeout: this many times the slowest 0.1% of gradient syncs.
TIMEOUT_MULTIPLIER = 10.0
TIMEOUT_FLOOR_SECONDS = 60.0

PHASE_ORDER = ("data", "forward", "backward", "optimizer", "sync_wait")


def utc(t: float | None) -> str:
    if t is None:
        return "unknown time"
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(t))


def _mean(values: list[float]) -> float | None:
    clean = [v for v in values if not math.isnan(v)]
    return sum(clean) / len(clean) if clean else None


def _between(series: Series | None, start: float, end: float) -> list[float]:
    if series is None:
        return []
    return [v for t, v in series.points if start <= t <= end and not math.isnan(v)]


def _before(series: Series | None, t: float) -> float | None:
    """The last value of ``series`` strictly before ``t``."""
    if series is None:
        return None
    values = [v for ts, v in series.points if ts < t and not math.isnan(v)]
    return values[-1] if values else None


def _runs(flags: list[tuple[float, bool]], min_points: int) -> tuple[float, float] | None:
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


@dataclass
class _Straggler:
    rank: int
    since: float
    until: float
    ratio: float


def _min_points(sig: Signals) -> int:
    return max(3, math.ceil(sig.sustain_seconds / sig.step))


def job_median(per_rank: dict[int, Series]) -> dict[float, float]:
    """Median over ranks at each time of the grid."""
    at: dict[float, list[float]] = defaultdict(list)
    for series in per_rank.values():
        for t, v in series.points:
            if not math.isnan(v):
                at[t].append(v)
    return {t: statistics.median(vs) for t, vs in sorted(at.items()) if len(vs) >= 2}


def find_stragglers(sig: Signals) -> list[_Straggler]:
    factor = thresholds().straggler_factor
    median = job_median(sig.compute)
    out = []
    for rank, series in sig.compute.items():
        ratios = [(t, v / median[t]) for t, v in series.points if median.get(t, 0) > 0]
        run = _runs([(t, r >= factor) for t, r in ratios], _min_points(sig))
        if run is None:
            continue
        within = [r for t, r in ratios if run[0] <= t <= run[1]]
        out.append(_Straggler(rank, run[0], run[1], statistics.median(within)))
    return sorted(out, key=lambda s: -s.ratio)


def phase_breakdown(sig: Signals, rank: int, start: float, end: float) -> dict[str, float]:
    """Mean seconds per phase of one rank's steps; backward is compute time less data and
    forward (the backward phase also holds the wait on peers, reported as sync_wait)."""
    phases = sig.phases.get(rank, {})
    out: dict[str, float] = {}
    for name in ("data", "forward", "optimizer"):
        value = _mean(_between(phases.get(name), start, end))
        if value is not None:
            out[name] = value
    compute = _mean(_between(sig.compute.get(rank), start, end))
    if compute is not None and phases:
        out["backward"] = max(0.0, compute - out.get("data", 0.0) - out.get("forward", 0.0))
    elif (backward := _mean(_between(phases.get("backward"), start, end))) is not None:
        out["backward"] = backward
    wait = _mean(_between(sig.sync_wait.get(rank), start, end))
    if wait is not None:
        out["sync_wait"] = wait
    return {name: out[name] for name in PHASE_ORDER if name in out}


def median_breakdown(sig: Signals, ranks: list[int], start: float, end: float) -> dict[str, float]:
    per_rank = [phase_breakdown(sig, r, start, end) for r in ranks]
    out = {}
    for name in PHASE_ORDER:
        values = [b[name] for b in per_rank if name in b]
        if values:
            out[name] = statistics.median(values)
    return out


@dataclass
class _Window:
    node: str
    gpu: str
    what: str
    since: float
    until: float


def throttling(sig: Signals) -> list[_Window]:
    out = []
    for s in sig.throttled:
        reason = s.label(contract.LABEL_REASON)
        if not any(word in reason.lower() for word in THROTTLE_REASONS_HARMFUL):
            continue
        run = _runs([(t, v >= 1) for t, v in s.points], _min_points(sig))
        if run is not None:
            out.append(
                _Window(s.label(contract.LABEL_NODE), s.label(contract.LABEL_GPU), reason, *run)
            )
    return out


def _max_temperature(sig: Signals, node: str, gpu: str) -> float | None:
    values = [
        v
        for s in sig.temperature
        if s.label(contract.LABEL_NODE) == node and s.label(contract.LABEL_GPU) == gpu
        for v in s.values()
    ]
    return max(values) if values else None


def _ranks_text(ranks: list[int]) -> str:
    if not ranks:
        return "no rank"
    if len(ranks) > 2 and ranks == list(range(ranks[0], ranks[-1] + 1)):
        return f"ranks {ranks[0]}-{ranks[-1]}"
    return ("rank " if len(ranks) == 1 else "ranks ") + ", ".join(map(str, ranks))


class Diagnosis:
    """Builds a :class:`Report` from the signals and evidence of one job."""

    def __init__(
        self,
        sig: Signals,
        logs: LogEvidence | None,
        dumps: list[StallDump],
        report: Report,
    ) -> None:
        self.sig = sig
        self.logs = logs or LogEvidence()
        self.dumps = dumps
        self.report = report
        self.worst_rank: int | None = None
        self.worst_window: tuple[float, float] | None = None  # when the worst rank straggled
        self.oom_rank: int | None = None
        self.stall_ranks: list[int] = []
        self._scopes: list[tuple[int, Scope]] = []

    def run(self) -> Report:
        self._gpu_faults()
        self._stall()
        self._oom()
        self._straggler()
        self._dataloader()
        self._job_slowdown()
        self._throttling_alone()
        r = self.report
        r.symptoms.sort(key=lambda s: -s.severity)
        r.candidates.sort(key=lambda c: -c.confidence)
        if self._scopes:
            r.scope = max(self._scopes, key=lambda item: item[0])[1]
        return r

    def _symptom(self, symptom: Symptom, scope: Scope) -> None:
        self.report.symptoms.append(symptom)
        self._scopes.append((symptom.severity, scope))

    # --- GPU hardware -------------------------------------------------------------------
    def _ranks_on_gpu(self, node: str, gpu: str) -> list[int]:
        return [
            r for r in self.sig.ranks_on(node) if self.sig.gpu_of_rank.get(r) in (gpu, None, "")
        ] or self.sig.ranks_on(node)

    def _stopped(self, rank: int) -> float | None:
        """When a rank's series ended, if it stopped reporting before the window's end."""
        last = [
            s.points[-1][0]
            for s in (self.sig.compute.get(rank), self.sig.last_step.get(rank))
            if s is not None and s.points
        ]
        if not last or max(last) >= self.sig.end - 3 * self.sig.step:
            return None
        # Range queries repeat a vanished series' last sample for 5 minutes (staleness); the
        # rank's own last-step timestamp says when it really stopped.
        stamps = self.sig.last_step[rank].values() if rank in self.sig.last_step else []
        return max(stamps) if stamps else max(last)

    def _gpu_faults(self) -> None:
        sig = self.sig
        for s in sig.xid:
            for t, amount in increments(s):
                self._xid(s, t, amount)
        for s in sig.ecc:
            if s.label(contract.LABEL_KIND) != "uncorrected":
                continue
            for t, amount in increments(s):
                node, gpu = s.label(contract.LABEL_NODE), s.label(contract.LABEL_GPU)
                ranks = self._ranks_on_gpu(node, gpu)
                self._symptom(
                    Symptom(
                        Failure.GPU_HARDWARE,
                        f"{amount:.0f} uncorrectable ECC error(s) on GPU {gpu} of node {node}",
                        [contract.GPU_ECC_ERRORS.name],
                        t,
                        ranks,
                        [node],
                        3,
                    ),
                    Scope(ScopeLevel.NODE, f"GPU {gpu} of node {node}", ranks, [node], [gpu]),
                )
                self.report.candidates.append(
                    Candidate(
                        "gpu_ecc_uncorrectable",
                        f"Uncorrectable ECC errors on node {node} GPU {gpu}",
                        0.9,
                        [
                            f"{contract.GPU_ECC_ERRORS.name}{{kind=uncorrected}} +{amount:.0f} "
                            f"at {utc(t)}"
                        ],
                        [
                            f"Drain node {node} and restart the job from its last checkpoint "
                            "without it."
                        ],
                        [
                            "Run `dcgmi diag -r 3` before the node returns to service; RMA the "
                            "GPU if uncorrectable errors recur."
                        ],
                        {"node": node, "gpu": gpu},
                    )
                )
        for finding in self.logs.findings:
            if finding.category is Category.XID and not sig.xid:
                self._xid_from_log(finding.fields, finding.summary)

    def _xid(self, s: Series, t: float, amount: float) -> None:
        node, gpu = s.label(contract.LABEL_NODE), s.label(contract.LABEL_GPU)
        code = int(s.label(contract.LABEL_XID) or 0)
        evidence = [
            f"{contract.GPU_XID_ERRORS.name}{{node={node}, gpu={gpu}, xid={code}}} "
            f"+{amount:.0f} at {utc(t)}"
        ]
        self._report_xid(node, gpu, code, t, evidence, self._ranks_on_gpu(node, gpu))

    def _xid_from_log(self, fields: dict[str, object], summary: str) -> None:
        code = fields.get("xid")
        if not isinstance(code, int):
            return
        host = str(fields.get("host") or "")
        nodes = {n.split(".")[0]: n for n in self.sig.nodes}
        if host and nodes and host.split(".")[0] not in nodes:
            self.report.notes.append(f"ignored (not a node of this job): {summary}")
            return
        node = nodes.get(host.split(".")[0], host) if host else ""
        gpu = f"PCI:{fields.get('pci', '?')}"
        ranks = self.sig.ranks_on(node)
        self._report_xid(node, gpu, code, None, [f"kernel log: {summary}"], ranks)

    def _report_xid(
        self,
        node: str,
        gpu: str,
        code: int,
        t: float | None,
        evidence: list[str],
        ranks: list[int],
    ) -> None:
        info = xid_lookup(code)
        for rank in ranks:
            stopped = self._stopped(rank)
            if stopped is not None:
                evidence.append(f"rank {rank} (GPU {gpu}) stopped reporting at {utc(stopped)}")
        commands = (
            f" (`scontrol update nodename={node} state=drain` / `kubectl cordon {node}`)"
            if node
            else ""
        )
        where = node or "the node whose kernel log reported it"
        node = node or "unknown"
        drain = {
            "now": f"Drain {'node ' if commands else ''}{where} now{commands} and restart the "
            "job from its last checkpoint without it.",
            "after_job": f"Drain {where} when the current job ends and reset GPU {gpu}.",
            "no": "The GPU is likely healthy: look at what "
            + (_ranks_text(ranks) if ranks else "the job")
            + (f" ran at {utc(t)}." if t is not None else " ran."),
        }.get(info.drain, f"Treat {where} as faulty and drain it until Xid {code} is known.")
        severity = 3 if info.drain in ("now", "unknown", "after_job") else 2
        self._symptom(
            Symptom(
                Failure.GPU_HARDWARE,
                f"Xid {code} ({info.meaning}) on GPU {gpu} of node {node}",
                [contract.GPU_XID_ERRORS.name if t is not None else "kernel log"],
                t,
                ranks,
                [node],
                severity,
            ),
            Scope(
                ScopeLevel.NODE,
                f"node {node}, GPU {gpu} ({_ranks_text(ranks)}): a hardware fault of one GPU; "
                "the rest of the job fails only because it waits for it",
                ranks,
                [node],
                [gpu],
            ),
        )
        self.report.candidates.append(
            Candidate(
                f"xid_{code}",
                f"Xid {code} on node {node} GPU {gpu}: {info.meaning}",
                0.95 if severity == 3 else 0.6,
                evidence,
                [drain],
                [info.advice],
                {"node": node, "gpu": gpu, "xid": code, "drain": info.drain, "ranks": ranks},
            )
        )

    # --- hang -----------------------------------------------------------------------------
    def _stall(self) -> None:
        sig = self.sig
        floor = thresholds().collective_stall_floor_seconds
        threshold = (sig.stall_threshold.last() if sig.stall_threshold else None) or floor
        peak_rank, peak_age, peak_t = None, 0.0, None
        for rank, s in sig.oldest_inflight.items():
            for t, v in s.points:
                if v > peak_age:
                    peak_rank, peak_age, peak_t = rank, v, t
        stalls = {r: increments(s) for r, s in sig.stalls.items() if increments(s)}
        timeouts = {r: increments(s) for r, s in sig.timeouts.items() if increments(s)}
        events = [
            e for e in self.logs.events if e.kind in ("collective_stalled", "collective_timeout")
        ]
        nccl_logs = [f for f in self.logs.findings if f.category is Category.NCCL_TIMEOUT]
        mismatches = [(d, m) for d in self.dumps for m in d.mismatches]
        if not (peak_age > threshold or stalls or timeouts or events or mismatches or nccl_logs):
            return
        signals = []
        if peak_age:
            signals.append(contract.COLLECTIVE_OLDEST_INFLIGHT.name)
        if stalls:
            signals.append(contract.COLLECTIVE_STALLS.name)
        if timeouts:
            signals.append(contract.COLLECTIVE_TIMEOUTS.name)
        if events:
            signals.append("hook events: " + ", ".join(sorted({e.kind for e in events})))
        if mismatches:
            signals.append("Flight Recorder dumps")
        if nccl_logs:
            signals.append("NCCL watchdog timeout in logs")
        since = None
        if peak_t is not None and peak_age:
            since = peak_t - peak_age
        suspects: list[int] = sorted({r for _, m in mismatches for r in m.missing_ranks})
        laggard = self._laggard()
        if not suspects and laggard is not None:
            suspects = [laggard]
        if not suspects:
            # A rank that died (its series end) is what the others wait for.
            suspects = [r.rank for r in sig.ranks if self._stopped(r.rank) is not None]
        if not suspects:
            for finding in nccl_logs:
                never = finding.fields.get("laggard_ranks")
                if isinstance(never, list):
                    suspects = sorted(int(r) for r in never if str(r).isdigit())
        self.stall_ranks = suspects
        failure = Failure.NCCL_TIMEOUT if (timeouts or nccl_logs) else Failure.COLLECTIVE_STALL
        what = (
            f"the oldest in-flight collective reached {peak_age:.0f} s "
            f"(threshold {threshold:.0f} s) on rank {peak_rank}"
            if peak_age
            else "collectives stopped completing"
        )
        self._symptom(
            Symptom(
                failure,
                f"Collective hang: {what}",
                signals,
                since,
                suspects,
                sorted({sig.node_of(r) for r in suspects if sig.node_of(r)}),
                3,
            ),
            self._rank_scope(
                suspects,
                "the rank(s) the others wait for; the rest of the job is blocked in the "
                "collective, not broken",
            ),
        )
        self._stall_candidates(mismatches, laggard, suspects, threshold)

    def _laggard(self) -> int | None:
        """The rank that launched the fewest collectives, when the counts differ."""
        latest = {r: v for r, s in self.sig.launched.items() if (v := s.last()) is not None}
        if len(set(latest.values())) <= 1:
            return None
        # The recording rule also prefers, among equal counts, the rank with nothing in flight.
        recorded = [s for s in self.sig.laggard if s.points and s.label(contract.LABEL_RANK)]
        if recorded:
            newest = max(recorded, key=lambda s: s.points[-1][0])
            if newest.label(contract.LABEL_RANK).isdigit():
                return int(newest.label(contract.LABEL_RANK))
        return min(latest, key=lambda r: (latest[r], r))

    def _adaptive_timeout(self) -> tuple[float, str] | None:
        p999 = self.sig.grad_sync_p999_seconds
        if p999 is None or p999 <= 0:
            return None
        timeout = max(TIMEOUT_FLOOR_SECONDS, math.ceil(TIMEOUT_MULTIPLIER * p999 / 10) * 10)
        return timeout, (
            f"the slowest 0.1% of gradient syncs took {p999:.3g} s in this window; "
            f"{TIMEOUT_MULTIPLIER:g}x that, at least {TIMEOUT_FLOOR_SECONDS:g} s, is "
            f"{timeout:.0f} s"
        )

    def _stall_candidates(
        self,
        mismatches: list[tuple[StallDump, Mismatch]],
        laggard: int | None,
        suspects: list[int],
        threshold: float,
    ) -> None:
        evidence: list[str] = []
        facts: dict[str, object] = {"suspect_ranks": suspects}
        for dump in self.dumps:
            found = sorted(dump.mismatches, key=lambda m: m.collective_seq_id)
            if not found:
                continue
            m = found[0]
            later = [x.collective_seq_id for x in found[1:]]
            evidence.append(
                f"torch's Flight Recorder analyzer over {dump.folder} (ranks "
                f"{dump.ranks_dumped} dumped): collective #{m.collective_seq_id} "
                f"{m.name} of process group {m.process_group} never joined by "
                f"{_ranks_text(m.missing_ranks)}"
                + (
                    f"; {len(later)} later collective(s) (#{later[0]}-#{later[-1]}) queued "
                    "behind it"
                    if later
                    else ""
                )
            )
            facts.setdefault("collective_seq_id", m.collective_seq_id)
            facts.setdefault("collective", m.name)
            facts.setdefault("process_group", m.process_group)
        for dump in self.dumps:
            if dump.error:
                self.report.notes.append(dump.error)
            for rank in suspects:
                if dump.stacks.get(rank):
                    evidence.append(
                        f"main-thread stack of rank {rank} at the stall ({dump.folder}):\n"
                        f"```\n{dump.stacks[rank]}\n```"
                    )
        if laggard is not None:
            counts = {r: s.last() or 0.0 for r, s in self.sig.launched.items()}
            own, most = counts.get(laggard, 0.0), max(counts.values())
            evidence.append(
                f"rank {laggard} launched the fewest collectives ({own:.0f} vs up to {most:.0f})"
                if own < most
                else f"rank {laggard} had no collective in flight while others waited in one "
                f"(it launched {own:.0f}, as many as any rank)"
            )
        for event in self.logs.events:
            if event.kind in ("collective_stalled", "collective_timeout"):
                evidence.append(f"event {event.kind} from rank {event.rank}: {event.message}")
                break
        for finding in self.logs.findings:
            if finding.category is Category.NCCL_TIMEOUT:
                evidence.append(f"log: {finding.summary}")
        node_faults = [
            c
            for c in self.report.candidates
            if c.cause.startswith(("xid_", "gpu_ecc"))
            and set(c.facts.get("ranks", [])) & set(suspects)
        ]
        do_now = [
            "Restart the job from its last checkpoint (torchrun elastic restarts the worker "
            "group; trainguard-remediation does it for TrainingCollectiveStalled)."
        ]
        dead = [r for r in suspects if self._stopped(r) is not None]
        if dead:
            evidence += [f"rank {r} stopped reporting at {utc(self._stopped(r))}" for r in dead]
            do_now.insert(
                0,
                f"{_ranks_text(dead).capitalize()} died: the others wait for it in the "
                "collective. Find why (its log's last lines, its node's faults above).",
            )
        elif suspects:
            stacks = any(d.stacks.get(r) for d in self.dumps for r in suspects)
            do_now.insert(
                0,
                f"Look at what {_ranks_text(suspects)} was doing"
                + (" (its stack above)" if stacks else " (py-spy dump --pid, or the hook's stacks)")
                + ": a rank stuck outside the collective (data loading, checkpoint I/O, a branch "
                "the others did not take) is a code path, not the network.",
            )
        prevention = [
            "Keep the Flight Recorder on (TORCH_FR_BUFFER_SIZE=2000, TORCH_NCCL_DUMP_ON_TIMEOUT=1) "
            "so every hang leaves dumps like these."
        ]
        timeout = self._adaptive_timeout()
        if timeout is not None:
            facts["recommended_timeout_seconds"] = timeout[0]
            prevention.insert(
                0,
                f"Set the process-group timeout to {timeout[0]:.0f} s "
                f"(init_process_group(timeout=timedelta(seconds={timeout[0]:.0f})) and "
                f"TRAINGUARD_STALL_FLOOR_SECONDS) instead of NCCL's default 10 min: "
                f"{timeout[1]}.",
            )
        confidence = 0.9 if mismatches else (0.7 if laggard is not None else 0.4)
        if node_faults:
            confidence = min(confidence, 0.6)
        self.report.candidates.append(
            Candidate(
                "rank_never_joined",
                (
                    f"{_ranks_text(suspects).capitalize()} never joined collective "
                    f"#{facts['collective_seq_id']} ({facts['collective']})"
                    if "collective_seq_id" in facts
                    else f"The job waits in a collective for {_ranks_text(suspects)}"
                )
                if suspects
                else "A collective stalled; the rank it waits for is unknown",
                confidence,
                evidence or [f"oldest in-flight collective past {threshold:.0f} s"],
                do_now,
                prevention,
                facts,
            )
        )

    # --- OOM ------------------------------------------------------------------------------
    def _oom(self) -> None:
        sig = self.sig
        ooms = {r: increments(s) for r, s in sig.oom_events.items()}
        ooms = {r: i for r, i in ooms.items() if i}
        log_ooms = [f for f in self.logs.findings if f.category is Category.CUDA_OOM]
        event_ooms = [e for e in self.logs.events if e.kind == contract.EventKind.OOM.value]
        if not (ooms or log_ooms or event_ooms):
            return
        ranks = sorted(ooms) or sorted({e.rank for e in event_ooms if e.rank is not None})
        first = min((i[0][0] for i in ooms.values()), default=None)
        self.oom_rank = (
            min(ooms, key=lambda r: ooms[r][0][0]) if ooms else (ranks[0] if ranks else None)
        )
        everyone = len(ranks) == len(sig.ranks) and len(ranks) > 1
        self._symptom(
            Symptom(
                Failure.OOM,
                f"CUDA out of memory on {_ranks_text(ranks)}",
                [contract.OOM_EVENTS.name]
                + (["CUDA OOM in logs"] if log_ooms else [])
                + (["hook oom events"] if event_ooms else []),
                first,
                ranks,
                sorted({sig.node_of(r) for r in ranks if sig.node_of(r)}),
                3,
            ),
            Scope(
                ScopeLevel.JOB,
                "every rank ran out of memory: the model and batch do not fit this GPU",
                ranks,
            )
            if everyone
            else self._rank_scope(ranks, "only this process ran out of memory"),
        )
        # The first rank to fail explains the OOM; the others (if any) fail the same way.
        first_rank = self.oom_rank
        events = ooms[first_rank] if first_rank is not None and first_rank in ooms else []
        self._oom_candidates(first_rank, events, log_ooms)

    def _oom_candidates(
        self, rank: int | None, events: list[tuple[float, float]], log_ooms: list[Finding]
    ) -> None:
        sig = self.sig
        t_oom = events[0][0] if events else sig.end
        where = f"rank {rank}" if rank is not None else "the failing rank"
        allocated = _before(sig.allocated.get(rank), t_oom) if rank is not None else None
        reserved = _before(sig.reserved.get(rank), t_oom) if rank is not None else None
        capacity = _before(sig.capacity.get(rank), t_oom) if rank is not None else None
        frag = _before(sig.fragmentation.get(rank), t_oom) if rank is not None else None
        if frag is None and reserved and allocated is not None:
            frag = (reserved - allocated) / reserved
        retries = [
            (t, a)
            for t, a in (increments(sig.alloc_retries[rank]) if rank in sig.alloc_retries else [])
            if t_oom - 900 <= t <= t_oom
        ]
        earlier = None
        if rank is not None and rank in sig.allocated:
            past = _between(sig.allocated[rank], t_oom - 1800, t_oom)
            earlier = past[0] if past else None
        triage_verdicts = [f.fields.get("verdict") for f in log_ooms]
        gib = 1 << 30
        facts: dict[str, object] = {
            "rank": rank,
            "oom_time": t_oom if events else None,
            "allocated_bytes": allocated,
            "reserved_bytes": reserved,
            "capacity_bytes": capacity,
            "fragmentation_ratio": frag,
            "alloc_retries_before_oom": sum(a for _, a in retries),
        }
        memory_line = (
            f"before the OOM at {utc(t_oom)} on {where}: allocated "
            f"{(allocated or 0) / gib:.1f} GiB, reserved {(reserved or 0) / gib:.1f} GiB of "
            f"{(capacity or 0) / gib:.1f} GiB"
        )
        fragmented = frag is not None and frag >= FRAGMENTATION_RATIO
        if fragmented or "fragmentation" in triage_verdicts:
            evidence = [memory_line]
            if frag is not None:
                evidence.append(
                    f"{frag:.0%} of reserved memory held no tensor "
                    f"({contract.MEMORY_FRAGMENTATION.name})"
                )
            if retries:
                evidence.append(
                    f"{sum(a for _, a in retries):.0f} allocator retries (cudaMalloc after "
                    f"freeing the cache) in the 15 min before "
                    f"({contract.MEMORY_ALLOC_RETRIES.name})"
                )
            for f in log_ooms:
                if f.fields.get("verdict") == "fragmentation":
                    evidence.append(f"log: {f.summary}")
            self.report.candidates.append(
                Candidate(
                    "memory_fragmentation",
                    f"Fragmented allocator cache on {where}: the request failed although "
                    "reserved memory was largely free",
                    0.9 if retries or "fragmentation" in triage_verdicts else 0.75,
                    evidence,
                    [
                        "Restart with PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True (the "
                        "reserved-but-unallocated memory becomes usable); trainguard's OOM guard "
                        "can split the failing step into micro-batches meanwhile.",
                    ],
                    [
                        "Keep expandable_segments:True in the job's environment; avoid tensor "
                        "shapes that change every step (pad variable-length batches to buckets).",
                    ],
                    facts,
                )
            )
        if allocated and earlier and allocated >= MEMORY_GROWTH * earlier:
            self.report.candidates.append(
                Candidate(
                    "memory_growth",
                    f"Memory held by tensors grew on {where} until it ran out",
                    0.7,
                    [
                        memory_line,
                        f"allocated grew {allocated / earlier:.2f}x in the 30 min before "
                        f"({contract.MEMORY_ALLOCATED.name})",
                    ],
                    [
                        "Restart from the last checkpoint; look for tensors kept across steps "
                        "(losses appended without .item(), caches, growing sequence lengths)."
                    ],
                    ["Alert on TrainingOOMRisk (memory headroom trend) before it fails."],
                    facts,
                )
            )
        if allocated and capacity and allocated >= NEAR_CAPACITY * capacity:
            self.report.candidates.append(
                Candidate(
                    "does_not_fit",
                    f"The step needs more memory than {where}'s GPU has",
                    0.65,
                    [memory_line],
                    [
                        "Halve the micro-batch and keep the global batch with gradient "
                        "accumulation (the remediation service's split_micro_batches)."
                    ],
                    [
                        "Enable activation checkpointing, bf16, or shard parameters and "
                        "optimizer state (FSDP/ZeRO)."
                    ],
                    facts,
                )
            )
        if not any(
            c.cause in ("memory_fragmentation", "memory_growth", "does_not_fit")
            for c in self.report.candidates
        ):
            self.report.candidates.append(
                Candidate(
                    "oom_unexplained",
                    f"Out of memory on {where}; the memory series do not say why",
                    0.3,
                    [memory_line],
                    ["Restart from the last checkpoint with a smaller micro-batch."],
                    ["Record a memory snapshot (torch.cuda.memory._record_memory_history)."],
                    facts,
                )
            )

    # --- stragglers -----------------------------------------------------------------------
    def _straggler(self) -> None:
        sig = self.sig
        stragglers = find_stragglers(sig)
        if not stragglers:
            return
        slow = sorted(s.rank for s in stragglers)
        worst = stragglers[0]
        self.worst_rank = worst.rank
        self.worst_window = (worst.since, worst.until)
        by_node: dict[str, list[int]] = defaultdict(list)
        for rank in slow:
            by_node[sig.node_of(rank)].append(rank)
        whole_nodes = [
            n
            for n, rs in by_node.items()
            if n and len(sig.ranks_on(n)) > 1 and sorted(rs) == sig.ranks_on(n)
        ]
        if whole_nodes and all(sig.node_of(r) in whole_nodes for r in slow):
            scope = Scope(
                ScopeLevel.NODE,
                f"every rank of node {', '.join(whole_nodes)} is slow and no other rank is: "
                "a node problem (GPU clocks, host CPU or memory, local storage), not one process",
                slow,
                sorted(whole_nodes),
            )
        else:
            gpus = [sig.gpu_of_rank.get(r, "") for r in slow]
            scope = Scope(
                ScopeLevel.RANK,
                f"{_ranks_text(slow)} only, while other ranks of the same node are at the "
                "median: one GPU or one process (its data shard, its GPU, a CPU pinning "
                "problem), not the node",
                slow,
                sorted({sig.node_of(r) for r in slow}),
                [g for g in gpus if g],
            )
        others = [r.rank for r in sig.ranks if r.rank not in slow]
        mine = phase_breakdown(sig, worst.rank, worst.since, worst.until)
        median = median_breakdown(sig, others, worst.since, worst.until)
        excess = {p: mine[p] - median.get(p, 0.0) for p in mine if p != "sync_wait"}
        slow_phase = max(excess, key=lambda p: excess[p]) if excess else None
        self._symptom(
            Symptom(
                Failure.STRAGGLER,
                f"Straggler: {_ranks_text(slow)} need{'s' if len(slow) == 1 else ''} "
                f"{worst.ratio:.2f}x the job's median step compute time; every other rank "
                "waits at each gradient sync",
                [contract.REC_RANK_COMPUTE_MEAN, "job median (computed)"],
                min(s.since for s in stragglers),
                slow,
                scope.nodes,
                2,
            ),
            scope,
        )
        phase_line = (
            f"slowest phase of rank {worst.rank}: {slow_phase} "
            f"({mine.get(slow_phase, 0):.3f} s vs median {median.get(slow_phase, 0):.3f} s)"
            if slow_phase
            else "no phase breakdown (trainguard_step_phase_duration_seconds missing)"
        )
        evidence = [
            f"rank {s.rank} on {sig.node_of(s.rank)}: {s.ratio:.2f}x median compute time from "
            f"{utc(s.since)} to {utc(s.until)}"
            for s in stragglers
        ] + [phase_line]
        facts = {
            "slow_ranks": slow,
            "worst_rank": worst.rank,
            "ratio": round(worst.ratio, 3),
            "slow_phase": slow_phase,
            "phases": mine,
            "median_phases": median,
        }
        matched = False
        hot: dict[str, list[_Window]] = defaultdict(list)
        slow_gpus = {(sig.node_of(r), sig.gpu_of_rank.get(r, "")) for r in slow}
        for window in throttling(sig):
            overlap = window.since <= worst.until and window.until >= worst.since
            on_scope = (
                window.node in scope.nodes
                if scope.level is ScopeLevel.NODE
                else (window.node, window.gpu) in slow_gpus
            )
            if overlap and on_scope:
                hot[window.node].append(window)
        for node, windows in sorted(hot.items()):
            matched = True
            gpu_list = sorted({w.gpu for w in windows}, key=lambda g: (len(g), g))
            temps = [t for w in windows if (t := _max_temperature(sig, node, w.gpu)) is not None]
            reasons = sorted({w.what for w in windows})
            self.report.candidates.append(
                Candidate(
                    "gpu_thermal_throttling",
                    f"GPU(s) {', '.join(gpu_list)} of node {node} held their clocks down "
                    f"({', '.join(reasons)}) while its ranks straggled",
                    0.9,
                    [
                        f"{contract.GPU_CLOCK_THROTTLED.name}{{node={node}, gpu={w.gpu}, "
                        f"reason={w.what}}} = 1 from {utc(w.since)} to {utc(w.until)}"
                        for w in windows
                    ]
                    + ([f"GPU temperature up to {max(temps):.0f} C"] if temps else [])
                    + evidence,
                    [
                        f"Exclude node {node}: let torchrun elastic re-rendezvous without it "
                        "(trainguard-remediation's exclude_node), or restart from the "
                        "checkpoint on a healthy node.",
                    ],
                    [
                        f"Check node {node}'s cooling (fans, airflow, inlet temperature) and "
                        "power capping before it returns; the GpuThermalThrottling alert fires "
                        "before the job slows.",
                    ],
                    {**facts, "node": node, "gpus": gpu_list, "reasons": reasons},
                )
            )
        xid_nodes = {
            str(c.facts.get("node")) for c in self.report.candidates if c.cause.startswith("xid_")
        }
        if scope.level is ScopeLevel.NODE and not matched:
            self.report.candidates.append(
                Candidate(
                    "node_degraded",
                    f"Node {', '.join(scope.nodes)} is slow as a whole "
                    "(no GPU throttling or Xid recorded for it)",
                    0.7,
                    evidence,
                    [
                        f"Exclude node {', '.join(scope.nodes)} (torchrun elastic "
                        "re-rendezvous; trainguard-remediation's exclude_node) and compare "
                        "its host CPU, memory bandwidth and local disk with a healthy node.",
                    ],
                    [
                        "Run a node burn-in (`dcgmi diag -r 2`, a NCCL all-reduce test) before "
                        "returning it."
                    ],
                    facts,
                )
            )
        if slow_phase == "data":
            self.report.candidates.append(
                Candidate(
                    "data_loading",
                    f"Rank {worst.rank} waits for its data loader",
                    0.8 if not matched else 0.5,
                    evidence,
                    [
                        "Raise DataLoader num_workers and prefetch_factor, pin_memory=True; check "
                        "the storage this rank's shard is read from."
                    ],
                    ["Balance shards across ranks; cache or pre-process the dataset locally."],
                    facts,
                )
            )
        elif scope.level is ScopeLevel.RANK and not matched:
            self.report.candidates.append(
                Candidate(
                    "slow_gpu_or_process",
                    f"Rank {worst.rank} computes slowly in {slow_phase or 'its step'} on its own",
                    0.6 if sig.node_of(worst.rank) not in xid_nodes else 0.4,
                    evidence,
                    [
                        f"Check GPU {sig.gpu_of_rank.get(worst.rank, '?')} of node "
                        f"{sig.node_of(worst.rank)} (nvidia-smi -q: clocks, PCIe link width, "
                        "other processes on it) and the CPU pinning of rank "
                        f"{worst.rank}; exclude the node if it persists.",
                    ],
                    [
                        "Keep trainguard's TrainingStraggler alert on: it names the rank and its "
                        "slow phase once the ratio holds for `straggler_for` "
                        "(alerts/trainguard/alerts/thresholds.yml)."
                    ],
                    facts,
                )
            )

    # --- data loading and whole-job slowdowns --------------------------------------------
    def _dataloader(self) -> None:
        sig = self.sig
        flagged = []
        for rank, phases in sig.phases.items():
            data, step = phases.get("data"), sig.step_time.get(rank)
            if data is None or step is None:
                continue
            steps = dict(step.points)
            ratios = [(t, v / steps[t]) for t, v in data.points if steps.get(t)]
            if _runs([(t, r > DATA_WAIT_RATIO) for t, r in ratios], _min_points(sig)):
                flagged.append(rank)
        if not flagged:
            return
        flagged.sort()
        everyone = len(flagged) == len(sig.ranks)
        if not everyone and self.worst_rank in flagged:
            return  # the straggler analysis already names data loading for this rank
        self._symptom(
            Symptom(
                Failure.DATALOADER_BOUND,
                f"Data loading bounds {('every rank' if everyone else _ranks_text(flagged))}: "
                f"over {DATA_WAIT_RATIO:.0%} of each step waits for the next batch",
                [
                    contract.REC_RANK_PHASE_MEAN + '{phase="data"}',
                    contract.REC_RANK_STEP_DURATION_MEAN,
                ],
                None,
                flagged,
                [],
                2,
            ),
            Scope(
                ScopeLevel.JOB,
                "every rank waits for data: shared storage, the dataset format or too few "
                "loader workers, not one node",
                flagged,
            )
            if everyone
            else self._rank_scope(flagged, "these ranks' data loading"),
        )
        self.report.candidates.append(
            Candidate(
                "data_loading",
                "The input pipeline cannot keep up with the GPUs",
                0.75,
                [f"data wait above {DATA_WAIT_RATIO:.0%} of step time on {_ranks_text(flagged)}"],
                [
                    "Raise DataLoader num_workers and prefetch_factor; pin_memory=True; check "
                    "the read throughput of the dataset's storage."
                ],
                ["Pre-shard and cache the dataset close to the nodes; decode on the GPU."],
                {"ranks": flagged},
            )
        )

    def _job_slowdown(self) -> None:
        sig = self.sig
        if any(
            s.failure in (Failure.STRAGGLER, Failure.DATALOADER_BOUND) for s in self.report.symptoms
        ):
            return
        median = list(job_median(sig.compute).items())
        if len(median) < 8:
            return
        quarter = len(median) // 4
        before = statistics.median(v for _, v in median[:quarter])
        after = statistics.median(v for _, v in median[-quarter:])
        if before <= 0 or after < JOB_SLOWDOWN_FACTOR * before:
            return
        # Since when: the longest sustained run above the factor, not the last quarter's start.
        slowed = _runs(
            [(t, v >= JOB_SLOWDOWN_FACTOR * before) for t, v in median], _min_points(sig)
        )
        sockets = [
            s.label(contract.LABEL_NODE)
            for s in sig.nccl_info
            if "NET/Socket" in s.label(contract.LABEL_TRANSPORT)
        ]
        self._symptom(
            Symptom(
                Failure.JOB_SLOWDOWN,
                f"Every rank slowed down together: median compute time {before:.3f} s -> "
                f"{after:.3f} s",
                [contract.REC_RANK_COMPUTE_MEAN],
                slowed[0] if slowed else median[-quarter][0],
                [r.rank for r in sig.ranks],
                [],
                2,
            ),
            Scope(
                ScopeLevel.JOB,
                "all ranks at once: data, storage, network or the code",
                [r.rank for r in sig.ranks],
            ),
        )
        self.report.candidates.append(
            Candidate(
                "shared_dependency",
                "Something every rank shares got slower (storage, network, the input data)",
                0.5,
                [f"job median compute time rose {after / before:.2f}x"]
                + (
                    [f"NCCL uses TCP sockets on {', '.join(sorted(set(sockets)))}"]
                    if sockets
                    else []
                ),
                [
                    "Compare with the previous release of the code and data; check the shared "
                    "file system and network during the window."
                ],
                ["Alert on job throughput (job:trainguard_steps:rate5m) dropping."],
                {"before": before, "after": after},
            )
        )

    def _throttling_alone(self) -> None:
        if any(c.cause == "gpu_thermal_throttling" for c in self.report.candidates):
            return
        for window in throttling(self.sig):
            ranks = self._ranks_on_gpu(window.node, window.gpu)
            self._symptom(
                Symptom(
                    Failure.GPU_THROTTLING,
                    f"GPU {window.gpu} of node {window.node} throttled ({window.what})",
                    [contract.GPU_CLOCK_THROTTLED.name],
                    window.since,
                    ranks,
                    [window.node],
                    1,
                ),
                Scope(
                    ScopeLevel.NODE,
                    f"GPU {window.gpu} of node {window.node}",
                    ranks,
                    [window.node],
                    [window.gpu],
                ),
            )
            self.report.candidates.append(
                Candidate(
                    "gpu_thermal_throttling",
                    f"GPU {window.gpu} of node {window.node} held its clocks down "
                    f"({window.what}); its ranks are not (yet) measurably slower",
                    0.4,
                    [f"{window.what} from {utc(window.since)} to {utc(window.until)}"],
                    [f"Check node {window.node}'s cooling and power capping."],
                    ["Keep the GpuThermalThrottling alert routed to the cluster team."],
                    {"node": window.node, "gpu": window.gpu},
                )
            )

    # --- helpers --------------------------------------------------------------------------
    def _rank_scope(self, ranks: list[int], why: str) -> Scope:
        sig = self.sig
        nodes = sorted({sig.node_of(r) for r in ranks if sig.node_of(r)})
        if len(nodes) == 1 and len(ranks) > 1 and sorted(ranks) == sig.ranks_on(nodes[0]):
            return Scope(ScopeLevel.NODE, f"every rank of node {nodes[0]}: {why}", ranks, nodes)
        if not ranks:
            return Scope(ScopeLevel.JOB, f"the whole job ({why})")
        return Scope(
            ScopeLevel.RANK,
            f"{_ranks_text(ranks)} on {', '.join(nodes) or 'an unknown node'}: {why}",
            ranks,
            nodes,
            [sig.gpu_of_rank[r] for r in ranks if sig.gpu_of_rank.get(r)],
        )
