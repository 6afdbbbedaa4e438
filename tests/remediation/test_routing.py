"""Routing: each action runs on the executor of the scheduler its alert's labels name."""

from __future__ import annotations

from typing import Any

from fastapi.testclient import TestClient

from tests.remediation.conftest import (
    AUTH,
    RecordingExecutor,
    alert,
    notify,
    payload,
    serve,
    wait_for,
)
from trainguard import contract
from trainguard.remediation.settings import Settings


def _actions(client: TestClient) -> list[dict[str, Any]]:
    response = client.get("/v1/actions", headers=AUTH)
    assert response.status_code == 200, response.text
    return list(response.json()["actions"])


def test_each_action_runs_on_the_executor_its_scheduler_label_names(settings: Settings) -> None:
    # The default scheduler is Kubernetes here, so that "no label" is told apart from "local".
    settings = settings.model_copy(
        update={"dry_run": False, "require_approval": False, "default_scheduler": "kubernetes"}
    )
    recorders = {name: RecordingExecutor(name) for name in contract.SCHEDULERS}
    alerts = [
        alert("TrainingRankDown", fingerprint="a", job_id="on-slurm", scheduler="slurm"),
        alert("TrainingRankDown", fingerprint="b", job_id="on-local", scheduler="local"),
        alert("TrainingRankDown", fingerprint="c", job_id="on-kube", scheduler="kubernetes"),
        alert("TrainingRankDown", fingerprint="d", job_id="unlabelled"),
    ]
    with serve(settings, *recorders.values()) as client:
        notify(client, payload(*alerts))
        wait_for(lambda: all(a["state"] == "succeeded" for a in _actions(client)))
        executors = {a["subject"]: a["executor"] for a in _actions(client)}
    assert executors == {
        "on-slurm": "slurm",
        "on-local": "local",
        "on-kube": "kubernetes",
        "unlabelled": "kubernetes",
    }
    ran = {
        name: [snapshot["target"] for _, _, snapshot in r.executed] for name, r in recorders.items()
    }
    assert ran == {
        "slurm": ["on-slurm"],
        "local": ["on-local"],
        "kubernetes": ["on-kube", "unlabelled"],
    }
