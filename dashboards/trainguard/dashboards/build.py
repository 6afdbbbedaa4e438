"""Builds trainguard's Grafana dashboards with grafana-foundation-sdk.

The ``*.json`` files beside it are this module's output, committed so Grafana's file
provisioning can load them without Python, and kept in step by
``trainguard dashboards --check`` (run by the test suite). Every metric name comes from
``trainguard.contract`` (metrics and recording rules); every Prometheus query filters on the
dashboard's variables.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field

from grafana_foundation_sdk.builders import common as common_builders
from grafana_foundation_sdk.builders import dashboard as dash
from grafana_foundation_sdk.builders import heatmap, prometheus, stat, table, timeseries
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models import common
from grafana_foundation_sdk.models.dashboard import (
    DashboardCursorSync,
    DataSourceRef,
    Threshold,
    ThresholdsMode,
    VariableRefresh,
    VariableSort,
)
from grafana_foundation_sdk.models.heatmap import HeatmapColorMode
from grafana_foundation_sdk.models.prometheus import PromQueryFormat

from trainguard import contract as c

# Fixed datasource uids: deploy/grafana/provisioning/datasources/trainguard.yml creates them.
PROMETHEUS_UID = "trainguard-prometheus"
JAEGER_UID = "trainguard-jaeger"
ELASTICSEARCH_UID = "trainguard-elasticsearch"
PROMETHEUS = DataSourceRef(type_val="prometheus", uid=PROMETHEUS_UID)

TAGS = ["trainguard"]
RANK_FILTER = 'job_id=~"$job_id",node=~"$node",rank=~"$rank"'
JOB_FILTER = 'job_id=~"$job_id"'
GPU_FILTER = 'node=~"$node",gpu=~"$gpu"'
REMEDIATION_FILTER = 'instance=~"$instance"'
RATE = "$__rate_interval"


def _exposed(spec: c.MetricSpec) -> str:
    """The series name Prometheus stores for ``spec`` (info metrics gain ``_info``)."""
    return spec.client_name + "_info" if spec.kind is c.MetricKind.INFO else spec.name


PanelBuilder = timeseries.Panel | stat.Panel | table.Panel | heatmap.Panel


@dataclass(frozen=True)
class Query:
    """One Prometheus query of a panel."""

    expr: str
    legend: str = ""
    exemplar: bool = False
    instant: bool = False


@dataclass(frozen=True)
class DashboardSpec:
    """A dashboard: its variables and its rows of panels."""

    uid: str
    title: str
    description: str
    variables: Sequence[dash.QueryVariable]
    rows: Sequence[tuple[str, Sequence[PanelBuilder]]] = field(default=())


def _target(query: Query, ref: str) -> prometheus.Dataquery:
    target = prometheus.Dataquery().expr(query.expr).ref_id(ref).datasource(PROMETHEUS)
    if query.legend:
        target = target.legend_format(query.legend)
    if query.exemplar:
        target = target.exemplar(True)
    if query.instant:
        target = target.instant().format(PromQueryFormat.TABLE)
    return target


def _with_targets(panel: PanelBuilder, queries: Sequence[Query]) -> None:
    for index, query in enumerate(queries):
        panel.with_target(_target(query, chr(ord("A") + index)))


def series(
    title: str,
    description: str,
    unit: str,
    *queries: Query,
    stacked: bool = False,
    threshold: float | None = None,
    width: int = 12,
) -> timeseries.Panel:
    panel = (
        timeseries.Panel()
        .title(title)
        .description(description)
        .datasource(PROMETHEUS)
        .unit(unit)
        .height(8)
        .span(width)
        .legend(
            common_builders.VizLegendOptions()
            .display_mode(common.LegendDisplayMode.TABLE)
            .placement(common.LegendPlacement.RIGHT)
            .show_legend(True)
            .calcs(["lastNotNull", "max"])
        )
    )
    if stacked:
        panel = panel.stacking(
            common_builders.StackingConfig().mode(common.StackingMode.NORMAL)
        ).fill_opacity(40)
    if threshold is not None:
        panel = panel.thresholds(
            dash.ThresholdsConfig()
            .mode(ThresholdsMode.ABSOLUTE)
            .steps([Threshold(value=None, color="green"), Threshold(value=threshold, color="red")])
        ).thresholds_style(
            common_builders.GraphThresholdsStyleConfig().mode(common.GraphTresholdsStyleMode.LINE)
        )
    _with_targets(panel, queries)
    return panel


def single(title: str, description: str, unit: str, query: Query, width: int = 6) -> stat.Panel:
    panel = (
        stat.Panel()
        .title(title)
        .description(description)
        .datasource(PROMETHEUS)
        .unit(unit)
        .height(5)
        .span(width)
    )
    _with_targets(panel, [query])
    return panel


def grid(title: str, description: str, query: Query, width: int = 24) -> table.Panel:
    panel = (
        table.Panel()
        .title(title)
        .description(description)
        .datasource(PROMETHEUS)
        .height(8)
        .span(width)
    )
    _with_targets(panel, [Query(query.expr, query.legend, instant=True)])
    return panel


def rank_heatmap(title: str, description: str, unit: str, query: Query) -> heatmap.Panel:
    panel = (
        heatmap.Panel()
        .title(title)
        .description(description)
        .datasource(PROMETHEUS)
        .height(8)
        .span(24)
        .calculate(False)
        .y_axis(heatmap.YAxisConfig().axis_label("rank"))
        .cell_values(heatmap.CellValues().unit(unit))
        .color(
            heatmap.HeatmapColorOptions()
            .mode(HeatmapColorMode.SCHEME)
            .scheme("Oranges")
            .steps(64)
            .exponent(0.5)
        )
    )
    _with_targets(panel, [query])
    return panel


def variable(name: str, label: str, query: str) -> dash.QueryVariable:
    numeric = name in ("rank", "gpu")
    return (
        dash.QueryVariable(name)
        .label(label)
        .datasource(PROMETHEUS)
        .query(query)
        .refresh(VariableRefresh.ON_TIME_RANGE_CHANGED)
        .sort(VariableSort.NUMERICAL_ASC if numeric else VariableSort.ALPHABETICAL_ASC)
        .multi(True)
        .include_all(True)
        .all_value(".*")
    )


def rank_variables() -> list[dash.QueryVariable]:
    steps = c.STEPS.name
    return [
        variable("job_id", "job", f"label_values({steps}, job_id)"),
        variable("node", "node", f'label_values({steps}{{job_id=~"$job_id"}}, node)'),
        variable("rank", "rank", f'label_values({steps}{{job_id=~"$job_id",node=~"$node"}}, rank)'),
    ]


def gpu_variables() -> list[dash.QueryVariable]:
    util = c.GPU_UTILIZATION.name
    return [
        variable("node", "node", f"label_values({util}, node)"),
        variable("gpu", "GPU", f'label_values({util}{{node=~"$node"}}, gpu)'),
    ]


def remediation_variables() -> list[dash.QueryVariable]:
    return [
        variable(
            "instance",
            "remediation service",
            f'label_values(up{{job="{c.SCRAPE_JOB_REMEDIATION}"}}, instance)',
        )
    ]


def _quantile(q: float, metric: str, filt: str, by: str = "") -> str:
    group = f"{by}, le" if by else "le"
    return f"histogram_quantile({q}, sum by ({group}) (rate({metric}_bucket{{{filt}}}[{RATE}])))"


def _increase(spec: c.MetricSpec, filt: str, by: str) -> str:
    return f"sum by ({by}) (increase({spec.name}{{{filt}}}[{RATE}]))"


def overview() -> DashboardSpec:
    f = RANK_FILTER
    return DashboardSpec(
        uid="trainguard-overview",
        title="trainguard / Training overview",
        description="Throughput, stragglers, memory and hangs of training jobs at a glance.",
        variables=rank_variables(),
        rows=[
            (
                "Progress",
                [
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
                        threshold=1.2,
                    ),
                ],
            ),
            (
                "Memory and hangs",
                [
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
                        Query(_increase(c.OOM_EVENTS, f, "rank"), "OOM rank {{rank}}"),
                        Query(
                            _increase(c.OOM_RECOVERIES, f, "rank"),
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
                ],
            ),
            (
                "trainguard itself",
                [
                    series(
                        "Instrumentation errors",
                        "Failures inside the hook, by component (caught; training went on).",
                        "short",
                        Query(
                            _increase(c.INSTRUMENTATION_ERRORS, f, "rank, component"),
                            "rank {{rank}} {{component}}",
                        ),
                    ),
                    series(
                        "Spans dropped",
                        "Spans that could not be exported (collector down, queue full).",
                        "short",
                        Query(_increase(c.SPANS_DROPPED, f, "rank"), "rank {{rank}}"),
                    ),
                ],
            ),
        ],
    )


def stragglers() -> DashboardSpec:
    f = RANK_FILTER
    return DashboardSpec(
        uid="trainguard-stragglers",
        title="trainguard / Stragglers",
        description="Which rank is slow, in which phase, and whether its GPU is throttling.",
        variables=rank_variables(),
        rows=[
            (
                "Who is slow",
                [
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
                        threshold=1.2,
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
                ],
            ),
            (
                "Why",
                [
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
                ],
            ),
        ],
    )


def collectives() -> DashboardSpec:
    f = RANK_FILTER
    sync = c.GRAD_SYNC_DURATION.name
    return DashboardSpec(
        uid="trainguard-collectives",
        title="trainguard / Collectives",
        description="Gradient sync latency (with exemplars linking to traces), hangs and NCCL.",
        variables=rank_variables(),
        rows=[
            (
                "Gradient sync",
                [
                    series(
                        "Gradient sync latency",
                        "p50/p99 of gradient synchronisation over the selected ranks. The dots "
                        "are exemplars: click one to open that step's trace in Jaeger.",
                        "s",
                        Query(_quantile(0.5, sync, f), "p50", exemplar=True),
                        Query(_quantile(0.99, sync, f), "p99", exemplar=True),
                    ),
                    series(
                        "Gradient sync p99 by rank",
                        "A rank with a much lower p99 than its peers is the one they wait for.",
                        "s",
                        Query(f"{c.REC_RANK_GRAD_SYNC_P99}{{{f}}}", "rank {{rank}}"),
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
                ],
            ),
            (
                "Hangs",
                [
                    series(
                        "Oldest in-flight collective",
                        "Age of each rank's oldest unfinished collective and the job's stall "
                        "threshold.",
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
                        Query(_increase(c.COLLECTIVE_STALLS, f, "rank"), "stalls rank {{rank}}"),
                        Query(
                            _increase(c.COLLECTIVE_TIMEOUTS, f, "rank"),
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
                        Query(f'{_exposed(c.NCCL_INFO)}{{node=~"$node"}}'),
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
                ],
            ),
        ],
    )


def memory() -> DashboardSpec:
    f = RANK_FILTER
    return DashboardSpec(
        uid="trainguard-memory",
        title="trainguard / Memory and OOM",
        description="Device memory per rank, headroom, fragmentation and OOM events.",
        variables=rank_variables(),
        rows=[
            (
                "Memory",
                [
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
                ],
            ),
            (
                "OOM",
                [
                    series(
                        "OOM events and recoveries",
                        "Out-of-memory errors, and the steps the OOM guard saved by splitting "
                        "the batch.",
                        "short",
                        Query(_increase(c.OOM_EVENTS, f, "rank"), "OOM rank {{rank}}"),
                        Query(_increase(c.OOM_RECOVERIES, f, "rank"), "recovered rank {{rank}}"),
                    ),
                    series(
                        "Allocator retries",
                        "cudaMalloc retries after freeing the cache: memory pressure.",
                        "short",
                        Query(_increase(c.MEMORY_ALLOC_RETRIES, f, "rank"), "rank {{rank}}"),
                    ),
                ],
            ),
        ],
    )


def gpus() -> DashboardSpec:
    f = GPU_FILTER
    return DashboardSpec(
        uid="trainguard-gpus",
        title="trainguard / GPUs",
        description="Per-node GPU health from trainguard-exporter (its trainguard_gpu_* series "
        "are exported with and without --dcgm-compat).",
        variables=gpu_variables(),
        rows=[
            (
                "Load",
                [
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
                ],
            ),
            (
                "Health",
                [
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
                        Query(_increase(c.GPU_XID_ERRORS, f, "node, gpu, xid"), "{{node}} {{xid}}"),
                    ),
                    series(
                        "ECC errors",
                        "Corrected and uncorrected ECC errors.",
                        "short",
                        Query(
                            _increase(c.GPU_ECC_ERRORS, f, "node, gpu, kind"), "{{node}} {{kind}}"
                        ),
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
                            f"sum by (node, gpu, direction) (rate({c.GPU_NVLINK_BYTES.name}"
                            f"{{{f}}}[{RATE}]))",
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
                        Query(f"{_exposed(c.GPU_PROCESS_INFO)}{{{f}}}"),
                    ),
                ],
            ),
        ],
    )


def remediation() -> DashboardSpec:
    f = REMEDIATION_FILTER
    return DashboardSpec(
        uid="trainguard-remediation",
        title="trainguard / Remediation",
        description="Alerts received, actions planned and executed, outcomes and approvals.",
        variables=remediation_variables(),
        rows=[
            (
                "State",
                [
                    single(
                        "Awaiting approval",
                        "Destructive actions waiting for a human (POST /v1/actions/{id}/approve).",
                        "short",
                        Query(
                            f'sum({c.REMEDIATION_ACTIONS.name}{{{f},state="awaiting_approval"}})'
                        ),
                    ),
                    single(
                        "Queued or running",
                        "The executor queue.",
                        "short",
                        Query(f'sum({c.REMEDIATION_ACTIONS.name}{{{f},state=~"queued|running"}})'),
                    ),
                    single(
                        "Circuit breakers open",
                        "Jobs or nodes whose action budget tripped; needs a manual reset.",
                        "short",
                        Query(f"sum({c.REMEDIATION_CIRCUIT_BREAKERS_OPEN.name}{{{f}}})"),
                    ),
                    single(
                        "Dry run",
                        "1 while the service only records decisions.",
                        "short",
                        Query(f"max({c.REMEDIATION_DRY_RUN.name}{{{f}}})"),
                    ),
                ],
            ),
            (
                "Flow",
                [
                    series(
                        "Alerts received",
                        "Alertmanager webhook alerts stored, by status.",
                        "short",
                        Query(_increase(c.REMEDIATION_ALERTS_RECEIVED, f, "status"), "{{status}}"),
                        Query(
                            f"sum(increase({c.REMEDIATION_ALERTS_DEDUPLICATED.name}"
                            f"{{{f}}}[{RATE}]))",
                            "deduplicated",
                        ),
                        Query(
                            _increase(c.REMEDIATION_WEBHOOK_REJECTED, f, "reason"),
                            "rejected {{reason}}",
                        ),
                    ),
                    series(
                        "Decisions",
                        "Actions planned by the policy, by the state the guards put them in.",
                        "short",
                        Query(
                            _increase(c.REMEDIATION_DECISIONS, f, "action, state"),
                            "{{action}} {{state}}",
                        ),
                        stacked=True,
                    ),
                    series(
                        "Actions executed",
                        "Actions carried out, by executor and outcome.",
                        "short",
                        Query(
                            _increase(
                                c.REMEDIATION_ACTIONS_EXECUTED, f, "action, executor, outcome"
                            ),
                            "{{action}} {{executor}} {{outcome}}",
                        ),
                        stacked=True,
                    ),
                    series(
                        "Latency",
                        "Webhook answer time and executor time (p99).",
                        "s",
                        Query(
                            _quantile(0.99, c.REMEDIATION_WEBHOOK_DURATION.name, f), "webhook p99"
                        ),
                        Query(
                            _quantile(0.99, c.REMEDIATION_ACTION_DURATION.name, f, by="executor"),
                            "{{executor}} p99",
                        ),
                    ),
                    series(
                        "Directive acknowledgements",
                        "Ranks acknowledging directives (checkpoint now, compress gradients, "
                        "new timeout), by outcome.",
                        "short",
                        Query(_increase(c.REMEDIATION_DIRECTIVE_ACKS, f, "outcome"), "{{outcome}}"),
                        width=24,
                    ),
                ],
            ),
        ],
    )


DASHBOARDS = (overview, stragglers, collectives, memory, gpus, remediation)


def build(spec: DashboardSpec) -> dict[str, object]:
    """The dashboard as Grafana JSON (a dict ready for ``json.dumps``)."""
    board = (
        dash.Dashboard(spec.title)
        .uid(spec.uid)
        .description(spec.description)
        .tags(TAGS)
        .refresh("30s")
        .time("now-1h", "now")
        .tooltip(DashboardCursorSync.CROSSHAIR)
        .editable()
    )
    for var in spec.variables:
        board = board.with_variable(var)
    # Stable panel ids: links such as ?viewPanel=N keep working across regenerations.
    panel_id = 0
    for title, panels in spec.rows:
        panel_id += 1
        board = board.with_row(dash.Row(title).id(panel_id))
        for panel in panels:
            panel_id += 1
            board = board.with_panel(panel.id(panel_id))
    encoded: dict[str, object] = json.loads(JSONEncoder().encode(board.build()))
    return encoded


def render_all() -> dict[str, str]:
    """File name -> JSON text of every dashboard (deterministic)."""
    out = {}
    for make in DASHBOARDS:
        spec = make()
        out[f"{spec.uid.removeprefix('trainguard-')}.json"] = (
            json.dumps(build(spec), indent=2, sort_keys=True) + "\n"
        )
    return out
