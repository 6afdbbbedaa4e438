"""Stragglers: which rank is slow, in which phase, and whether its GPU is throttling."""

from __future__ import annotations

from trainguard import contract as c
from trainguard.dashboards.panels import (
    JOB_FILTER,
    RANK_FILTER,
    DashboardSpec,
    PanelBuilder,
    Query,
    rank_variables,
    series,
)
from trainguard.thresholds import Thresholds


def _who_is_slow(t: Thresholds) -> list[PanelBuilder]:
    """Row "Who is slow"."""
    f = RANK_FILTER
    return [
        series(
            "Compute time vs job median",
            "Each rank's step compute time (local work, no waiting on peers).",
            "s",
            Query(f"{c.REC_RANK_COMPUTE_MEAN}{{{f}}}", "rank {{rank}} ({{node}})"),
            Query(f"{c.REC_JOB_COMPUTE_MEDIAN}{{{JOB_FILTER}}}", "median {{job_id}}"),
        ),
        series(
            "Straggler ratio",
            "Compute time over the job median.",
            "x",
            Query(f"{c.REC_RANK_COMPUTE_RATIO}{{{f}}}", "rank {{rank}} ({{node}})"),
            threshold=t.straggler_factor,
        ),
        series(
            "Excess over the median, by phase",
            "Seconds a rank spends above the job median in data loading, forward "
            "and backward compute: the phase that makes it slow.",
            "s",
            Query(
                f"{c.REC_RANK_PHASE_COMPUTE_EXCESS}{{{f}}} > 0",
                "rank {{rank}} {{phase}}",
            ),
            stacked=True,
        ),
        series(
            "Waiting on peers",
            "Time each rank spends blocked on the others at gradient sync; the "
            "straggler is the rank that waits least.",
            "s",
            Query(f"{c.REC_RANK_SYNC_WAIT_MEAN}{{{f}}}", "rank {{rank}}"),
        ),
    ]


def _why() -> list[PanelBuilder]:
    """Row "Why"."""
    f = RANK_FILTER
    return [
        series(
            "Data wait share of the step",
            "Share of each step spent waiting for the dataloader.",
            "percentunit",
            Query(f"{c.REC_RANK_DATA_WAIT_RATIO}{{{f}}}", "rank {{rank}}"),
            width=8,
        ),
        series(
            "GPU clock throttling on these nodes",
            "1 while a GPU's clocks are held down, by reason.",
            "short",
            Query(
                f"max by (node, gpu, reason) ({c.GPU_CLOCK_THROTTLED.name}"
                f'{{node=~"$node",reason!="gpu_idle"}}) > 0',
                "{{node}} gpu {{gpu}} {{reason}}",
            ),
            width=8,
        ),
        series(
            "GPU utilization on these nodes",
            "A straggler's GPU is often busier (or idler, when data-bound).",
            "percentunit",
            Query(
                f'{c.GPU_UTILIZATION.name}{{node=~"$node"}}',
                "{{node}} gpu {{gpu}}",
            ),
            width=8,
        ),
    ]


def dashboard(t: Thresholds) -> DashboardSpec:
    """The *Stragglers* dashboard, row by row."""
    return DashboardSpec(
        uid="trainguard-stragglers",
        title="trainguard / Stragglers",
        description="Which rank is slow, in which phase, and whether its GPU is throttling.",
        variables=rank_variables(),
        rows=[("Who is slow", _who_is_slow(t)), ("Why", _why())],
    )
