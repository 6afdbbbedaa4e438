"""The plain-Prometheus overlay's scrape jobs, run by a real Prometheus on pods it is told of.

Debian's Prometheus is built without Kubernetes discovery, so the pods come from ``file_sd``
target groups carrying the ``__meta_kubernetes_pod_*`` labels Kubernetes' pod discovery gives a
pod's container port (one target per declared port); everything after discovery is the
shipped configuration: its selection, its relabelling, ``honor_labels``. The "pods" are local
HTTP servers serving what a rank and an exporter serve. What this shows: the rank targets get
the identity the rules join on, the ranks' own labels win on their series, ports, pods and
phases that are not trainguard's are dropped, and the exporter's series keep their own
``pod``/``namespace`` labels. The PodMonitors apply the same relabelings
(test_kubernetes.py compares them); the operator itself was not run.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any, TypeVar

import httpx
import pytest
import yaml
from prometheus_client import CollectorRegistry, Counter, Gauge, start_http_server

from tests.deploy.kube import find, objects
from tests.polling import wait_for
from tests.ports import free_port
from tests.prometheus_process import prometheus_process
from trainguard import contract

pytestmark = pytest.mark.e2e

T = TypeVar("T")
NODE = "gpu-node-1"
JOB_ID = "llama-7b-run3"
# Prometheus' start and a few 1 s scrapes, with room for a loaded 2-core machine.
TIMEOUT = 90.0


def serve(registry: CollectorRegistry) -> Iterator[int]:
    port = free_port()
    server, thread = start_http_server(port, addr="127.0.0.1", registry=registry)
    try:
        yield port
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


def rank_registry(rank: str, local_rank: str) -> CollectorRegistry:
    """A rank's /metrics: its identity labels on every series, as the hook serves them."""
    registry = CollectorRegistry()
    identity = {"job_id": JOB_ID, "rank": rank, "local_rank": local_rank, "node": NODE}
    steps = Counter("trainguard_steps", "steps", list(identity), registry=registry)
    steps.labels(**identity).inc(5)
    return registry


@pytest.fixture
def rank_port() -> Iterator[int]:
    """Rank 11, local rank 3, in a pod of 8 ranks."""
    yield from serve(rank_registry("11", "3"))


@pytest.fixture
def single_rank_port() -> Iterator[int]:
    """Rank 8, alone in its pod."""
    yield from serve(rank_registry("8", "0"))


@pytest.fixture
def exporter_port() -> Iterator[int]:
    """An exporter's /metrics: no node label, and a GPU -> pod series naming a training pod."""
    registry = CollectorRegistry()
    info = Gauge(
        "trainguard_gpu_pod_info", "gpu to pod", ["gpu", "pod", "namespace"], registry=registry
    )
    info.labels(gpu="0", pod=f"{JOB_ID}-0-abcde", namespace="training").set(1)
    yield from serve(registry)


def pod_port(
    port: int, pod: str, port_name: str, labels: dict[str, str], phase: str = "Running"
) -> dict[str, Any]:
    """One target group as Kubernetes' pod discovery makes it for a declared container port."""
    meta = {
        "__meta_kubernetes_namespace": "training",
        "__meta_kubernetes_pod_name": pod,
        "__meta_kubernetes_pod_node_name": NODE,
        "__meta_kubernetes_pod_phase": phase,
        "__meta_kubernetes_pod_ip": "127.0.0.1",
        "__meta_kubernetes_pod_container_name": "trainer",
        "__meta_kubernetes_pod_container_port_name": port_name,
        "__meta_kubernetes_pod_container_port_number": str(port),
        "__meta_kubernetes_pod_container_port_protocol": "TCP",
    }
    for key, value in labels.items():
        name = "".join(c if c.isalnum() else "_" for c in key)
        meta[f"__meta_kubernetes_pod_label_{name}"] = value
        meta[f"__meta_kubernetes_pod_labelpresent_{name}"] = "true"
    return {"targets": [f"127.0.0.1:{port}"], "labels": meta}


def config(tmp_path: Path, groups: dict[str, list[dict[str, Any]]]) -> Path:
    configmap = find(objects("prometheus"), "ConfigMap", "trainguard-prometheus")
    shipped = yaml.safe_load(configmap["data"]["prometheus.yml"])
    jobs = []
    for job in shipped["scrape_configs"]:
        if "kubernetes_sd_configs" not in job:
            continue
        path = tmp_path / f"{job['job_name']}.json"
        path.write_text(json.dumps(groups[job["job_name"]]))
        del job["kubernetes_sd_configs"]
        jobs.append(
            {
                **job,
                "scrape_interval": "1s",
                "file_sd_configs": [{"files": [str(path)], "refresh_interval": "1s"}],
            }
        )
    document = {"global": {"scrape_interval": "1s"}, "scrape_configs": jobs}
    out = tmp_path / "prometheus.yml"
    out.write_text(yaml.safe_dump(document))
    return out


@pytest.fixture
def prometheus(
    tmp_path: Path, rank_port: int, single_rank_port: int, exporter_port: int
) -> Iterator[tuple[str, Path]]:
    rank_labels = {"trainguard.io/job-id": JOB_ID}
    groups = {
        contract.SCRAPE_JOB_RANKS: [
            pod_port(rank_port, f"{JOB_ID}-0-abcde", "tg-metrics-3", rank_labels),
            # A pod that runs one rank names it.
            pod_port(
                single_rank_port,
                f"{JOB_ID}-1-fghij",
                "tg-metrics-0",
                {**rank_labels, "trainguard.io/rank": "8"},
            ),
            # Not trainguard's: another port, a finished pod, a pod of no job.
            pod_port(rank_port, f"{JOB_ID}-0-abcde", "debugger", rank_labels),
            pod_port(rank_port, f"{JOB_ID}-2-klmno", "tg-metrics-0", rank_labels, "Failed"),
            pod_port(rank_port, "notebook-0", "tg-metrics-0", {"app": "notebook"}),
        ],
        contract.SCRAPE_JOB_EXPORTER: [
            pod_port(
                exporter_port,
                "trainguard-exporter-x1",
                "metrics",
                {"app.kubernetes.io/name": "trainguard-exporter"},
            )
        ],
        contract.SCRAPE_JOB_REMEDIATION: [],
    }
    with prometheus_process(config(tmp_path, groups), tmp_path) as running:
        yield running.url, running.log


def query(url: str, expr: str) -> list[dict[str, str]]:
    try:
        answer = httpx.get(f"{url}/api/v1/query", params={"query": expr}, timeout=5).json()
    except httpx.HTTPError:
        return []
    return [r["metric"] for r in answer["data"]["result"]]


def exactly(count: int, url: str, expr: str) -> list[dict[str, str]] | None:
    found = query(url, expr)
    return found if len(found) == count else None


def test_rank_and_exporter_targets_get_the_labels_the_rules_join_on(
    prometheus: tuple[str, Path],
) -> None:
    url, log = prometheus

    up = wait_for(
        "three targets up", lambda: exactly(3, url, 'up{job=~"trainguard-.*"} == 1'), TIMEOUT, log
    )
    ranks = sorted(
        (m for m in up if m["job"] == contract.SCRAPE_JOB_RANKS), key=lambda m: m["rank"]
    )
    for m in ranks:
        del m["__name__"], m["instance"]
    assert ranks == [
        {"job": "trainguard-ranks", "job_id": JOB_ID, "rank": "8", "local_rank": "0", "node": NODE},
        {
            "job": "trainguard-ranks",
            "job_id": JOB_ID,
            "rank": f"{JOB_ID}-0-abcde/3",
            "local_rank": "3",
            "node": NODE,
        },
    ]
    (exporter,) = [m for m in up if m["job"] == contract.SCRAPE_JOB_EXPORTER]
    assert set(exporter) == {"__name__", "job", "instance", "node"}
    assert exporter["node"] == NODE

    # honor_labels: each rank's own identity on its series (rank 11, not "<pod>/3").
    steps = wait_for(
        "both ranks' series", lambda: exactly(2, url, "trainguard_steps_total"), TIMEOUT, log
    )
    assert sorted((m["rank"], m["local_rank"], m["job_id"], m["node"]) for m in steps) == [
        ("11", "3", JOB_ID, NODE),
        ("8", "0", JOB_ID, NODE),
    ]
    # The exporter's own pod and namespace labels stay (no exported_pod renaming).
    (info,) = wait_for(
        "the exporter's series", lambda: query(url, "trainguard_gpu_pod_info"), TIMEOUT, log
    )
    assert info["pod"] == f"{JOB_ID}-0-abcde"
    assert info["namespace"] == "training"
    assert info["node"] == NODE
    assert "exported_pod" not in info
