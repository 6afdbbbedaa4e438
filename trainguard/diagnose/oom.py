"""CUDA out of memory, explained by the memory curve of the first rank to fail before it did:
a fragmented allocator cache, memory that grew until it ran out, or a step that never fit.
Before any OOM, the ranks whose memory is about to run out (the TrainingOOMRisk alert's
condition on the same recorded series) are a warning sign."""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass

from trainguard import contract
from trainguard.contract import Cause, EventKind, Failure
from trainguard.diagnose.analysis import explains
from trainguard.diagnose.context import Context, before, between, ranks_text, runs, utc
from trainguard.diagnose.model import Candidate, Scope, ScopeLevel, Setting, Symptom
from trainguard.diagnose.prevent import ENV, SCRIPT, prevents
from trainguard.diagnose.signals import increments
from trainguard.thresholds import duration_seconds
from trainguard.triage import Finding

# Diagnose's own judgements, without an alert of the same meaning in thresholds.yml: the
# allocated memory before the OOM against the start of the OOM-risk prediction window, and
# against the GPU's capacity.
MEMORY_GROWTH = 1.2
NEAR_CAPACITY = 0.85

GIB = 1 << 30
MIB = 1 << 20
_EXPLAINED = (Cause.MEMORY_FRAGMENTATION, Cause.MEMORY_GROWTH, Cause.DOES_NOT_FIT)
# Below this a warning sign's candidates rank under an actual OOM's least likely one (0.3):
# the candidates explain the report's first symptom first.
_BESIDE_AN_OOM = 0.25
# Ranks whose OOM risk the evidence spells out; the symptom lists them all.
_RISK_RANKS_SHOWN = 4


@explains(Failure.OOM)
def analyse(ctx: Context) -> None:
    """OOMs, then the ranks that have not run out of memory yet but are about to."""
    _oom(ctx)
    _risk(ctx)


def _oom(ctx: Context) -> None:
    """OOMs from the counters, triage's log findings or the hook's events."""
    sig = ctx.sig
    ooms = {r: i for r, s in sig.oom_events.items() if (i := increments(s))}
    log_ooms = ctx.findings(Failure.OOM)
    event_ooms = ctx.events(EventKind.OOM.value)
    if not (ooms or log_ooms or event_ooms):
        return
    ranks = sorted(ooms) or sorted({e.rank for e in event_ooms if e.rank is not None})
    # The hook's own event dates the first OOM to the millisecond; the counter, a scrape later.
    counted = [i[0][0] for i in ooms.values()]
    logged = ctx.first_event_at(EventKind.OOM.value)
    first = min([*counted, *([] if logged is None else [logged])], default=None)
    ctx.oom_rank = min(ooms, key=lambda r: ooms[r][0][0]) if ooms else (ranks[0] if ranks else None)
    everyone = len(ranks) == len(sig.ranks) and len(ranks) > 1
    ctx.symptom(
        Symptom(
            Failure.OOM,
            f"CUDA out of memory on {ranks_text(ranks)}",
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
        else ctx.rank_scope(ranks, "only this process ran out of memory"),
    )
    # The first rank to fail explains the OOM; the others (if any) fail the same way.
    rank = ctx.oom_rank
    events = ooms[rank] if rank is not None and rank in ooms else []
    memory = _memory(ctx, rank, events[0][0] if events else None)
    _fragmentation(ctx, memory, log_ooms)
    _growth(ctx, memory)
    _does_not_fit(ctx, memory)
    if not ctx.has_cause(*_EXPLAINED):
        _unexplained(ctx, memory)


@dataclass
class _Memory:
    """The failing rank's memory just before its OOM (the window's end when not counted)."""

    rank: int | None
    t_oom: float
    counted: bool
    allocated: float | None
    reserved: float | None
    capacity: float | None
    fragmentation: float | None
    retries: float  # allocator retries within the fragmentation alert's retry window
    earlier: float | None  # allocated at the start of the OOM-risk prediction window
    retry_window: float
    growth_window: float

    @property
    def where(self) -> str:
        return f"rank {self.rank}" if self.rank is not None else "the failing rank"

    @property
    def line(self) -> str:
        return (
            f"before the OOM at {utc(self.t_oom)} on {self.where}: allocated "
            f"{(self.allocated or 0) / GIB:.1f} GiB, reserved {(self.reserved or 0) / GIB:.1f} "
            f"GiB of {(self.capacity or 0) / GIB:.1f} GiB"
        )

    def facts(self) -> dict[str, object]:
        return {
            "rank": self.rank,
            "oom_time": self.t_oom if self.counted else None,
            "allocated_bytes": self.allocated,
            "reserved_bytes": self.reserved,
            "capacity_bytes": self.capacity,
            "fragmentation_ratio": self.fragmentation,
            "alloc_retries_before_oom": self.retries,
        }


def _memory(ctx: Context, rank: int | None, t_oom: float | None) -> _Memory:
    sig, limits = ctx.sig, ctx.thresholds
    t = t_oom if t_oom is not None else sig.end
    retry_window = duration_seconds(limits.fragmentation_retry_window)
    growth_window = duration_seconds(limits.oom_risk_predict_window)
    if rank is None:
        return _Memory(
            None, t, t_oom is not None, None, None, None, None, 0, None, retry_window, growth_window
        )
    allocated = before(sig.allocated.get(rank), t)
    reserved = before(sig.reserved.get(rank), t)
    frag = before(sig.fragmentation.get(rank), t)
    if frag is None and reserved and allocated is not None:
        frag = (reserved - allocated) / reserved
    retries = [
        a
        for when, a in (increments(sig.alloc_retries[rank]) if rank in sig.alloc_retries else [])
        if t - retry_window <= when <= t
    ]
    past = between(sig.allocated.get(rank), t - growth_window, t)
    return _Memory(
        rank,
        t,
        t_oom is not None,
        allocated,
        reserved,
        before(sig.capacity.get(rank), t),
        frag,
        sum(retries),
        past[0] if past else None,
        retry_window,
        growth_window,
    )


def _fragmentation(ctx: Context, m: _Memory, log_ooms: list[Finding]) -> None:
    verdicts = [f.fields.get("verdict") for f in log_ooms]
    fragmented = (
        m.fragmentation is not None and m.fragmentation > ctx.thresholds.fragmentation_ratio
    )
    if not (fragmented or "fragmentation" in verdicts):
        return
    evidence = [m.line]
    if m.fragmentation is not None:
        evidence.append(
            f"{m.fragmentation:.0%} of reserved memory held no tensor "
            f"({contract.MEMORY_FRAGMENTATION.name})"
        )
    if m.retries:
        evidence.append(
            f"{m.retries:.0f} allocator retries (cudaMalloc after freeing the cache) in the "
            f"{m.retry_window / 60:g} min before "
            f"({contract.MEMORY_ALLOC_RETRIES.name})"
        )
    evidence += [
        f"log: {f.summary}" for f in log_ooms if f.fields.get("verdict") == "fragmentation"
    ]
    ctx.candidate(
        Candidate(
            Cause.MEMORY_FRAGMENTATION,
            f"Fragmented allocator cache on {m.where}: the request failed although "
            "reserved memory was largely free",
            0.9 if m.retries or "fragmentation" in verdicts else 0.75,
            evidence,
            [
                "Restart with PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True (the "
                "reserved-but-unallocated memory becomes usable); trainguard's OOM guard "
                "can split the failing step into micro-batches meanwhile.",
            ],
            [
                "Avoid tensor shapes that change every step (pad variable-length batches "
                "to buckets): each new shape leaves cached blocks no later request fits.",
            ],
            m.facts(),
        )
    )


def _growth(ctx: Context, m: _Memory) -> None:
    if not (m.allocated and m.earlier and m.allocated >= MEMORY_GROWTH * m.earlier):
        return
    ctx.candidate(
        Candidate(
            Cause.MEMORY_GROWTH,
            f"Memory held by tensors grew on {m.where} until it ran out",
            0.7,
            [
                m.line,
                f"allocated grew {m.allocated / m.earlier:.2f}x in the "
                f"{m.growth_window / 60:g} min before "
                f"({contract.MEMORY_ALLOCATED.name})",
            ],
            [
                "Restart from the last checkpoint; look for tensors kept across steps "
                "(losses appended without .item(), caches, growing sequence lengths)."
            ],
            ["Alert on TrainingOOMRisk (memory headroom trend) before it fails."],
            m.facts(),
        )
    )


def _does_not_fit(ctx: Context, m: _Memory) -> None:
    if not (m.allocated and m.capacity and m.allocated >= NEAR_CAPACITY * m.capacity):
        return
    ctx.candidate(
        Candidate(
            Cause.DOES_NOT_FIT,
            f"The step needs more memory than {m.where}'s GPU has",
            0.65,
            [m.line],
            [
                "Halve the micro-batch and keep the global batch with gradient "
                "accumulation (the remediation service's split_micro_batches)."
            ],
            [
                "Beyond smaller micro-batches and activation checkpointing: bf16, or shard "
                "parameters and optimizer state (FSDP/ZeRO)."
            ],
            m.facts(),
        )
    )


def _unexplained(ctx: Context, m: _Memory) -> None:
    ctx.candidate(
        Candidate(
            Cause.OOM_UNEXPLAINED,
            f"Out of memory on {m.where}; the memory series do not say why",
            0.3,
            [m.line],
            ["Restart from the last checkpoint with a smaller micro-batch."],
            ["Record a memory snapshot (torch.cuda.memory._record_memory_history)."],
            m.facts(),
        )
    )


@dataclass
class _Risk:
    """One rank's spell at risk: when the OOM-risk condition held, and its memory then."""

    rank: int
    start: float
    end: float
    headroom: float
    allocated: float | None
    reserved: float | None
    capacity: float | None
    predicted: float | None  # allocated bytes predicted at the horizon, where >= capacity
    growth: float | None  # allocated bytes per second while at risk (least squares)

    @property
    def to_capacity(self) -> float | None:
        """Seconds until allocated reaches capacity at the growth rate."""
        if not (self.growth and self.growth > 0 and self.capacity and self.allocated):
            return None
        return max(0.0, (self.capacity - self.allocated) / self.growth)

    def line(self) -> str:
        return (
            f"rank {self.rank} at {utc(self.end)}: allocated {(self.allocated or 0) / GIB:.2f} "
            f"GiB, reserved {(self.reserved or 0) / GIB:.2f} GiB of "
            f"{(self.capacity or 0) / GIB:.2f} GiB ({max(self.headroom, 0.0):.0%} free, "
            f"{contract.REC_RANK_MEMORY_HEADROOM})"
        )

    def facts(self) -> dict[str, object]:
        return {
            "rank": self.rank,
            "at_risk_since": self.start,
            "allocated_bytes": self.allocated,
            "reserved_bytes": self.reserved,
            "capacity_bytes": self.capacity,
            "headroom_ratio": self.headroom,
            "predicted_bytes": self.predicted,
            "growth_bytes_per_second": self.growth,
            "seconds_to_capacity": self.to_capacity,
        }


def _risk(ctx: Context) -> None:
    """Ranks with the TrainingOOMRisk alert's condition held as long as the alert holds it
    (``oom_risk_for``; a leak is restarted away soon after the alert fires):
    headroom under ``oom_risk_headroom_ratio``, or under ``oom_risk_predict_headroom_ratio``
    while allocations are predicted to reach capacity. A rank that ran out already is the
    OOM's."""
    sig, limits = ctx.sig, ctx.thresholds
    ran_out = {r for s in ctx.report.symptoms if s.failure is Failure.OOM for r in s.ranks}
    hold = max(1, math.ceil(duration_seconds(limits.oom_risk_for) / sig.step))
    risks: list[_Risk] = []
    for rank, headroom in sorted(sig.headroom.items()):
        if rank in ran_out:
            continue
        predicted = dict(sig.at_capacity[rank].points) if rank in sig.at_capacity else {}
        flags = [
            (
                t,
                v < limits.oom_risk_headroom_ratio
                or (v < limits.oom_risk_predict_headroom_ratio and t in predicted),
            )
            for t, v in headroom.points
            if not math.isnan(v)
        ]
        spell = runs(flags, hold)
        if spell is not None:
            risks.append(_at_risk(ctx, rank, spell, predicted))
    if not risks:
        return
    ranks = [r.rank for r in risks]
    predicted_any = any(r.predicted for r in risks)
    ctx.symptom(
        Symptom(
            Failure.OOM,
            f"Memory close to capacity on {ranks_text(ranks)}: out-of-memory risk, no OOM yet",
            [contract.REC_RANK_MEMORY_HEADROOM]
            + ([contract.REC_RANK_MEMORY_AT_CAPACITY] if predicted_any else []),
            min(r.start for r in risks),
            ranks,
            sorted({sig.node_of(r) for r in ranks if sig.node_of(r)}),
            1,
        ),
        ctx.rank_scope(ranks, "its memory is about to run out; nothing has failed yet"),
    )
    # Growing: the alert's own prediction held, or the growth while at risk reaches capacity
    # within the alert's horizon.
    horizon = limits.oom_risk_predict_horizon_seconds
    creeping = [
        r for r in risks if r.predicted or (r.to_capacity is not None and r.to_capacity <= horizon)
    ]
    flat = [r for r in risks if r not in creeping]
    cap = _BESIDE_AN_OOM if ran_out else 1.0
    if creeping:
        ctx.candidate(_creep(creeping, min(0.6, cap)))
    if flat:
        ctx.candidate(_headroom(flat, min(0.4, cap)))


def _at_risk(
    ctx: Context, rank: int, spell: tuple[float, float], predicted: dict[float, float]
) -> _Risk:
    sig = ctx.sig
    start, end = spell
    points = [
        (t, v)
        for t, v in (sig.allocated[rank].points if rank in sig.allocated else [])
        if start <= t <= end and not math.isnan(v)
    ]
    growth = None
    if len({t for t, _ in points}) >= 2:
        growth = statistics.linear_regression(*zip(*points, strict=True)).slope
    headroom = [v for t, v in sig.headroom[rank].points if t <= end and not math.isnan(v)]
    in_spell = [v for t, v in predicted.items() if start <= t <= end]
    return _Risk(
        rank,
        start,
        end,
        headroom[-1],
        before(sig.allocated.get(rank), end + sig.step / 2),
        before(sig.reserved.get(rank), end + sig.step / 2),
        before(sig.capacity.get(rank), end + sig.step / 2),
        in_spell[-1] if in_spell else None,
        growth,
    )


def _creep(risks: list[_Risk], confidence: float) -> Candidate:
    worst = min(risks, key=lambda r: (r.to_capacity is None, r.to_capacity or 0.0))
    evidence = []
    for r in risks[:_RISK_RANKS_SHOWN]:
        evidence.append(r.line())
        if r.growth is not None and r.growth > 0:
            until = r.to_capacity
            evidence.append(
                f"rank {r.rank}: allocated grew {r.growth / MIB:.1f} MiB/s while at risk "
                f"(since {utc(r.start)}, {contract.MEMORY_ALLOCATED.name})"
                + (f"; at that rate it reaches capacity in {until:.0f} s" if until else "")
            )
        if r.predicted:
            evidence.append(
                f"rank {r.rank}: allocations predicted to reach {r.predicted / GIB:.2f} GiB, "
                f"at or above capacity ({contract.REC_RANK_MEMORY_AT_CAPACITY})"
            )
    return Candidate(
        Cause.MEMORY_CREEP,
        f"Memory held by tensors grows on {ranks_text([r.rank for r in risks])} toward the "
        "GPU's capacity; it will run out unless the growth stops",
        confidence,
        evidence,
        [
            "Checkpoint now (trainguard-remediation's checkpoint_now for TrainingOOMRisk), so "
            "the OOM, when it comes, costs little.",
            "Look for tensors kept across steps (losses appended without .item(), caches, "
            "growing sequence lengths) in the growing rank's code path.",
        ],
        ["Alert on TrainingOOMRisk (it fired here) and act on it before the OOM."],
        worst.facts(),
    )


def _headroom(risks: list[_Risk], confidence: float) -> Candidate:
    worst = min(risks, key=lambda r: r.headroom)
    return Candidate(
        Cause.LOW_MEMORY_HEADROOM,
        f"Little free memory on {ranks_text([r.rank for r in risks])}, not growing: the next "
        "allocation peak (a longer batch, an evaluation step) may not fit",
        confidence,
        [r.line() for r in risks[:_RISK_RANKS_SHOWN]],
        [
            "Nothing has failed: before a peak, restart with "
            "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True or a smaller micro-batch."
        ],
        ["Leave headroom for the largest step (the longest sequence, evaluation)."],
        worst.facts(),
    )


# --- prevention -------------------------------------------------------------------------------
@prevents(Cause.MEMORY_FRAGMENTATION)
def _expandable_segments(ctx: Context, c: Candidate) -> list[Setting]:
    frag, retries = c.facts.get("fragmentation_ratio"), c.facts.get("alloc_retries_before_oom")
    evidence = [f"{frag:.0%} of the reserved memory held no tensor before the OOM"] if frag else []
    if retries:
        evidence.append(f"{retries:.0f} allocator retries (cudaMalloc after emptying the cache)")
    evidence += [f"log: {f.summary}" for f in ctx.findings(Failure.OOM)]
    return [
        Setting(
            "PYTORCH_CUDA_ALLOC_CONF",
            "expandable_segments:True",
            ENV,
            [*evidence, "segments that grow in place leave no unusable gaps between blocks"],
        )
    ]


@prevents(Cause.DOES_NOT_FIT)
def _micro_batches(ctx: Context, c: Candidate) -> list[Setting]:
    """Split the step so its peak fits with headroom; the OOM guard's own split when it found
    one that worked."""
    allocated, capacity = c.facts.get("allocated_bytes"), c.facts.get("capacity_bytes")
    recovered = [e for e in ctx.events(EventKind.OOM_RECOVERED.value) if e.details]
    splits = [int(s) for e in recovered if str(s := e.details.get("micro_batches", "")).isdigit()]
    if splits:
        split = max(splits)
        evidence = [
            f"trainguard's OOM guard recovered the step in {split} micro-batches "
            f"({len(recovered)} oom_recovered event(s))"
        ]
    elif allocated and capacity:
        tried = max(
            (int(f.fields.get("tried_bytes", 0)) for f in ctx.findings(Failure.OOM)), default=0
        )
        needed = allocated + tried
        # Activations scale with the micro-batch, parameters and optimizer state do not: the
        # split is the least that could fit, a power of two so the batch divides evenly.
        split = 2 ** max(1, math.ceil(math.log2(needed / (NEAR_CAPACITY * capacity))))
        evidence = [
            f"the step held {allocated / GIB:.1f} GiB"
            + (f" and asked for {tried / GIB:.1f} GiB more" if tried else "")
            + f" on a {capacity / GIB:.1f} GiB GPU; {split} micro-batches bring its "
            f"activations under {NEAR_CAPACITY:.0%} of capacity if activations dominate"
        ]
    else:
        return []
    held = (
        f"{allocated / GIB:.1f} GiB of {capacity / GIB:.1f} GiB allocated at the failing step"
        if allocated and capacity
        else f"the step fit only in {split} micro-batches"
    )
    return [
        Setting(
            "micro-batch size / gradient accumulation steps",
            f"micro-batch / {split}, gradient_accumulation_steps x {split} (global batch kept)",
            SCRIPT,
            evidence,
        ),
        Setting(
            "activation checkpointing",
            "on for every transformer block (torch.utils.checkpoint, or FSDP's "
            "apply_activation_checkpointing)",
            SCRIPT,
            [
                f"{held}; recomputing activations in backward trades about a third more "
                "compute for most of their memory"
            ],
        ),
    ]


@prevents(Cause.MEMORY_GROWTH, Cause.MEMORY_CREEP)
def _memory_history(ctx: Context, c: Candidate) -> list[Setting]:
    evidence = [e for e in c.evidence if "grew" in e] or c.evidence[:1]
    return [
        Setting(
            "torch.cuda.memory._record_memory_history",
            "max_entries=100000, dumped with torch.cuda.memory._dump_snapshot on OOM",
            SCRIPT,
            [*evidence, "the memory series do not say which tensors held it; a snapshot does"],
        )
    ]


@prevents(Cause.OOM_UNEXPLAINED)
def _unexplained_settings(ctx: Context, c: Candidate) -> list[Setting]:
    return _micro_batches(ctx, c) + _memory_history(ctx, c)
