"""The dashboards' JSON: generated, valid PromQL on contract names only, filtered by variables."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.alerts.tools import (
    PROMETHEUS_SERIES,
    REPO,
    binary,
    exposed_names,
    metric_names,
    recording_names,
    run,
)
from trainguard import cli, contract
from trainguard.dashboards import build, panels
from trainguard.thresholds import load_default

DASHBOARD_DIR = REPO / "trainguard" / "dashboards"
DASHBOARDS = sorted(DASHBOARD_DIR.glob("*.json"))
PROVISIONING = REPO / "deploy" / "grafana" / "provisioning"
# What Grafana puts in place of its own variables before the query reaches Prometheus.
GRAFANA_VARIABLES = {"$__rate_interval": "1m", "$__interval": "15s", "$__range": "1h"}


def load(path: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(path.read_text())
    return data


def queries(board: dict[str, Any]) -> list[tuple[str, str]]:
    """(panel title, expr) of every Prometheus query of the dashboard."""
    found = []
    for panel in board["panels"]:
        for target in panel.get("targets", []):
            assert target["datasource"]["uid"] == panels.PROMETHEUS_UID, panel["title"]
            found.append((panel["title"], target["expr"]))
    return found


def variable_names(board: dict[str, Any]) -> list[str]:
    return [v["name"] for v in board["templating"]["list"]]


def substitute(expr: str, board: dict[str, Any]) -> str:
    for name, value in GRAFANA_VARIABLES.items():
        expr = expr.replace(name, value)
    for name in variable_names(board):
        expr = re.sub(rf"\$\{{?{name}\}}?\b", "x|y", expr)
    return expr


def test_six_dashboards_are_committed_and_current() -> None:
    assert [p.stem for p in DASHBOARDS] == sorted(
        ["overview", "stragglers", "collectives", "memory", "gpus", "remediation"]
    )
    assert cli.main(["dashboards", "--check"]) == 0


def test_check_reports_a_stale_dashboard(tmp_path: Path) -> None:
    assert cli.main(["dashboards", "--out-dir", str(tmp_path)]) == 0
    (tmp_path / "memory.json").write_text("{}")
    assert cli.main(["dashboards", "--check", "--out-dir", str(tmp_path)]) == 1


@pytest.mark.parametrize("path", DASHBOARDS, ids=lambda p: p.stem)
def test_queries_name_only_contract_metrics_and_recording_rules(path: Path) -> None:
    allowed = exposed_names() | recording_names() | PROMETHEUS_SERIES
    board = load(path)
    assert queries(board), path
    for title, expr in queries(board):
        unknown = metric_names(substitute(expr, board)) - allowed
        assert not unknown, (path.stem, title, unknown)


# The reliability rules sum over every remediation service instance: no variable applies.
RELIABILITY_RULES = {
    name
    for rules in (
        contract.REC_SUCCESS_RATIO,
        contract.REC_FAILURE_SUCCESS_RATIO,
        contract.REC_MTTR,
        contract.REC_FAILURE_MTTR,
    )
    for name in rules.values()
}


@pytest.mark.parametrize("path", DASHBOARDS, ids=lambda p: p.stem)
def test_queries_use_the_dashboard_variables(path: Path) -> None:
    board = load(path)
    names = variable_names(board)
    assert names, path
    used: set[str] = set()
    for title, expr in queries(board):
        mentioned = {n for n in names if re.search(rf"\$\{{?{n}\b", expr)}
        if metric_names(substitute(expr, board)) <= RELIABILITY_RULES:
            continue
        assert mentioned, (path.stem, title, "uses no dashboard variable")
        used |= mentioned
    assert used == set(names), (path.stem, "unused variables", set(names) - used)


def test_rank_dashboards_offer_job_node_and_rank() -> None:
    for stem in ("overview", "stragglers", "collectives", "memory"):
        board = load(DASHBOARD_DIR / f"{stem}.json")
        assert variable_names(board) == ["job_id", "node", "rank"]
        for var in board["templating"]["list"]:
            assert var["datasource"]["uid"] == panels.PROMETHEUS_UID
            assert var["query"].startswith(f"label_values({contract.STEPS.name}")


def test_every_query_parses_as_promql(tmp_path: Path) -> None:
    """promtool parses each query (variables substituted) as a recording rule expression."""
    promtool = binary("promtool")
    rules = []
    for path in DASHBOARDS:
        board = load(path)
        for index, (_, expr) in enumerate(queries(board)):
            record = f"dashboard:{path.stem}_{index}:query"
            rules.append({"record": record, "expr": substitute(expr, board)})
        for var in board["templating"]["list"]:
            inner = re.fullmatch(r"label_values\((.+), *\w+\)", var["query"])
            assert inner, var["query"]
            rules.append({"record": f"dashboard:{path.stem}_{var['name']}:variable",
                          "expr": substitute(inner.group(1), board)})  # fmt: skip
    rule_file = tmp_path / "dashboards.rules.yml"
    rule_file.write_text(yaml.safe_dump({"groups": [{"name": "dashboards", "rules": rules}]}))
    result = run(promtool, "check", "rules", "--lint=none", rule_file)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(rules)} rules found" in result.stdout


def test_a_broken_query_fails_the_parse_check(tmp_path: Path) -> None:
    promtool = binary("promtool")
    rule_file = tmp_path / "bad.rules.yml"
    bad = {"record": "dashboard:bad:query", "expr": "sum by (rank (trainguard_steps_total)"}
    rule_file.write_text(yaml.safe_dump({"groups": [{"name": "d", "rules": [bad]}]}))
    assert run(promtool, "check", "rules", rule_file).returncode != 0


def test_gradient_sync_latency_links_exemplars_to_traces() -> None:
    board = load(DASHBOARD_DIR / "collectives.json")
    sync = [
        t
        for p in board["panels"]
        for t in p.get("targets", [])
        if contract.GRAD_SYNC_DURATION.name + "_bucket" in t["expr"]
    ]
    assert sync and all(t.get("exemplar") is True for t in sync)
    datasources = yaml.safe_load((PROVISIONING / "datasources" / "trainguard.yml").read_text())
    prometheus = next(d for d in datasources["datasources"] if d["type"] == "prometheus")
    (destination,) = prometheus["jsonData"]["exemplarTraceIdDestinations"]
    assert destination["name"] == contract.EXEMPLAR_TRACE_ID
    jaeger = next(d for d in datasources["datasources"] if d["type"] == "jaeger")
    assert destination["datasourceUid"] == jaeger["uid"] == panels.JAEGER_UID


def test_provisioning_has_the_fixed_datasource_uids() -> None:
    datasources = yaml.safe_load((PROVISIONING / "datasources" / "trainguard.yml").read_text())
    uids = {d["type"]: d["uid"] for d in datasources["datasources"]}
    assert uids == {
        "prometheus": panels.PROMETHEUS_UID,
        "jaeger": panels.JAEGER_UID,
        "elasticsearch": panels.ELASTICSEARCH_UID,
    }
    providers = yaml.safe_load((PROVISIONING / "dashboards" / "trainguard.yml").read_text())
    (provider,) = providers["providers"]
    assert provider["type"] == "file"


@pytest.mark.parametrize("path", DASHBOARDS, ids=lambda p: p.stem)
def test_panel_ids_and_uids_are_unique(path: Path) -> None:
    board = load(path)
    ids = [p["id"] for p in board["panels"]]
    assert len(ids) == len(set(ids))
    assert board["uid"] == f"trainguard-{path.stem}"


def test_each_dashboard_has_its_own_module() -> None:
    """``trainguard.dashboards.<name>.dashboard()`` renders ``<name>.json``, one per module."""
    stems = [make(load_default()).uid.removeprefix("trainguard-") for make in build.DASHBOARDS]
    modules = [make.__module__.rsplit(".", 1)[1] for make in build.DASHBOARDS]
    assert stems == modules
    assert sorted(stems) == [p.stem for p in DASHBOARDS]


def test_the_reliability_row_reports_every_window_and_the_incident_metrics() -> None:
    """Success rate and MTTR per window from the recording rules, and every incident metric
    of the service on the remediation dashboard's "Reliability" row."""
    board = load(DASHBOARD_DIR / "remediation.json")
    rows = [p for p in board["panels"] if p["type"] == "row"]
    assert rows[-1]["title"] == "Reliability"
    after = [p for p in board["panels"] if p["id"] > rows[-1]["id"]]
    read = set()
    for panel in after:
        for target in panel.get("targets", []):
            read |= metric_names(substitute(target["expr"], board))
    stats = {tuple(t["expr"] for t in p["targets"]) for p in after if p["type"] == "stat"}
    windows = contract.RELIABILITY_WINDOWS
    assert stats == {(contract.REC_SUCCESS_RATIO[w],) for w in windows} | {
        (contract.REC_MTTR[w],) for w in windows
    }
    for spec in (
        contract.REMEDIATION_INCIDENTS,
        contract.REMEDIATION_INCIDENTS_OPEN,
        contract.REMEDIATION_INCIDENT_JOBS,
        contract.REMEDIATION_ESCALATIONS,
    ):
        assert spec.name in read, spec.name
    for spec in (
        contract.REMEDIATION_TIME_TO_DETECT,
        contract.REMEDIATION_TIME_TO_ACT,
        contract.REMEDIATION_TIME_TO_RECOVER,
    ):
        assert spec.bucket_name in read, spec.name
