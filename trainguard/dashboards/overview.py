"""Training overview: throughput, stragglers, memory and hangs of training jobs at a glance."""

from __future__ import annotations

from trainguard import contract as c
from trainguard.dashboards.panels import (
    JOB_FILTER,
    RANK_FILTER,
    DashboardSpec,
    PanelBuilder,
    Query,
    grid,
    increase,
    rank_heatmap,
    rank_variables,
    series,
)
from trainguard.thresholds import Thresholds


def _progress(t: Thresholds) -> list[PanelBuilder]:
    """Row "Progress"."""
    f = RANK_FILTER
    return [
        series(
            "Steps per second",
            "Training steps completed per second (the slowest rank sets the pace).",
            "ops",
            Query(f"{c.REC_JOB_STEPS_RATE}{{{JOB_FILTER}}}", "{{job_id}}"),
        ),
        series(
            "Step time by phase",
            "Mean time of each step phase over the selected ranks.",
            "s",
            Query(
                f"avg by (phase) ({c.REC_RANK_PHASE_MEAN}{{{f}}})",
                "{{phase}}",
            ),
            stacked=True,
        ),
        rank_heatmap(
            "Per-rank step compute time",
            "Each row is a rank; a row hotter than the others is a straggler. "
            "Compute time, not step time: in synchronous training every rank's "
            "step takes as long as the slowest one.",
            "s",
            Query(f"{c.REC_RANK_COMPUTE_MEAN}{{{f}}}", "{{rank}}"),
        ),
        series(
            "Straggler ratio",
            "Each rank's compute time over the job median; "
            "TrainingStraggler fires at the threshold line.",
            "x",
            Query(f"{c.REC_RANK_COMPUTE_RATIO}{{{f}}}", "rank {{rank}} ({{node}})"),
            threshold=t.straggler_factor,
        ),
    ]


def _memory_and_hangs() -> list[PanelBuilder]:
    """Row "Memory and hangs"."""
    f = RANK_FILTER
    return [
        series(
            "Memory headroom",
            "Share of device memory not reserved by the caching allocator.",
            "percentunit",
            Query(f"{c.REC_RANK_MEMORY_HEADROOM}{{{f}}}", "rank {{rank}}"),
            width=8,
        ),
        series(
            "OOM events",
            "Out-of-memory errors inside training steps, and those the OOM guard "
            "recovered by splitting the batch.",
            "short",
            Query(increase(c.OOM_EVENTS, f, "rank"), "OOM rank {{rank}}"),
            Query(
                increase(c.OOM_RECOVERIES, f, "rank"),
                "recovered rank {{rank}}",
            ),
            width=8,
        ),
        series(
            "Oldest in-flight collective",
            "Age of each rank's oldest unfinished collective against the job's "
            "stall threshold (TrainingCollectiveStalled).",
            "s",
            Query(
                f"{c.COLLECTIVE_OLDEST_INFLIGHT.name}{{{f}}}",
                "rank {{rank}}",
            ),
            Query(
                f"{c.REC_JOB_STALL_THRESHOLD}{{{JOB_FILTER}}}",
                "threshold {{job_id}}",
            ),
            width=8,
        ),
        grid(
            "Firing alerts",
            "trainguard alerts firing for the selected jobs, and node alerts.",
            Query(
                'ALERTS{alertstate="firing",job_id=~"$job_id|"}',
            ),
        ),
    ]


def _trainguard_itself() -> list[PanelBuilder]:
    """Row "trainguard itself"."""
    f = RANK_FILTER
    return [
        series(
            "Instrumentation errors",
            "Failures inside the hook, by component (caught; training went on).",
            "short",
            Query(
                increase(c.INSTRUMENTATION_ERRORS, f, "rank, component"),
                "rank {{rank}} {{component}}",
            ),
        ),
        series(
            "Spans dropped",
            "Spans that could not be exported (collector down, queue full).",
            "short",
            Query(increase(c.SPANS_DROPPED, f, "rank"), "rank {{rank}}"),
        ),
    ]


def _membership() -> list[PanelBuilder]:
    """Row "Ranks and restarts" (last, so that the panel ids before it stay as they were)."""
    return [
        series(
            "Worker group restarts",
            "Times torchrun restarted each job's worker group since it started "
            "(TrainingRankRestarted), and the world size it formed each time.",
            "short",
            Query(
                f"max by (job_id) ({c.ELASTIC_RESTARTS.name}{{{JOB_FILTER}}})",
                "restarts {{job_id}}",
            ),
            Query(
                f"max by (job_id) ({c.WORLD_SIZE.name}{{{JOB_FILTER}}})", "world size {{job_id}}"
            ),
            width=24,
        ),
    ]


def dashboard(t: Thresholds) -> DashboardSpec:
    """The *Training overview* dashboard, row by row."""
    return DashboardSpec(
        uid="trainguard-overview",
        title="trainguard / Training overview",
        description="Throughput, stragglers, memory, hangs and restarts of training jobs at a "
        "glance.",
        variables=rank_variables(),
        rows=[
            ("Progress", _progress(t)),
            ("Memory and hangs", _memory_and_hangs()),
            ("trainguard itself", _trainguard_itself()),
            ("Ranks and restarts", _membership()),
        ],
    )
