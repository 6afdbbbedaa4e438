"""Builds trainguard's Grafana dashboards with grafana-foundation-sdk.

The ``*.json`` files beside it are this module's output, committed so Grafana's file
provisioning can load them without Python, and kept in step by
``trainguard dashboards --check`` (run by the test suite). Every metric name comes from
``trainguard.contract`` (metrics and recording rules); every Prometheus query filters on the
dashboard's variables. The panels and queries each dashboard shows live in its own module
(``overview``, ``stragglers``, ``collectives``, ``memory``, ``gpus``, ``remediation``), built
from the shared helpers of ``panels``.
"""

from __future__ import annotations

import json

from grafana_foundation_sdk.builders import dashboard as dash
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models.dashboard import DashboardCursorSync

from trainguard.dashboards import (
    collectives,
    gpus,
    memory,
    overview,
    remediation,
    stragglers,
)
from trainguard.dashboards.panels import TAGS, DashboardSpec
from trainguard.thresholds import Thresholds

DASHBOARDS = tuple(
    module.dashboard for module in (overview, stragglers, collectives, memory, gpus, remediation)
)


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


def render_all(t: Thresholds) -> dict[str, str]:
    """File name -> JSON text of every dashboard, its threshold lines from ``t``
    (deterministic)."""
    out = {}
    for make in DASHBOARDS:
        spec = make(t)
        out[f"{spec.uid.removeprefix('trainguard-')}.json"] = (
            json.dumps(build(spec), indent=2, sort_keys=True) + "\n"
        )
    return out
