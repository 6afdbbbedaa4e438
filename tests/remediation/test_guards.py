"""Guards: dry-run, approval, cooldown, budget + circuit breaker, deferred steps, skips."""

from __future__ import annotations

import time
from datetime import datetime, timezone
from typing import Any

from fastapi.testclient import TestClient

from tests.remediation.conftest import (
    AUTH,
    OPERATOR_AUTH,
    RecordingExecutor,
    alert,
    both_backends,
    fresh_database,
    notify,
    payload,
    serve,
    wait_for,
)
from trainguard.remediation.deps import require_reader_token, require_token
from trainguard.remediation.settings import Settings


def _actions(client: TestClient, **params: str) -> list[dict[str, Any]]:
    response = client.get("/v1/actions", headers=AUTH, params=params)
    assert response.status_code == 200, response.text
    return list(response.json()["actions"])


def _send(client: TestClient, *alerts: dict[str, Any]) -> dict[str, Any]:
    return notify(client, payload(*alerts))


def test_dry_run_is_the_default_and_executes_nothing(
    settings: Settings, recorder: RecordingExecutor
) -> None:
    assert Settings.model_fields["dry_run"].default is True
    with serve(settings, recorder) as client:
        _send(client, alert("TrainingRankDown", job_id="j1"))
        (action,) = _actions(client)
        assert action["state"] == "dry_run"
        assert "would wait for approval" in action["reason"]
        time.sleep(0.2)  # the worker had every chance to pick it up
        assert recorder.executed == []
        assert (
            client.post(f"/v1/actions/{action['id']}/approve", headers=OPERATOR_AUTH).status_code
            == 409
        )


@both_backends
def test_destructive_action_waits_for_approval(
    settings: Settings, recorder: RecordingExecutor
) -> None:
    settings = settings.model_copy(update={"dry_run": False})
    with serve(settings, recorder) as client:
        _send(client, alert("TrainingRankDown", job_id="j1"))
        (action,) = _actions(client)
        assert action["state"] == "awaiting_approval"
        time.sleep(0.2)
        assert recorder.executed == []
        response = client.post(
            f"/v1/actions/{action['id']}/approve",
            headers=OPERATOR_AUTH,
            json={"by": "alice", "comment": "checkpoint is fresh"},
        )
        assert response.status_code == 200
        wait_for(
            lambda: (
                client.get(f"/v1/actions/{action['id']}", headers=AUTH).json()["state"]
                == "succeeded"
            )
        )
        assert recorder.executed == [(action["id"], "restart_from_checkpoint", {"target": "j1"})]
        view = client.get(f"/v1/actions/{action['id']}", headers=AUTH).json()
        states = [t["state"] for t in view["transitions"]]
        assert states == ["awaiting_approval", "queued", "running", "succeeded"]
        assert "approved by alice: checkpoint is fresh" in view["transitions"][1]["note"]
        assert view["output"] == {"done": "restart_from_checkpoint"}
        assert (
            client.post(f"/v1/actions/{action['id']}/reject", headers=OPERATOR_AUTH).status_code
            == 409
        )
        assert client.post("/v1/actions/999/approve", headers=OPERATOR_AUTH).status_code == 404


@both_backends
def test_reject(settings: Settings, recorder: RecordingExecutor) -> None:
    settings = settings.model_copy(update={"dry_run": False})
    with serve(settings, recorder) as client:
        _send(client, alert("TrainingRankDown", job_id="j1"))
        (action,) = _actions(client)
        response = client.post(f"/v1/actions/{action['id']}/reject", headers=OPERATOR_AUTH)
        assert response.json()["state"] == "rejected"
        time.sleep(0.2)
        assert recorder.executed == []


@both_backends
def test_without_approval_non_dry_run_executes_once(
    settings: Settings, recorder: RecordingExecutor
) -> None:
    settings = settings.model_copy(update={"dry_run": False, "require_approval": False})
    with serve(settings, recorder) as client:
        _send(client, alert("TrainingRankDown", job_id="j1"))
        _send(client, alert("TrainingRankDown", job_id="j1"))  # redelivery
        wait_for(lambda: len(recorder.executed) == 1)
        time.sleep(0.2)
        assert len(recorder.executed) == 1
        assert [a["state"] for a in _actions(client)] == ["succeeded"]


@both_backends
def test_cooldown_per_job_and_action(settings: Settings) -> None:
    with serve(settings) as client:
        _send(client, alert("TrainingRankDown", fingerprint="a", job_id="j1"))
        _send(client, alert("TrainingRankDown", fingerprint="b", job_id="j1"))
        _send(client, alert("TrainingRankDown", fingerprint="c", job_id="j2"))
        by_fp = {a["alert"]["fingerprint"]: a for a in _actions(client)}
        assert by_fp["a"]["state"] == "dry_run"
        assert by_fp["b"]["state"] == "suppressed"
        assert by_fp["b"]["reason"].startswith("cooldown: restart_from_checkpoint for j1")
        assert by_fp["c"]["state"] == "dry_run"  # another job has its own cooldown
    zero = fresh_database(settings, "z").model_copy(update={"cooldown_seconds": 0.0})
    with serve(zero) as client:
        _send(client, alert("TrainingRankDown", fingerprint="a", job_id="j1"))
        _send(client, alert("TrainingRankDown", fingerprint="b", job_id="j1"))
        assert {a["state"] for a in _actions(client)} == {"dry_run"}


@both_backends
def test_budget_trips_breaker_until_manual_reset(settings: Settings) -> None:
    settings = settings.model_copy(update={"cooldown_seconds": 0.0, "budget_per_hour": 3})
    with serve(settings) as client:
        for i in range(5):
            _send(client, alert("TrainingRankDown", fingerprint=f"f{i}", job_id="j1"))
        states = [a["state"] for a in reversed(_actions(client))]
        assert states == ["dry_run"] * 3 + ["suppressed"] * 2
        newest = _actions(client)[0]
        assert "circuit breaker open for j1" in newest["reason"]
        breakers = client.get("/v1/breakers", headers=AUTH).json()["breakers"]
        assert [b["subject"] for b in breakers] == ["j1"]
        assert "trainguard_remediation_circuit_breakers_open 1.0" in client.get("/metrics").text
        # Other jobs are unaffected.
        _send(client, alert("TrainingRankDown", fingerprint="other", job_id="j2"))
        assert _actions(client)[0]["state"] == "dry_run"
        # The breaker stays open until an operator resets it ...
        assert client.post("/v1/breakers/j1/reset", headers=OPERATOR_AUTH).status_code == 204
        assert client.post("/v1/breakers/j1/reset", headers=OPERATOR_AUTH).status_code == 404
        assert client.get("/v1/breakers", headers=AUTH).json()["breakers"] == []
        # ... which gives the job a fresh budget: the actions that tripped it no longer count.
        for i in range(3):
            _send(client, alert("TrainingRankDown", fingerprint=f"after{i}", job_id="j1"))
        assert [a["state"] for a in _actions(client)[:3]] == ["dry_run"] * 3
        _send(client, alert("TrainingRankDown", fingerprint="after3", job_id="j1"))
        assert _actions(client)[0]["state"] == "suppressed"
        assert [
            b["subject"] for b in client.get("/v1/breakers", headers=AUTH).json()["breakers"]
        ] == ["j1"]


@both_backends
def test_guards_hold_between_the_alerts_of_one_notification(settings: Settings) -> None:
    # The webhook reads a subject's guard state once per notification and keeps it up to date
    # as it decides: the same decisions as alert by alert.
    with serve(settings) as client:
        _send(
            client,
            alert("TrainingRankDown", fingerprint="a", job_id="j1"),
            alert("TrainingRankDown", fingerprint="b", job_id="j1"),
            alert("TrainingRankDown", fingerprint="c", job_id="j2"),
        )
        by_fp = {a["alert"]["fingerprint"]: a for a in _actions(client)}
        assert [by_fp[fp]["state"] for fp in "abc"] == ["dry_run", "suppressed", "dry_run"]
        assert by_fp["b"]["reason"].startswith("cooldown: restart_from_checkpoint for j1")
    budget = fresh_database(settings, "budget").model_copy(
        update={"cooldown_seconds": 0.0, "budget_per_hour": 3}
    )
    with serve(budget) as client:
        _send(client, alert("TrainingRankDown", fingerprint="before", job_id="j1"))
        _send(
            client,
            *(alert("TrainingRankDown", fingerprint=f"f{i}", job_id="j1") for i in range(4)),
            alert("TrainingRankDown", fingerprint="other", job_id="j2"),
        )
        actions = list(reversed(_actions(client)))
        assert [a["state"] for a in actions] == ["dry_run"] * 3 + ["suppressed"] * 2 + ["dry_run"]
        assert "budget of 3 actions per hour exhausted" in actions[3]["reason"]
        assert "circuit breaker open for j1" in actions[4]["reason"]
        breakers = client.get("/v1/breakers", headers=AUTH).json()["breakers"]
        assert [b["subject"] for b in breakers] == ["j1"]


def test_deferred_step_is_planned_once_the_alert_persists(settings: Settings) -> None:
    now = datetime.now(timezone.utc)
    fresh = alert("TrainingStraggler", job_id="j1", node="n1", rank="3", starts_at=now.isoformat())
    old = alert(
        "TrainingStraggler",
        fingerprint="old",
        job_id="j2",
        node="n2",
        rank="1",
        starts_at=datetime.fromtimestamp(now.timestamp() - 1000, timezone.utc).isoformat(),
    )
    with serve(settings) as client:
        _send(client, fresh, old)
        actions = _actions(client)
        planned = sorted((a["subject"], a["action"]) for a in actions)
        # exclude_node (after_seconds: 900) only for the alert firing for 1000 s.
        assert planned == [("j1", "recommend"), ("j2", "exclude_node"), ("j2", "recommend")]
        recommend = next(a for a in actions if a["subject"] == "j1")
        assert recommend["params"]["text"].startswith("Rank 3 on node n1 is slower")


@both_backends
def test_sweep_plans_steps_that_come_due(settings: Settings) -> None:
    started = datetime.fromtimestamp(time.time() - 899.5, timezone.utc).isoformat()
    with serve(settings) as client:
        _send(client, alert("TrainingStraggler", job_id="j1", node="n1", starts_at=started))
        assert [a["action"] for a in _actions(client)] == ["recommend"]
        wait_for(lambda: len(_actions(client)) == 2, timeout=5)
        assert _actions(client)[0]["action"] == "exclude_node"


def test_missing_labels_skip_with_a_reason(settings: Settings) -> None:
    with serve(settings) as client:
        _send(client, alert("TrainingRankDown"))
        _send(client, alert("TrainingRankDown", fingerprint="x", job_id="j", scheduler="nomad"))
        reasons = sorted(a["reason"] for a in _actions(client))
        assert reasons[0].startswith("the alert has no job_id label")
        assert reasons[1].startswith("unknown scheduler 'nomad'")
        assert {a["state"] for a in _actions(client)} == {"skipped"}


def test_auth_dependency_can_be_overridden(settings: Settings) -> None:
    with serve(settings) as client:
        overrides = client.app.dependency_overrides  # type: ignore[attr-defined]
        overrides[require_token] = lambda: None
        overrides[require_reader_token] = lambda: None
        assert client.get("/v1/actions").status_code == 200
        directives = client.get("/v1/directives", params={"job_id": "j", "rank": 0, "wait": 0})
        assert directives.status_code == 200


def test_executor_failure_is_recorded(settings: Settings) -> None:
    settings = settings.model_copy(update={"dry_run": False, "require_approval": False})
    with serve(settings) as client:  # the real local executor: no such job on this host
        _send(client, alert("TrainingRankDown", job_id="no-such-job"))
        assert len(_actions(client)) == 1
        wait_for(lambda: _actions(client)[0]["state"] == "failed")
        view = _actions(client)[0]
        assert view["output"] == {
            "error": "no torchrun worker of job 'no-such-job' runs on this host"
        }
        metrics = client.get("/metrics").text
        assert (
            'trainguard_remediation_actions_executed_total{action="restart_from_checkpoint",'
            'executor="local",outcome="failure"} 1.0'
        ) in metrics
        # Local has no drain_node: the registry refuses instead of guessing.
        _send(client, alert("GpuXidError", fingerprint="x", node="n1", gpu="0", xid="79"))
        wait_for(lambda: len(_actions(client, state="failed")) == 2)
        drain = next(a for a in _actions(client) if a["action"] == "drain_node")
        assert drain["output"] == {"error": "executor 'local' cannot drain_node"}
        assert drain["subject"] == "node:n1"


def test_audit_filters_and_paging(settings: Settings) -> None:
    with serve(settings) as client:
        for i in range(5):
            _send(client, alert("TrainingDataLoaderBound", fingerprint=f"f{i}", job_id=f"j{i % 2}"))
        everything = _actions(client)
        assert [a["id"] for a in everything] == sorted((a["id"] for a in everything), reverse=True)
        assert {a["subject"] for a in _actions(client, subject="j1")} == {"j1"}
        assert len(_actions(client, subject="j1")) == 2
        page = _actions(client, limit="2")
        rest = _actions(client, before_id=str(page[-1]["id"]))
        assert [a["id"] for a in page + rest] == [a["id"] for a in everything]
        assert _actions(client, state="queued") == []
        assert client.get("/v1/actions/0", headers=AUTH).status_code == 422
        assert client.get("/v1/actions/12345", headers=AUTH).status_code == 404
        assert client.get("/v1/actions", headers=AUTH, params={"state": "nope"}).status_code == 422
