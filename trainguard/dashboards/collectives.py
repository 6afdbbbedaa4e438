"""Collectives: gradient sync and parameter all-gather latency (exemplars link to traces),
hangs and NCCL."""

from __future__ import annotations

from trainguard import contract as c
from trainguard.dashboards.panels import (
    JOB_FILTER,
    RANK_FILTER,
    RATE,
    DashboardSpec,
    PanelBuilder,
    Query,
    grid,
    increase,
    quantile,
    rank_variables,
    series,
)
from trainguard.thresholds import Thresholds


def _gradient_sync() -> list[PanelBuilder]:
    """Row "Gradient sync"."""
    f = RANK_FILTER
    sync = c.GRAD_SYNC_DURATION.name
    return [
        series(
            "Gradient sync latency",
            "p50/p99 of gradient synchronisation over the selected ranks. The dots "
            "are exemplars: click one to open that step's trace in Jaeger.",
            "s",
            Query(quantile(0.5, sync, f), "p50", exemplar=True),
            Query(quantile(0.99, sync, f), "p99", exemplar=True),
        ),
        series(
            "Gradient sync time by rank (mean)",
            "A rank with a much lower mean than its peers is the one they wait for.",
            "s",
            Query(f"{c.REC_RANK_GRAD_SYNC_MEAN}{{{f}}}", "rank {{rank}}"),
        ),
        series(
            "Parameter all-gather latency (FSDP)",
            "p50/p99 of the time sharded jobs spend gathering parameters per step (per FSDP "
            "unit in bucket mode); empty for DDP. Exemplars open that step's trace.",
            "s",
            Query(quantile(0.5, c.PARAM_GATHER_DURATION.name, f), "p50", exemplar=True),
            Query(quantile(0.99, c.PARAM_GATHER_DURATION.name, f), "p99", exemplar=True),
        ),
        series(
            "Gradient bytes synchronised",
            "Bytes per second each rank synchronises.",
            "Bps",
            Query(
                f"sum by (rank) (rate({c.GRAD_SYNC_BYTES.name}{{{f}}}[{RATE}]))",
                "rank {{rank}}",
            ),
        ),
        series(
            "Collectives launched per second",
            "In a hang, the rank that stops launching is the one the others wait for.",
            "ops",
            Query(
                f"sum by (rank) (rate({c.COLLECTIVES_LAUNCHED.name}{{{f}}}[{RATE}]))",
                "rank {{rank}}",
            ),
        ),
    ]


def _hangs() -> list[PanelBuilder]:
    """Row "Hangs"."""
    f = RANK_FILTER
    return [
        series(
            "Oldest in-flight collective",
            "Age of each rank's oldest unfinished collective and the job's stall threshold.",
            "s",
            Query(f"{c.COLLECTIVE_OLDEST_INFLIGHT.name}{{{f}}}", "rank {{rank}}"),
            Query(
                f"{c.REC_JOB_STALL_THRESHOLD}{{{JOB_FILTER}}}",
                "threshold {{job_id}}",
            ),
            width=8,
        ),
        series(
            "Collectives in flight",
            "Collectives launched and not completed; a rank at 0 while the others "
            "wait is stuck before the collective.",
            "short",
            Query(f"{c.COLLECTIVE_INFLIGHT.name}{{{f}}}", "rank {{rank}}"),
            width=8,
        ),
        series(
            "Stalls and timeouts",
            "Watchdog stall detections and collectives past the process group timeout.",
            "short",
            Query(increase(c.COLLECTIVE_STALLS, f, "rank"), "stalls rank {{rank}}"),
            Query(
                increase(c.COLLECTIVE_TIMEOUTS, f, "rank"),
                "timeouts rank {{rank}}",
            ),
            width=8,
        ),
        grid(
            "Suspect rank of a hang",
            "Per job, the rank that launched the fewest collectives (or has none in "
            "flight): read its Flight Recorder dump first.",
            Query(f"{c.REC_JOB_COLLECTIVE_LAGGARD}{{{JOB_FILTER}}}"),
            width=12,
        ),
        grid(
            "NCCL communicators on these nodes",
            "Version, transports and interface NCCL chose; NET/Socket where "
            "InfiniBand was expected is NcclSocketTransportFallback.",
            Query(f'{c.NCCL_INFO.name}{{node=~"$node"}}'),
            width=12,
        ),
        series(
            "NCCL log errors",
            "NCCL warnings and errors in the nodes' debug logs, by kind.",
            "short",
            Query(
                f"sum by (node, kind) (increase({c.NCCL_LOG_ERRORS.name}"
                f'{{node=~"$node"}}[{RATE}]))',
                "{{node}} {{kind}}",
            ),
            width=24,
        ),
    ]


def dashboard(t: Thresholds) -> DashboardSpec:
    """The *Collectives* dashboard, row by row."""
    return DashboardSpec(
        uid="trainguard-collectives",
        title="trainguard / Collectives",
        description="Gradient sync latency (with exemplars linking to traces), hangs and NCCL.",
        variables=rank_variables(),
        rows=[("Gradient sync", _gradient_sync()), ("Hangs", _hangs())],
    )
