"""Data-loader-bound ranks: data wait above ``dataloader_wait_ratio`` of the step, sustained."""

from __future__ import annotations

from trainguard import contract
from trainguard.contract import Failure
from trainguard.diagnose.context import Context, ranks_text, runs
from trainguard.diagnose.model import Candidate, Scope, ScopeLevel, Symptom


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
            "data_loading",
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
