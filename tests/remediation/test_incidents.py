"""Incidents: opened and joined by the webhook, read through the API, skipped for ranks removed
on purpose, never for the service's own page; their gauge and the policy's ladders."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from tests.remediation.conftest import (
    AUTH,
    OPERATOR_AUTH,
    RecordingExecutor,
    alert,
    both_backends,
    notify,
    payload,
    rows,
    serve,
    wait_for,
)
from tests.remediation.fakes import EXCLUDE_STRAGGLERS, with_policy
from trainguard import contract
from trainguard.contract import Action
from trainguard.remediation import incidents
from trainguard.remediation.policy import PolicyError, load_policy, parse_policy
from trainguard.remediation.settings import Settings


def _send(client: TestClient, *alerts: dict[str, Any]) -> dict[str, Any]:
    return notify(client, payload(*alerts))


def _incidents(client: TestClient, **params: str) -> list[dict[str, Any]]:
    response = client.get("/v1/incidents", headers=AUTH, params=params)
    assert response.status_code == 200, response.text
    return list(response.json()["incidents"])


@both_backends
def test_a_new_alert_opens_an_incident_and_one_of_the_same_failure_joins_it(
    settings: Settings,
) -> None:
    with serve(settings) as client:
        _send(client, alert("TrainingCollectiveStalled", fingerprint="a", job_id="j1", node="n1"))
        # Same job, same failure (hang): joins. Another failure of the job: its own incident.
        _send(client, alert("TrainingStalled", fingerprint="b", job_id="j1"))
        _send(client, alert("TrainingRankDown", fingerprint="c", job_id="j1", node="n1", rank="3"))
        # Advice only: nothing to verify, no incident. Another job: its own.
        _send(client, alert("TrainingDataLoaderBound", fingerprint="d", job_id="j1", rank="0"))
        _send(client, alert("TrainingCollectiveStalled", fingerprint="e", job_id="j2"))
        # A redelivery of the first alert changes nothing.
        _send(client, alert("TrainingCollectiveStalled", fingerprint="a", job_id="j1", node="n1"))
        found = _incidents(client)
        assert [(i["subject"], i["failure"]) for i in found] == [
            ("j2", "hang"),
            ("j1", "rank_failure"),
            ("j1", "hang"),
        ]
        hang = found[2]
        assert hang["alert"] == {
            "name": "TrainingCollectiveStalled",
            "fingerprint": "a",
            "labels": {
                "alertname": "TrainingCollectiveStalled",
                "severity": "warning",
                "job_id": "j1",
                "node": "n1",
            },
        }
        assert (hang["job_id"], hang["rung"], hang["rung_action"]) == ("j1", 0, "dump_diagnostics")
        assert hang["state"] in ("acting", "verifying") and hang["outcome"] is None
        assert hang["detected_at"] == "2026-01-01T00:00:00Z"
        assert hang["first_evidence_at"] == hang["detected_at"]  # no Prometheus to ask
        assert hang["paged"] is False and hang["closed_at"] is None
        # The decisions for both alerts, on rung 0 (dry-run; the second alert's in cooldown).
        tried = [(t["rung"], t["action"], t["state"]) for t in hang["tried"]]
        assert tried == [
            (0, "dump_diagnostics", "dry_run"),
            (0, "restart_from_checkpoint", "dry_run"),
            (0, "dump_diagnostics", "suppressed"),
            (0, "restart_from_checkpoint", "suppressed"),
        ]
        assert hang["tried"][2]["verdict"].startswith("held back: cooldown")
        assert client.get(f"/v1/incidents/{hang['id']}", headers=AUTH).json() == hang
    assert rows(settings, "SELECT COUNT(*) FROM incident_alerts") == [(4,)]


def test_incident_routes_auth_404_and_filters(settings: Settings) -> None:
    with serve(settings) as client:
        _send(client, alert("TrainingRankDown", fingerprint="a", job_id="j1", node="n1", rank="1"))
        _send(client, alert("TrainingRankDown", fingerprint="b", job_id="j2", node="n2", rank="1"))
        _send(client, alert("GpuXidError", fingerprint="c", node="n3", gpu="0", xid="79"))
        assert client.get("/v1/incidents").status_code == 401
        assert client.get("/v1/incidents/1").status_code == 401
        wrong = {"Authorization": "Bearer nope"}
        assert client.get("/v1/incidents", headers=wrong).status_code == 401
        by_operator = client.get("/v1/incidents", headers=OPERATOR_AUTH)
        assert by_operator.status_code == 200
        assert [i["subject"] for i in by_operator.json()["incidents"]] == ["node:n3", "j2", "j1"]
        node = _incidents(client)[0]
        assert (node["job_id"], node["failure"], node["rung_action"]) == (
            None,
            "gpu_fault",
            "drain_node",
        )
        assert [i["subject"] for i in _incidents(client, job_id="j2")] == ["j2"]
        assert [i["subject"] for i in _incidents(client, limit="1")] == ["node:n3"]
        before = str(node["id"])
        assert [i["subject"] for i in _incidents(client, before_id=before)] == ["j2", "j1"]
        assert _incidents(client, state="closed") == []
        assert _incidents(client, outcome="recovered") == []
        assert (
            len(_incidents(client, state="acting")) + len(_incidents(client, state="verifying"))
            == 3
        )
        assert client.get("/v1/incidents", headers=AUTH, params={"state": "x"}).status_code == 422
        missing = client.get("/v1/incidents/999", headers=AUTH)
        assert missing.status_code == 404 and "no incident 999" in missing.json()["detail"]
        assert client.get("/v1/incidents/0", headers=AUTH).status_code == 422


def test_alerts_of_a_node_removed_on_purpose_are_not_acted_on(
    settings: Settings, tmp_path: Path, recorder: RecordingExecutor
) -> None:
    live = with_policy(settings, tmp_path, EXCLUDE_STRAGGLERS)
    with serve(live, recorder) as client:
        _send(client, alert("TrainingStraggler", fingerprint="s", job_id="j1", node="n1", rank="2"))
        wait_for(lambda: [a for _, a, _ in recorder.executed] == [Action.EXCLUDE_NODE])
        (excluded,) = client.get("/v1/actions", headers=AUTH).json()["actions"]
        wait_for(
            lambda: (
                client.get(f"/v1/actions/{excluded['id']}", headers=AUTH).json()["state"]
                == "succeeded"
            )
        )
        # Its ranks stop: they are not down, they were removed.
        _send(client, alert("TrainingRankDown", fingerprint="r", job_id="j1", node="n1", rank="2"))
        # The same job's ranks on another node, and another job on that node, are acted on.
        _send(client, alert("TrainingRankDown", fingerprint="o", job_id="j1", node="n2", rank="0"))
        _send(client, alert("TrainingRankDown", fingerprint="k", job_id="j9", node="n1", rank="0"))
        actions = client.get("/v1/actions", headers=AUTH).json()["actions"]
        by_alert = {a["alert"]["fingerprint"]: a for a in actions}
        skipped = by_alert["r"]
        assert skipped["state"] == "skipped"
        assert skipped["reason"] == (
            f"rank 2 on node n1 was removed from job j1 on purpose by action #{excluded['id']}"
        )
        assert [a["alert"]["fingerprint"] for a in actions].count("r") == 1
        wait_for(lambda: len(recorder.executed) == 3)
        assert by_alert["o"]["state"] != "skipped" and by_alert["k"]["state"] != "skipped"
        subjects = {(i["subject"], i["failure"]) for i in _incidents(client)}
        assert subjects == {("j1", "straggler"), ("j1", "rank_failure"), ("j9", "rank_failure")}
        rank_down = [i for i in _incidents(client) if i["failure"] == "rank_failure"]
        assert {i["alert"]["fingerprint"] for i in rank_down} == {"o", "k"}
        # A redelivery records nothing more.
        _send(client, alert("TrainingRankDown", fingerprint="r", job_id="j1", node="n1", rank="2"))
        again = client.get("/v1/actions", headers=AUTH).json()["actions"]
        assert [a["alert"]["fingerprint"] for a in again].count("r") == 1
    assert rows(live, "SELECT job_id, node, action_id FROM removals") == [
        ("j1", "n1", excluded["id"])
    ]


def test_the_service_never_acts_on_its_own_page(settings: Settings) -> None:
    with serve(settings) as client:
        page = alert(
            contract.REMEDIATION_FAILED_ALERT,
            fingerprint="p",
            job_id="j1",
            node="n1",
            failure="hang",
            incident="1",
            rung="1",
        )
        result = _send(client, page)
        assert (result["stored"], result["planned_actions"]) == (1, [])
        assert _incidents(client) == []
    with pytest.raises(PolicyError, match="never acts on its own page"):
        parse_policy(
            f"version: 1\nrules: [{{alert: {contract.REMEDIATION_FAILED_ALERT}, "
            "actions: [{action: recommend}]}]"
        )


def test_open_incidents_gauge_reads_the_store(settings: Settings) -> None:
    with serve(settings) as client:
        _send(client, alert("TrainingCollectiveStalled", fingerprint="a", job_id="j1"))
        _send(client, alert("TrainingNCCLTimeout", fingerprint="b", job_id="j2"))
        metrics = client.get("/metrics").text
        name = contract.REMEDIATION_INCIDENTS_OPEN.name
        assert f'{name}{{failure="hang"}} 1.0' in metrics
        assert f'{name}{{failure="nccl_timeout"}} 1.0' in metrics
        assert f'{name}{{failure="oom"}} 0.0' in metrics


def test_default_policy_ladders() -> None:
    policy = load_policy(None)

    def ladder(name: str) -> tuple[list[Action], list[Action]]:
        rule = policy.plan(name, {})
        assert rule is not None
        return [s.action for s in rule.actions], [s.action for s in rule.escalate]

    exclude_then_page = [Action.EXCLUDE_NODE, Action.PAGE]
    assert ladder("TrainingOOM")[1] == [Action.RESTART_FROM_CHECKPOINT, Action.PAGE]
    assert ladder("TrainingOOMRisk") == (
        [Action.CHECKPOINT_NOW, Action.RECOMMEND],
        [Action.RESTART_FROM_CHECKPOINT, Action.PAGE],
    )
    assert ladder("TrainingStraggler") == (
        [Action.RECOMMEND, Action.EXCLUDE_NODE],
        [Action.PAGE],
    )
    for name in ("TrainingCollectiveStalled", "TrainingNCCLTimeout", "TrainingStalled"):
        assert ladder(name)[1] == exclude_then_page, name
    assert ladder("TrainingRankDown") == ([Action.RESTART_FROM_CHECKPOINT], exclude_then_page)
    assert ladder("GpuXidError")[1] == [Action.PAGE]
    for rule in policy.rules:
        if not rule.opens_incidents:
            assert rule.escalate == (), rule.alert
    assert {r.alert for r in policy.rules if not r.opens_incidents} == {
        "TrainingDataLoaderBound",
        "TrainingRankRestarted",
        "TrainingMemoryFragmentation",
        "GpuThermalThrottling",
        "GpuNvmlDown",
        "NcclSocketTransportFallback",
    }


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            "rules: [{alert: X, actions: [{action: recommend}], "
            "escalate: [{action: page, verify: 3}]}]",
            "escalate.0.verify",
        ),
        (
            "rules: [{alert: X, actions: [{action: recommend}], escalate: [{action: reboot}]}]",
            "unknown action 'reboot'",
        ),
        (
            "rules: [{alert: X, actions: [{action: recommend, verify_seconds: 3}]}]",
            "actions.0.verify_seconds",
        ),
        (
            "rules: [{alert: X, actions: [{action: recommend}], verify_seconds: 0}]",
            "verify_seconds",
        ),
        ("rules: [{alert: X, actions: [{action: recommend}], ladder: []}]", "ladder"),
    ],
    ids=["rung-key", "rung-action", "plan-step-verify", "zero-deadline", "rule-key"],
)
def test_invalid_ladders_are_refused_naming_the_field(text: str, message: str) -> None:
    with pytest.raises(PolicyError, match=message):
        parse_policy("version: 1\n" + text)


@both_backends
def test_the_verifier_reads_one_firing_alert_per_name_however_many_joined(
    settings: Settings,
) -> None:
    storm = [
        alert("TrainingStraggler", fingerprint=f"s{i}", job_id="j1", node=f"n{i}", rank=str(i))
        for i in range(60)
    ]
    with serve(settings) as client:
        _send(client, *storm[:30])
        _send(client, *storm[30:], alert("TrainingStraggler", fingerprint="s0", job_id="j1"))
        (incident,) = _incidents(client)
        store = client.app.state.runtime.store  # type: ignore[attr-defined]
        (open_incident,) = store.read(incidents.open_incidents)
    assert open_incident.id == incident["id"]
    # The first alert (also the ladder's), and one firing alert of the name: not 60.
    assert [a.name for a in open_incident.alerts] == ["TrainingStraggler"]
    assert open_incident.ladder.labels["node"] == "n0"
