"""Stragglers: ranks whose step compute time stays above the job median (step time is equal on
every rank of a synchronous job), their scope (one rank, or a whole node), their slow phase,
and what the GPUs of the same node did at the same time."""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from dataclasses import dataclass
from typing import Any

from trainguard import contract
from trainguard.contract import Cause, Failure
from trainguard.diagnose.analysis import explains
from trainguard.diagnose.context import (
    Context,
    between,
    job_median,
    mean,
    ranks_text,
    runs,
    utc,
)
from trainguard.diagnose.gpu_throttling import Window, max_temperature, throttling
from trainguard.diagnose.membership import (
    first_evidence,
    interval_run,
    member_points,
    steady_ratio,
)
from trainguard.diagnose.model import Candidate, Scope, ScopeLevel, Setting, Symptom
from trainguard.diagnose.prevent import SCHEDULER, elastic_minimum, prevents
from trainguard.diagnose.signals import Signals
from trainguard.thresholds import duration_seconds

PHASE_ORDER = ("data", "forward", "backward", "optimizer", "sync_wait")


@dataclass
class Straggler:
    rank: int
    since: float
    until: float
    ratio: float


def find_stragglers(ctx: Context) -> list[Straggler]:
    """Ranks at least ``straggler_factor`` times the job median, sustained, judged over the
    job as it was (see :mod:`.membership`); slowest first. ``since`` is the first evidence
    (the first interval whose own steps ran that slow), ``ratio`` the factor over the
    intervals after it, where the raw counters tell; else the window means'. A rank those
    means do not single out is still a straggler where the fast rule would call it one
    (:func:`share_stragglers`)."""
    limits = ctx.thresholds
    window = duration_seconds(limits.rate_window)
    compute = {r: member_points(ctx, r, s, window) for r, s in ctx.sig.compute.items()}
    median = job_median(compute, limits.straggler_min_ranks)
    out = []
    for rank, series in compute.items():
        ratios = [(t, v / median[t]) for t, v in series.points if median.get(t, 0) > 0]
        run = runs([(t, r >= limits.straggler_factor) for t, r in ratios], ctx.min_points)
        if run is None:
            run = interval_run(ctx, rank, limits.straggler_factor)
        if run is None:
            continue
        since = first_evidence(ctx, rank, run[0], window, limits.straggler_factor) or run[0]
        ratio = steady_ratio(ctx, rank, since, run[1])
        if ratio is None:
            ratio = statistics.median(r for t, r in ratios if run[0] <= t <= run[1])
        out.append(Straggler(rank, since, run[1], ratio))
    found = {s.rank for s in out}
    out += [s for s in share_stragglers(ctx) if s.rank not in found]
    return sorted(out, key=lambda s: -s.ratio)


def share_stragglers(ctx: Context) -> list[Straggler]:
    """Ranks whose recent compute share stayed at least ``straggler_recent_factor`` times the
    job's median share for ``straggler_recent_for``: what ``TrainingStraggler``'s fast rule
    fires on. A 1.2x slowdown of the forward and backward passes reads about 1.17x in step
    compute, under ``straggler_factor``, and the alert's incident would otherwise come with a
    diagnosis that finds no straggler. ``ratio`` is the median share ratio over the run."""
    limits = ctx.thresholds
    sig = ctx.sig
    share = {r: member_points(ctx, r, s, 0.0) for r, s in sig.compute_share.items()}
    median = job_median(share, limits.straggler_min_ranks)
    hold = max(2, math.ceil(duration_seconds(limits.straggler_recent_for) / sig.raw_step) + 1)
    out = []
    for rank, series in share.items():
        ratios = [(t, v / median[t]) for t, v in series.points if median.get(t, 0) > 0]
        run = runs([(t, r >= limits.straggler_recent_factor) for t, r in ratios], hold)
        if run is None:
            continue
        ratio = statistics.median(r for t, r in ratios if run[0] <= t <= run[1])
        out.append(Straggler(rank, run[0], run[1], ratio))
    return out


def phase_breakdown(sig: Signals, rank: int, start: float, end: float) -> dict[str, float]:
    """Mean seconds per phase of one rank's steps; backward is compute time less data and
    forward (the backward phase also holds the wait on peers, reported as sync_wait)."""
    phases = sig.phases.get(rank, {})
    out: dict[str, float] = {}
    for name in ("data", "forward", "optimizer"):
        value = mean(between(phases.get(name), start, end))
        if value is not None:
            out[name] = value
    compute = mean(between(sig.compute.get(rank), start, end))
    if compute is not None and phases:
        out["backward"] = max(0.0, compute - out.get("data", 0.0) - out.get("forward", 0.0))
    elif (backward := mean(between(phases.get("backward"), start, end))) is not None:
        out["backward"] = backward
    wait = mean(between(sig.sync_wait.get(rank), start, end))
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
class _Found:
    """One straggler analysis: the slow ranks, the slowest, where, and the shared evidence."""

    slow: list[int]
    worst: Straggler
    scope: Scope
    slow_phase: str | None
    evidence: list[str]
    facts: dict[str, Any]


@explains(Failure.STRAGGLER, after=(Failure.GPU_FAULT,))
def analyse(ctx: Context) -> None:
    """Stragglers, then what explains the slowest: throttling, the node, data, or the rank."""
    stragglers = find_stragglers(ctx)
    if not stragglers:
        return
    sig = ctx.sig
    slow = sorted(s.rank for s in stragglers)
    worst = stragglers[0]
    ctx.worst_rank = worst.rank
    ctx.worst_window = (worst.since, worst.until)
    scope = _scope(ctx, slow)
    found = _explain(ctx, stragglers, slow, scope)
    ctx.symptom(
        Symptom(
            Failure.STRAGGLER,
            f"Straggler: {ranks_text(slow)} need{'s' if len(slow) == 1 else ''} "
            f"{worst.ratio:.2f}x the job's median step compute time; every other rank "
            "waits at each gradient sync",
            [contract.REC_RANK_COMPUTE_MEAN, "job median (computed)"],
            min(s.since for s in stragglers),
            slow,
            scope.nodes,
            _severity(ctx, stragglers),
        ),
        scope,
    )
    matched = _throttled(ctx, found)
    xid_nodes = {
        str(c.facts.get("node")) for c in ctx.report.candidates if c.cause is Cause.GPU_XID
    }
    if scope.level is ScopeLevel.NODE and not matched:
        _node_degraded(ctx, found)
    if found.slow_phase == "data":
        _data_loading(ctx, found, matched)
    elif scope.level is ScopeLevel.RANK and not matched:
        _slow_rank(ctx, found, sig.node_of(worst.rank) in xid_nodes)


def _severity(ctx: Context, stragglers: list[Straggler]) -> int:
    """2, or 1 where no straggler held for diagnose's sustain (only the fast rule's shorter
    hold, :func:`share_stragglers`): a rank slow for seconds is worth naming, but not above a
    lasting symptom such as memory about to run out, which can slow a rank for a while."""
    sig = ctx.sig
    # A run of n points spans n - 1 steps of its grid.
    held = max(s.until - s.since for s in stragglers) + max(sig.step, sig.raw_step)
    return 2 if held >= sig.sustain_seconds else 1


def _scope(ctx: Context, slow: list[int]) -> Scope:
    """A node when all its ranks (and only they) are slow, else the slow ranks."""
    sig = ctx.sig
    by_node: dict[str, list[int]] = defaultdict(list)
    for rank in slow:
        by_node[sig.node_of(rank)].append(rank)
    whole_nodes = [
        n
        for n, rs in by_node.items()
        if n and len(sig.ranks_on(n)) > 1 and sorted(rs) == sig.ranks_on(n)
    ]
    if whole_nodes and all(sig.node_of(r) in whole_nodes for r in slow):
        return Scope(
            ScopeLevel.NODE,
            f"every rank of node {', '.join(whole_nodes)} is slow and no other rank is: "
            "a node problem (GPU clocks, host CPU or memory, local storage), not one process",
            slow,
            sorted(whole_nodes),
        )
    gpus = [sig.gpu_of_rank.get(r, "") for r in slow]
    return Scope(
        ScopeLevel.RANK,
        f"{ranks_text(slow)} only, while other ranks of the same node are at the "
        "median: one GPU or one process (its data shard, its GPU, a CPU pinning "
        "problem), not the node",
        slow,
        sorted({sig.node_of(r) for r in slow}),
        [g for g in gpus if g],
    )


def _explain(ctx: Context, stragglers: list[Straggler], slow: list[int], scope: Scope) -> _Found:
    """The slowest rank's phases against the median of the others, as evidence and facts."""
    sig = ctx.sig
    worst = stragglers[0]
    others = [r.rank for r in sig.ranks if r.rank not in slow]
    mine = phase_breakdown(sig, worst.rank, worst.since, worst.until)
    median = median_breakdown(sig, others, worst.since, worst.until)
    excess = {p: mine[p] - median.get(p, 0.0) for p in mine if p != "sync_wait"}
    slow_phase = max(excess, key=lambda p: excess[p]) if excess else None
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
    return _Found(slow, worst, scope, slow_phase, evidence, facts)


def _throttled(ctx: Context, found: _Found) -> bool:
    """A candidate per node whose slow GPUs throttled while the worst rank straggled."""
    sig, worst, scope = ctx.sig, found.worst, found.scope
    hot: dict[str, list[Window]] = defaultdict(list)
    slow_gpus = {(sig.node_of(r), sig.gpu_of_rank.get(r, "")) for r in found.slow}
    for window in throttling(ctx):
        overlap = window.since <= worst.until and window.until >= worst.since
        on_scope = (
            window.node in scope.nodes
            if scope.level is ScopeLevel.NODE
            else (window.node, window.gpu) in slow_gpus
        )
        if overlap and on_scope:
            hot[window.node].append(window)
    for node, windows in sorted(hot.items()):
        gpu_list = sorted({w.gpu for w in windows}, key=lambda g: (len(g), g))
        temps = [t for w in windows if (t := max_temperature(ctx, node, w.gpu)) is not None]
        reasons = sorted({w.what for w in windows})
        ctx.candidate(
            Candidate(
                Cause.GPU_THROTTLING,
                f"GPU(s) {', '.join(gpu_list)} of node {node} held their clocks down "
                f"({', '.join(reasons)}) while its ranks straggled",
                0.9,
                [
                    f"{contract.GPU_CLOCK_THROTTLED.name}{{node={node}, gpu={w.gpu}, "
                    f"reason={w.what}}} = 1 from {utc(w.since)} to {utc(w.until)}"
                    for w in windows
                ]
                + ([f"GPU temperature up to {max(temps):.0f} C"] if temps else [])
                + found.evidence,
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
                {**found.facts, "node": node, "gpus": gpu_list, "reasons": reasons},
            )
        )
    return bool(hot)


def _node_degraded(ctx: Context, found: _Found) -> None:
    nodes = ", ".join(found.scope.nodes)
    ctx.candidate(
        Candidate(
            Cause.NODE_DEGRADED,
            f"Node {nodes} is slow as a whole (no GPU throttling or Xid recorded for it)",
            0.7,
            found.evidence,
            [
                f"Exclude node {nodes} (torchrun elastic re-rendezvous; trainguard-remediation's "
                "exclude_node) and compare its host CPU, memory bandwidth and local disk with "
                "a healthy node.",
            ],
            ["Run a node burn-in (`dcgmi diag -r 2`, a NCCL all-reduce test) before returning it."],
            found.facts,
        )
    )


def _data_loading(ctx: Context, found: _Found, matched: bool) -> None:
    ctx.candidate(
        Candidate(
            Cause.DATA_LOADING,
            f"Rank {found.worst.rank} waits for its data loader",
            0.8 if not matched else 0.5,
            found.evidence,
            [
                "Raise DataLoader num_workers and prefetch_factor, pin_memory=True; check "
                "the storage this rank's shard is read from."
            ],
            ["Balance shards across ranks; cache or pre-process the dataset locally."],
            found.facts,
        )
    )


def _slow_rank(ctx: Context, found: _Found, on_xid_node: bool) -> None:
    sig, rank = ctx.sig, found.worst.rank
    ctx.candidate(
        Candidate(
            Cause.SLOW_GPU_OR_PROCESS,
            f"Rank {rank} computes slowly in {found.slow_phase or 'its step'} on its own",
            0.6 if not on_xid_node else 0.4,
            found.evidence,
            [
                f"Check GPU {sig.gpu_of_rank.get(rank, '?')} of node {sig.node_of(rank)} "
                "(nvidia-smi -q: clocks, PCIe link width, other processes on it) and the CPU "
                f"pinning of rank {rank}; exclude the node if it persists.",
            ],
            [
                "Keep trainguard's TrainingStraggler alert on: it names the rank and its "
                "slow phase once the ratio holds for `straggler_for` "
                "(trainguard/thresholds.yml)."
            ],
            found.facts,
        )
    )


# --- prevention -------------------------------------------------------------------------------
@prevents(Cause.NODE_DEGRADED, Cause.SLOW_GPU_OR_PROCESS, Cause.GPU_THROTTLING)
def _node_settings(ctx: Context, c: Candidate) -> list[Setting]:
    nodes = [str(c.facts["node"])] if "node" in c.facts else ctx.report.scope.nodes
    ratio, phase = c.facts.get("ratio"), c.facts.get("slow_phase")
    why = f"{ratio:.2f}x the job's median compute time" if ratio else "a straggler"
    if phase:
        why += f", slowest in {phase}"
    settings = [elastic_minimum(ctx, nodes, why)]
    reasons = c.facts.get("reasons")
    checks = (
        f"fail on clocks-event reasons {', '.join(map(str, reasons))}"
        if isinstance(reasons, list) and reasons
        else "fail on any clocks-event reason but idle"
    )
    settings.append(
        Setting(
            "GPU health check",
            f"nvidia-smi -q -d PERFORMANCE,TEMPERATURE ({checks}); dcgmi diag -r 2 before "
            "a node returns to service",
            SCHEDULER,
            [f"{why} on {', '.join(nodes) or 'its node'}"]
            + [e for e in c.evidence if "temperature" in e or "throttled" in e.lower()],
        )
    )
    return settings
