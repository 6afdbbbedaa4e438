"""The remediation service attaches a diagnose report to every action it carries out."""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Any

from fastapi.testclient import TestClient
from pydantic import SecretStr

from tests.diagnose import synthetic
from tests.diagnose.conftest import History
from tests.remediation.conftest import AUTH, TOKEN, alert, payload, serve, wait_for
from trainguard.remediation.settings import Settings


def settings_for(tmp_path: Path, prometheus_url: str | None) -> Settings:
    return Settings(
        token=SecretStr(TOKEN),
        db_path=tmp_path / "remediation.db",
        sweep_interval_seconds=0.05,
        sqlite_synchronous="NORMAL",
        dry_run=False,
        diagnose_prometheus_url=prometheus_url,
        diagnose_timeout_seconds=5.0,
    )


def straggler_alert(job_id: str) -> dict[str, Any]:
    return payload(alert("TrainingStraggler", job_id=job_id, rank="5", node="sr-b"))


def executed(client: TestClient) -> dict[str, Any]:
    """The first action of the trail that has finished executing."""
    found: list[dict[str, Any]] = []

    def done() -> bool:
        actions = client.get("/v1/actions", headers=AUTH).json()["actions"]
        found[:] = [a for a in actions if a["state"] in ("succeeded", "failed")]
        return bool(found)

    wait_for(done)
    return found[0]


def report_of(client: TestClient, action_id: int) -> dict[str, Any]:
    answers: list[Any] = []

    def written() -> bool:
        answers.append(client.get(f"/v1/actions/{action_id}/report", headers=AUTH))
        return bool(answers[-1].status_code == 200)

    wait_for(written, timeout=30)
    body: dict[str, Any] = answers[-1].json()
    return body


def test_an_executed_action_links_the_diagnosis_of_its_job(
    history: History, tmp_path: Path
) -> None:
    with serve(settings_for(tmp_path, history.url)) as client:
        assert client.post("/v1/alertmanager", json=straggler_alert(synthetic.STRAGGLER_RANK),
                           headers=AUTH).status_code == 200  # fmt: skip
        action = executed(client)
        assert action["action"] == "recommend" and action["state"] == "succeeded"
        report = report_of(client, action["id"])
        assert report["error"] is None
        assert report["job_id"] == synthetic.STRAGGLER_RANK
        assert report["report"]["failure"] == "straggler"
        assert report["report"]["scope"]["ranks"] == [5]
        assert "## 2. Scope" in report["markdown"] and "rank 5" in report["markdown"]
        # Validate: the incident the alert opened, as the store held it when the report was made.
        validation = report["report"]["validation"]
        assert (validation["source"], validation["gap"]) == ("this service's incidents", None)
        (incident,) = validation["incidents"]
        assert (incident["failure"], incident["alert"]) == ("straggler", "TrainingStraggler")
        assert incident["diagnosed"] is True
        assert incident["tried"][0]["action_id"] == action["id"]
        assert f"### Incident {incident['id']}: TrainingStraggler" in report["markdown"]
        # Written right after the first rung: the verifier has not concluded yet.
        assert incident["outcome"] is None and incident["state"] in ("acting", "verifying")
        assert f"- Not recovered yet: the incident is {incident['state']}" in report["markdown"]
        # Prevent: the straggler's settings.
        (prevention,) = report["report"]["prevention"]
        assert prevention["cause"] == "slow_gpu_or_process"
        assert {s["name"] for s in prevention["settings"]} == {
            "torchrun --nnodes",
            "GPU health check",
        }
        view = client.get(f"/v1/actions/{action['id']}", headers=AUTH).json()
        assert view["report"] == f"/v1/actions/{action['id']}/report"
        assert client.get(f"/v1/actions/{action['id']}/report").status_code == 401


def test_a_failed_diagnosis_never_fails_the_action(tmp_path: Path) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        closed = f"http://127.0.0.1:{sock.getsockname()[1]}"
    with serve(settings_for(tmp_path, closed)) as client:
        client.post("/v1/alertmanager", json=straggler_alert("any-job"), headers=AUTH)
        action = executed(client)
        assert action["state"] == "succeeded"
        report = report_of(client, action["id"])
        assert report["markdown"] is None and report["report"] is None
        assert f"cannot reach Prometheus at {closed}" in report["error"]


def test_without_a_prometheus_url_no_report_is_made(tmp_path: Path) -> None:
    with serve(settings_for(tmp_path, None)) as client:
        client.post("/v1/alertmanager", json=straggler_alert("any-job"), headers=AUTH)
        action = executed(client)
        assert action["report"] is None
        assert client.get(f"/v1/actions/{action['id']}/report", headers=AUTH).status_code == 404
