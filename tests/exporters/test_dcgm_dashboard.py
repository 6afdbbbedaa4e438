"""dcgm-exporter's published Grafana dashboard, evaluated by a real Prometheus against the
simulated exporter with ``--dcgm-compat``.

Every PromQL expression of the dashboard (``fixtures/dcgm-exporter-dashboard-4.5.3-4.8.2.json``)
is run as Grafana runs it: its template variables ``$instance`` and ``$gpu`` (multi-value,
"All" included, no custom all value) are resolved with ``label_values(...)`` and the selection
"All" is substituted the way Grafana's Prometheus data source does, every value regex-escaped
and joined into ``(a|b|...)``; each panel is then asked for as a range query. Every panel must
have data, Tensor Core Utilization included: it needs DCGM's profiling module on dcgm-exporter
and NVML's GPM (Hopper or newer) here, which the simulated provider simulates.

The same Prometheus checks two things users rely on: the documented join of GPU series to
ranks, with two processes of one rank on one GPU, and the relabelling that gives dashboards
written for dcgm-exporter releases up to 4.5.3-4.8.2 their ``Hostname`` label.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
import urllib.parse
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.exporters.conftest import rank_env
from tests.exporters.test_exporter_process import Exporter, exporter
from tests.polling import wait_for
from tests.prometheus_process import prometheus_process

pytestmark = pytest.mark.e2e

FIXTURE = json.loads(
    (Path(__file__).parent / "fixtures" / "dcgm-exporter-dashboard-4.5.3-4.8.2.json").read_text()
)
GPUS = 8
RANK_GPU = 7  # a local rank no other test on this machine is likely to run as
# The join of docs/exporter.md: a GPU series gets the rank and job running on its GPU.
JOIN = (
    "trainguard_gpu_temperature_celsius * on(node, gpu) group_left(rank, job_id) "
    'trainguard_gpu_process_info{{rank!="",job_id="{job}"}}'
)
# docs/exporter.md's relabelling for dashboards that select on dcgm-exporter's old label.
HOSTNAME_RELABEL = {"source_labels": ["hostname"], "regex": "(.+)", "target_label": "Hostname"}


class Prometheus:
    def __init__(self, url: str) -> None:
        self.url = url

    def api(self, path: str, **params: str) -> Any:
        query = urllib.parse.urlencode(params)
        with urllib.request.urlopen(f"{self.url}{path}?{query}", timeout=30) as response:
            body = json.load(response)
        assert body["status"] == "success", body
        return body["data"]

    def query(self, expr: str) -> list[dict[str, Any]]:
        result: list[dict[str, Any]] = self.api("/api/v1/query", query=expr)["result"]
        return result

    def query_range(self, expr: str, seconds: float = 30.0) -> list[dict[str, Any]]:
        end = time.time()
        data = self.api(
            "/api/v1/query_range",
            query=expr,
            start=f"{end - seconds:.3f}",
            end=f"{end:.3f}",
            step="1",
        )
        result: list[dict[str, Any]] = data["result"]
        return result

    def label_values(self, metric: str, label: str) -> list[str]:
        """Grafana's ``label_values(metric, label)``."""
        values: list[str] = self.api(f"/api/v1/label/{label}/values", **{"match[]": metric})
        return sorted(values)


def grafana_all(values: list[str]) -> str:
    """What Grafana's Prometheus data source puts for a multi-value variable set to "All"
    (without a custom all value): each value regex-escaped for a ``=~`` matcher inside a PromQL
    string, ``(a|b|...)`` when there are several."""
    escaped = [
        re.sub(r"[$^*{}\[\]'+?.()|]", r"\\\\\g<0>", value.replace("\\", "\\" * 4))
        for value in values
    ]
    return escaped[0] if len(escaped) == 1 else "(" + "|".join(escaped) + ")"


def substitute(expr: str, variables: dict[str, str]) -> str:
    for name, value in variables.items():
        expr = expr.replace(f"${{{name}}}", value).replace(f"${name}", value)
    assert "$" not in expr, expr
    return expr


@pytest.fixture
def job_id() -> str:
    return f"dashboard-{uuid.uuid4().hex[:8]}"


@pytest.fixture
def one_rank_two_processes(job_id: str) -> Iterator[list[int]]:
    """Two processes of one torchrun rank on GPU 7 (a rank and the CUDA helper it forked)."""
    env = {**os.environ, **rank_env(RANK_GPU, RANK_GPU, TRAINGUARD_JOB_ID=job_id)}
    children = [
        subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"], env=env)
        for _ in range(2)
    ]
    yield [child.pid for child in children]
    for child in children:
        child.kill()
        child.wait()


@pytest.fixture
def simulated_exporter(one_rank_two_processes: list[int]) -> Iterator[Exporter]:
    args = ["--simulate-gpus", str(GPUS), "--dcgm-compat", "--nccl.log-glob", "/nonexistent/*"]
    with exporter(*args) as running:
        yield running


@pytest.fixture
def prometheus(tmp_path: Path, simulated_exporter: Exporter) -> Iterator[Prometheus]:
    target = urllib.parse.urlsplit(simulated_exporter.url)
    config = {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "scrape_configs": [
            {
                "job_name": "trainguard-exporter",
                "metrics_path": target.path,
                "static_configs": [{"targets": [target.netloc], "labels": {"node": "n0"}}],
                "metric_relabel_configs": [HOSTNAME_RELABEL],
            }
        ],
    }
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(config))
    with prometheus_process(tmp_path / "prometheus.yml", tmp_path) as running:
        yield Prometheus(running.url)


def _has_every_gpu(prometheus: Prometheus, job_id: str) -> bool:
    temps = prometheus.query("DCGM_FI_DEV_GPU_TEMP")
    ranks = prometheus.query(f'trainguard_gpu_process_info{{job_id="{job_id}"}}')
    return len(temps) == GPUS and bool(ranks)


def test_every_panel_of_dcgm_exporter_s_dashboard_has_data(
    prometheus: Prometheus, job_id: str
) -> None:
    wait_for("every simulated GPU scraped", lambda: _has_every_gpu(prometheus, job_id), 90)
    variables = {
        var["name"]: grafana_all(prometheus.label_values(*_label_values_args(var["query"])))
        for var in FIXTURE["variables"]
    }
    assert variables["gpu"] == "(0|1|2|3|4|5|6|7)"
    assert re.fullmatch(r"127\\\\\.0\\\\\.0\\\\\.1:\d+", variables["instance"]), variables
    time.sleep(2)  # a few more scrapes, so the range queries have several points
    empty = []
    for panel in FIXTURE["panels"]:
        for target in panel["targets"]:
            result = prometheus.query_range(substitute(target["expr"], variables))
            if not result:
                empty.append(panel["title"])
            elif "{{gpu}}" in target["legendFormat"]:  # one line per GPU
                assert sorted(r["metric"]["gpu"] for r in result) == [str(g) for g in range(GPUS)]
    assert empty == [], f"panels without data: {empty}"
    assert set(FIXTURE["needs_profiling"]) <= {p["title"] for p in FIXTURE["panels"]}


def _label_values_args(query: str) -> tuple[str, str]:
    match = re.fullmatch(r"label_values\((\w+),\s*(\w+)\)", query)
    assert match, query
    return match.group(1), match.group(2)


def test_two_processes_of_a_rank_keep_the_documented_join_working(
    prometheus: Prometheus, job_id: str, one_rank_two_processes: list[int]
) -> None:
    wait_for("every simulated GPU scraped", lambda: _has_every_gpu(prometheus, job_id), 90)
    result = prometheus.query(JOIN.format(job=job_id))  # an error here is a 4xx: no duplicates
    assert [(r["metric"]["gpu"], r["metric"]["rank"]) for r in result] == [
        (str(RANK_GPU), str(RANK_GPU))
    ]
    info = prometheus.query(f'trainguard_gpu_process_info{{job_id="{job_id}"}}')
    assert len(info) == 1 and "pid" not in info[0]["metric"]


def test_xid_labels_and_the_hostname_relabelling(prometheus: Prometheus, job_id: str) -> None:
    wait_for("every simulated GPU scraped", lambda: _has_every_gpu(prometheus, job_id), 90)
    xids = prometheus.query('DCGM_FI_DEV_XID_ERRORS{err_code="0",err_msg="No Error"}')
    assert len(xids) == GPUS
    assert prometheus.query('DCGM_FI_DEV_XID_ERRORS{err_code=~"48|79"}') == []
    relabelled = prometheus.query("DCGM_FI_DEV_GPU_TEMP")
    assert all(r["metric"]["Hostname"] == r["metric"]["hostname"] != "" for r in relabelled)
    assert {r["metric"]["DCGM_FI_DRIVER_VERSION"] for r in relabelled} == {"simulated"}
