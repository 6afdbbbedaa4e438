"""GPUs: per-node GPU health from trainguard-exporter."""

from __future__ import annotations

from trainguard import contract as c
from trainguard.dashboards.panels import (
    GPU_FILTER,
    RATE,
    DashboardSpec,
    PanelBuilder,
    Query,
    gpu_variables,
    grid,
    increase,
    series,
)
from trainguard.thresholds import Thresholds


def _load() -> list[PanelBuilder]:
    """Row "Load"."""
    f = GPU_FILTER
    return [
        series(
            "Utilization",
            "Share of time the GPU was busy.",
            "percentunit",
            Query(f"{c.GPU_UTILIZATION.name}{{{f}}}", "{{node}} gpu {{gpu}}"),
        ),
        series(
            "Memory used",
            "Framebuffer memory used against the total.",
            "bytes",
            Query(f"{c.GPU_MEMORY_USED.name}{{{f}}}", "used {{node}} gpu {{gpu}}"),
            Query(f"{c.GPU_MEMORY_TOTAL.name}{{{f}}}", "total {{node}} gpu {{gpu}}"),
        ),
        series(
            "Temperature",
            "GPU core temperature.",
            "celsius",
            Query(f"{c.GPU_TEMPERATURE.name}{{{f}}}", "{{node}} gpu {{gpu}}"),
            width=8,
        ),
        series(
            "Power",
            "Power draw.",
            "watt",
            Query(f"{c.GPU_POWER.name}{{{f}}}", "{{node}} gpu {{gpu}}"),
            width=8,
        ),
        series(
            "SM clock",
            "Streaming multiprocessor clock; a drop under load is throttling.",
            "hertz",
            Query(f"{c.GPU_SM_CLOCK.name}{{{f}}}", "{{node}} gpu {{gpu}}"),
            width=8,
        ),
    ]


def _health() -> list[PanelBuilder]:
    """Row "Health"."""
    f = GPU_FILTER
    return [
        series(
            "Clock throttle reasons",
            "1 while the clocks are held down for the reason.",
            "short",
            Query(
                f'{c.GPU_CLOCK_THROTTLED.name}{{{f},reason!="gpu_idle"}} > 0',
                "{{node}} gpu {{gpu}} {{reason}}",
            ),
        ),
        series(
            "Xid errors",
            "NVIDIA Xid errors by code (GpuXidError).",
            "short",
            Query(increase(c.GPU_XID_ERRORS, f, "node, gpu, xid"), "{{node}} {{xid}}"),
        ),
        series(
            "ECC errors",
            "Corrected and uncorrected ECC errors.",
            "short",
            Query(increase(c.GPU_ECC_ERRORS, f, "node, gpu, kind"), "{{node}} {{kind}}"),
            width=8,
        ),
        series(
            "NVML and GPUs answering",
            "1 while NVML and each GPU answer the exporter (GpuNvmlDown).",
            "short",
            Query(f'{c.NVML_UP.name}{{node=~"$node"}}', "nvml {{node}}"),
            Query(f"{c.GPU_UP.name}{{{f}}}", "{{node}} gpu {{gpu}}"),
            width=8,
        ),
        series(
            "NVLink traffic",
            "NVLink bytes per second, by direction.",
            "Bps",
            Query(
                f"sum by (node, gpu, direction) (rate({c.GPU_NVLINK_BYTES.name}{{{f}}}[{RATE}]))",
                "{{node}} gpu {{gpu}} {{direction}}",
            ),
            width=8,
        ),
        series(
            "Exporter collectors",
            "1 while each collector of the node's exporter succeeds.",
            "short",
            Query(
                f'{c.EXPORTER_COLLECTOR_SUCCESS.name}{{node=~"$node"}}',
                "{{node}} {{collector}}",
            ),
            width=24,
        ),
        grid(
            "Training processes on these GPUs",
            "Which job and rank runs on which GPU.",
            Query(f"{c.GPU_PROCESS_INFO.name}{{{f}}}"),
        ),
    ]


def dashboard(t: Thresholds) -> DashboardSpec:
    """The *GPUs* dashboard, row by row."""
    return DashboardSpec(
        uid="trainguard-gpus",
        title="trainguard / GPUs",
        description="Per-node GPU health from trainguard-exporter (its trainguard_gpu_* series "
        "are exported with and without --dcgm-compat).",
        variables=gpu_variables(),
        rows=[("Load", _load()), ("Health", _health())],
    )
