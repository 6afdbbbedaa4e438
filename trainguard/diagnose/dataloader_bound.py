"""Data-loader-bound ranks: data wait above ``dataloader_wait_ratio`` of the step, sustained."""

from __future__ import annotations

import math
import statistics

from trainguard import contract
from trainguard.contract import Cause, Failure
from trainguard.diagnose.analysis import explains
from trainguard.diagnose.context import Context, job_median, ranks_text, runs
from trainguard.diagnose.model import Candidate, Scope, ScopeLevel, Setting, Symptom
from trainguard.diagnose.prevent import SCRIPT, prevents
from trainguard.diagnose.straggler import median_breakdown


def bound_ranks(ctx: Context) -> list[int]:
    """Ranks whose data wait stays above the thresholds' share of their step time."""
    sig, ratio = ctx.sig, ctx.thresholds.dataloader_wait_ratio
    flagged = []
    for rank, phases in sig.phases.items():
        data, step = phases.get("data"), sig.step_time.get(rank)
        if data is None or step is None:
            continue
        steps = dict(step.points)
        ratios = [(t, v / steps[t]) for t, v in data.points if steps.get(t)]
        if runs([(t, r > ratio) for t, r in ratios], ctx.min_points):
            flagged.append(rank)
    return sorted(flagged)


@explains(Failure.DATALOADER_BOUND, after=(Failure.STRAGGLER,))
def analyse(ctx: Context) -> None:
    """Data loading that bounds every rank, or some ranks the straggler analysis did not
    already explain by it."""
    flagged = bound_ranks(ctx)
    if not flagged:
        return
    everyone = len(flagged) == len(ctx.sig.ranks)
    if not everyone and ctx.worst_rank in flagged:
        return  # the straggler analysis already names data loading for this rank
    ratio = ctx.thresholds.dataloader_wait_ratio
    ctx.symptom(
        Symptom(
            Failure.DATALOADER_BOUND,
            f"Data loading bounds {('every rank' if everyone else ranks_text(flagged))}: "
            f"over {ratio:.0%} of each step waits for the next batch",
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
        else ctx.rank_scope(flagged, "these ranks' data loading"),
    )
    ctx.candidate(
        Candidate(
            Cause.DATA_LOADING,
            "The input pipeline cannot keep up with the GPUs",
            0.75,
            [f"data wait above {ratio:.0%} of step time on {ranks_text(flagged)}"],
            [
                "Raise DataLoader num_workers and prefetch_factor; pin_memory=True; check "
                "the read throughput of the dataset's storage."
            ],
            ["Pre-shard and cache the dataset close to the nodes; decode on the GPU."],
            {"ranks": flagged},
        )
    )


@prevents(Cause.DATA_LOADING)
def _loader_settings(ctx: Context, c: Candidate) -> list[Setting]:
    sig = ctx.sig
    found = c.facts.get("ranks") or [c.facts.get("worst_rank")]
    ranks = [r for r in found if isinstance(r, int)]
    data = median_breakdown(sig, ranks, sig.start, sig.end).get("data")
    medians = job_median(sig.compute)
    compute = statistics.median(medians.values()) if medians else None
    value = "prefetch_factor=4, pin_memory=True, persistent_workers=True"
    if data is None or compute is None or compute <= data:
        return [Setting("DataLoader(...)", f"num_workers raised, {value}", SCRIPT, c.evidence[:1])]
    # The loader delivers a batch every (data wait + the rest of the step) and the GPU takes
    # one every (rest of the step): the workers must scale by the ratio of the two.
    rest = compute - data
    factor = math.ceil(compute / rest * 10) / 10
    return [
        Setting(
            "DataLoader(...)",
            f"num_workers x {factor:g} at least, {value}",
            SCRIPT,
            [
                f"{ranks_text(ranks)} waited {data:.3f} s for data in a {compute:.3f} s step "
                f"whose other work takes {rest:.3f} s: the loader must deliver "
                f"{compute / rest:.2f}x as fast"
            ],
        )
    ]
