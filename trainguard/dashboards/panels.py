"""The building blocks every dashboard shares: datasources, filters, variables, panels, queries.

Each dashboard is a module beside this one (``overview``, ``stragglers``, ...) whose
``dashboard()`` returns a ``DashboardSpec`` built from these helpers; ``build`` turns the specs
into the committed JSON.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from grafana_foundation_sdk.builders import common as common_builders
from grafana_foundation_sdk.builders import dashboard as dash
from grafana_foundation_sdk.builders import heatmap, prometheus, stat, table, timeseries
from grafana_foundation_sdk.models import common
from grafana_foundation_sdk.models.dashboard import (
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


def quantile(q: float, metric: str, filt: str, by: str = "") -> str:
    group = f"{by}, le" if by else "le"
    return f"histogram_quantile({q}, sum by ({group}) (rate({metric}_bucket{{{filt}}}[{RATE}])))"


def increase(spec: c.MetricSpec, filt: str, by: str) -> str:
    return f"sum by ({by}) (increase({spec.name}{{{filt}}}[{RATE}]))"
