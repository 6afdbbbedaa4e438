"""Memory and OOM: device memory per rank, headroom, fragmentation and OOM events."""

from __future__ import annotations

from trainguard import contract as c
from trainguard.dashboards.panels import (
    RANK_FILTER,
    DashboardSpec,
    PanelBuilder,
    Query,
    increase,
    rank_variables,
    series,
)
from trainguard.thresholds import Thresholds


def _memory() -> list[PanelBuilder]:
    """Row "Memory"."""
    f = RANK_FILTER
    return [
        series(
            "Allocated, reserved and capacity",
            "Memory held by tensors, reserved by the caching allocator, and the "
            "device (or cgroup) limit.",
            "bytes",
            Query(f"{c.MEMORY_ALLOCATED.name}{{{f}}}", "allocated rank {{rank}}"),
            Query(f"{c.MEMORY_RESERVED.name}{{{f}}}", "reserved rank {{rank}}"),
            Query(
                f"max by (node) ({c.MEMORY_CAPACITY.name}{{{f}}})",
                "capacity {{node}}",
            ),
        ),
        series(
            "Headroom",
            "Share of memory not reserved; TrainingOOMRisk fires below 5%.",
            "percentunit",
            Query(f"{c.REC_RANK_MEMORY_HEADROOM}{{{f}}}", "rank {{rank}}"),
        ),
        series(
            "Allocated memory in one hour, extrapolated",
            "Where allocations head if they keep growing as over the last 30 min.",
            "bytes",
            Query(
                f"predict_linear({c.MEMORY_ALLOCATED.name}{{{f}}}[30m], 3600)",
                "rank {{rank}}",
            ),
        ),
        series(
            "Fragmentation",
            "Share of reserved memory holding no tensor.",
            "percentunit",
            Query(f"{c.MEMORY_FRAGMENTATION.name}{{{f}}}", "rank {{rank}}"),
        ),
    ]


def _oom() -> list[PanelBuilder]:
    """Row "OOM"."""
    f = RANK_FILTER
    return [
        series(
            "OOM events and recoveries",
            "Out-of-memory errors, and the steps the OOM guard saved by splitting the batch.",
            "short",
            Query(increase(c.OOM_EVENTS, f, "rank"), "OOM rank {{rank}}"),
            Query(increase(c.OOM_RECOVERIES, f, "rank"), "recovered rank {{rank}}"),
        ),
        series(
            "Allocator retries",
            "cudaMalloc retries after freeing the cache: memory pressure.",
            "short",
            Query(increase(c.MEMORY_ALLOC_RETRIES, f, "rank"), "rank {{rank}}"),
        ),
    ]


def dashboard(t: Thresholds) -> DashboardSpec:
    """The *Memory and OOM* dashboard, row by row."""
    return DashboardSpec(
        uid="trainguard-memory",
        title="trainguard / Memory and OOM",
        description="Device memory per rank, headroom, fragmentation and OOM events.",
        variables=rank_variables(),
        rows=[("Memory", _memory()), ("OOM", _oom())],
    )
