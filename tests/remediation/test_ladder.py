"""The verifier: recovery judged from Prometheus or alert resolution, the ladder climbed through
the guards, the page posted to Alertmanager, outcomes, restart survival and the metrics."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from fastapi.testclient import TestClient

from tests.remediation.conftest import (
    AUTH,
    RecordingExecutor,
    alert,
    both_backends,
    executors_with,
    notify,
    payload,
    rows,
    runtime_of,
    serve,
    wait_for,
)
from tests.remediation.fakes import (
    DETECTED_AT,
    EXCLUDE_STRAGGLERS,
    FakePrometheus,
    alertmanager,
    with_policy,
)
from trainguard import contract
from trainguard.remediation import incidents
from trainguard.remediation.app import create_app
from trainguard.remediation.settings import Settings

RANK_DOWN = alert("TrainingRankDown", fingerprint="r", job_id="j1", node="n1", rank="1")


@contextmanager
def serve_verified(
    settings: Settings, prometheus: FakePrometheus, *executors: RecordingExecutor
) -> Iterator[TestClient]:
    app = create_app(settings, executors_with(*executors), prometheus=lambda _: prometheus)
    with TestClient(app) as client:
        yield client


def _send(client: TestClient, *alerts: dict[str, Any]) -> None:
    notify(client, payload(*alerts))


def _only_incident(client: TestClient) -> dict[str, Any]:
    (incident,) = client.get("/v1/incidents", headers=AUTH).json()["incidents"]
    return dict(incident)


def _closed(client: TestClient, timeout: float = 15.0) -> dict[str, Any]:
    wait_for(lambda: _only_incident(client)["state"] == "closed", timeout)
    return _only_incident(client)


def _sample(metrics: str, name: str, **labels: str) -> float:
    """The value of one sample of the service's /metrics (0 when absent)."""
    wanted = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    pattern = rf"^{re.escape(name)}\{{{re.escape(wanted)}\}} (\S+)$"
    found = re.search(pattern, metrics, re.MULTILINE)
    return float(found[1]) if found else 0.0


def _ladder(restart_seconds: float = 0.2, **rung: Any) -> list[dict[str, Any]]:
    return [
        {
            "alert": "TrainingRankDown",
            "actions": [{"action": "restart_from_checkpoint"}],
            "verify_seconds": restart_seconds,
            "escalate": [
                {"action": "exclude_node", "verify_seconds": 0.2, **rung},
                {"action": "page", "verify_seconds": 0.2},
            ],
        }
    ]


@both_backends
def test_recovered_once_the_alert_resolved_and_the_job_passed_its_step(
    settings: Settings, tmp_path: Path, recorder: RecordingExecutor
) -> None:
    live = with_policy(settings, tmp_path, _ladder(restart_seconds=60))
    prometheus = FakePrometheus(step=90.0, firing={"TrainingRankDown"})
    with serve_verified(live, prometheus, recorder) as client:
        _send(client, RANK_DOWN)
        wait_for(lambda: _only_incident(client)["state"] == "verifying", timeout=20)
        incident = _only_incident(client)
        assert (incident["baseline_step"], incident["baseline_ranks_up"]) == (100, 4)
        assert incident["first_evidence_at"] == "2025-12-31T23:59:00Z"  # pending since
        assert incident["acted_at"] is not None and incident["deadline_at"] is not None
        assert "TrainingRankDown still firing" in incident["note"]
        # Prometheus no longer has it firing (no resolved notification needed), but the job
        # restarted from an older checkpoint: not yet recovered.
        prometheus.firing.clear()
        wait_for(lambda: "has not passed step 100 (at step 90)" in _only_incident(client)["note"])
        assert _only_incident(client)["state"] == "verifying"
        prometheus.step = 101.0
        closed = _closed(client)
        assert (closed["outcome"], closed["job_outcome"]) == ("recovered", "resumed")
        assert closed["recovered_at"] is not None and closed["closed_at"] is not None
        assert "passed step 100 (now 101)" in closed["note"]
        assert [(t["action"], t["verdict"]) for t in closed["tried"]] == [
            ("restart_from_checkpoint", "recovered")
        ]
        assert [a for _, a, _ in recorder.executed] == ["restart_from_checkpoint"]
        metrics = client.get("/metrics").text
    failure = {"failure": "rank_failure"}
    incidents = contract.REMEDIATION_INCIDENTS.name
    assert _sample(metrics, incidents, **failure, outcome="recovered") == 1.0
    jobs = contract.REMEDIATION_INCIDENT_JOBS.name
    assert _sample(metrics, jobs, **failure, outcome="resumed") == 1.0
    restart = {**failure, "action": "restart_from_checkpoint"}
    for spec in (contract.REMEDIATION_TIME_TO_RECOVER, contract.REMEDIATION_TIME_TO_ACT):
        assert _sample(metrics, spec.count_name, **restart) == 1.0, spec.name
    detect = contract.REMEDIATION_TIME_TO_DETECT
    assert _sample(metrics, detect.count_name, **failure) == 1.0
    # Received now, pending since a minute before the startsAt of 2026-01-01.
    assert _sample(metrics, detect.sum_name, **failure) > time.time() - DETECTED_AT
    assert _sample(metrics, contract.REMEDIATION_INCIDENTS_OPEN.name, **failure) == 0.0
    assert _sample(metrics, contract.REMEDIATION_ESCALATIONS.name, **restart) == 0.0


def test_a_job_that_kept_stepping_must_pass_the_step_of_its_repair(
    settings: Settings, tmp_path: Path, recorder: RecordingExecutor
) -> None:
    # Detected at step 100, the job kept stepping (a straggler slows it, a rank down may not
    # stop it at once) and was at 150 when restarted; the restart resumed from a checkpoint.
    live = with_policy(settings, tmp_path, _ladder(restart_seconds=60))
    # The alert fires until the restart is done: resolved before it, the job already past its
    # detection step would be recovered without any repair.
    prometheus = FakePrometheus(step=150.0, firing={"TrainingRankDown"})
    with serve_verified(live, prometheus, recorder) as client:
        _send(client, RANK_DOWN)
        wait_for(lambda: _only_incident(client)["state"] == "verifying", timeout=20)
        prometheus.firing.clear()
        prometheus.step = 145.0
        wait_for(lambda: "has not passed step 150 (at step 145)" in _only_incident(client)["note"])
        assert _only_incident(client)["state"] == "verifying"
        prometheus.step = 151.0
        closed = _closed(client)
    assert closed["outcome"] == "recovered"
    assert "passed step 150 (now 151)" in closed["note"]


def test_the_last_steps_before_a_repair_takes_are_no_recovery(
    settings: Settings, tmp_path: Path, recorder: RecordingExecutor
) -> None:
    # The executor returned at step 150; the ranks it stops finish two more steps, then are
    # gone while the job re-forms. Recovered only once it trains on after the repair.
    live = with_policy(settings, tmp_path, _ladder(restart_seconds=60))
    live = live.model_copy(update={"verify_progress_seconds": 5.0})
    # The alert fires until the restart is done: resolved before it, the job already past its
    # detection step would be recovered without any repair.
    prometheus = FakePrometheus(step=150.0, firing={"TrainingRankDown"})
    with serve_verified(live, prometheus, recorder) as client:
        _send(client, RANK_DOWN)
        wait_for(lambda: _only_incident(client)["state"] == "verifying", timeout=20)
        prometheus.firing.clear()
        prometheus.step = 152.0
        wait_for(lambda: "watching it keep training" in _only_incident(client)["note"])
        prometheus.step = None
        wait_for(lambda: "no step reported" in _only_incident(client)["note"])
        assert _only_incident(client)["state"] == "verifying"
        prometheus.step = 160.0
        closed = _closed(client)
    assert closed["outcome"] == "recovered" and "now 160" in closed["note"]


def test_without_prometheus_recovery_is_the_alert_resolving(
    settings: Settings, tmp_path: Path, recorder: RecordingExecutor
) -> None:
    live = with_policy(settings, tmp_path, _ladder(restart_seconds=60))
    with serve(live, recorder) as client:
        _send(client, RANK_DOWN)
        wait_for(lambda: _only_incident(client)["state"] == "verifying")
        assert "verified by alert resolution alone" in _only_incident(client)["note"]
        _send(client, {**RANK_DOWN, "status": "resolved", "endsAt": "2026-01-01T00:10:00Z"})
        closed = _closed(client)
    assert (closed["outcome"], closed["job_outcome"]) == ("recovered", None)
    assert closed["baseline_step"] is None
    assert "verified by alert resolution alone" in closed["note"]


@both_backends
def test_the_ladder_climbs_to_a_page_then_closes(
    settings: Settings, tmp_path: Path, recorder: RecordingExecutor
) -> None:
    prometheus = FakePrometheus(step=100.0, firing={"TrainingRankDown"})
    # Node n1 (2 ranks) excluded on purpose and n2 lost a rank too: worse than at detection.
    prometheus.ranks = {"n2": 1}
    with alertmanager() as am:
        live = with_policy(settings, tmp_path, _ladder()).model_copy(
            update={"alertmanager_url": am.url, "public_url": "https://tg.example/"}
        )
        with serve_verified(live, prometheus, recorder) as client:
            _send(client, RANK_DOWN)
            closed = _closed(client)
            metrics = client.get("/metrics").text
    assert [a for _, a, _ in recorder.executed] == ["restart_from_checkpoint", "exclude_node"]
    assert (closed["outcome"], closed["job_outcome"], closed["paged"]) == ("worse", "lost", True)
    assert (closed["rung"], closed["rung_action"]) == (2, "page")
    assert "1 rank(s) up against 4 at detection less 2 removed on purpose" in closed["note"]
    tried = [(t["rung"], t["action"], t["state"], t["verdict"]) for t in closed["tried"]]
    assert tried == [
        (0, "restart_from_checkpoint", "succeeded", "did not recover within 0.2s"),
        (1, "exclude_node", "succeeded", "did not recover within 0.2s"),
        (2, "page", "succeeded", "did not recover within 0.2s"),
    ]
    (page,) = am.received
    incident_url = f"https://tg.example/v1/incidents/{closed['id']}"
    assert page["labels"] == {
        "alertname": contract.REMEDIATION_FAILED_ALERT,
        "severity": "critical",
        "job_id": "j1",
        "failure": "rank_failure",
        "incident": str(closed["id"]),
        "rung": "1",
        "node": "n1",
    }
    annotations = page["annotations"]
    assert annotations["incident_url"] == incident_url == page["generatorURL"]
    assert annotations["runbook_url"].endswith("runbook.md#trainguardremediationfailed")
    assert "rung 0: restart_from_checkpoint" in annotations["description"]
    assert "rung 1: exclude_node" in annotations["description"]
    assert "did not recover within 0.2s" in annotations["description"]
    failure = {"failure": "rank_failure"}
    escalations = contract.REMEDIATION_ESCALATIONS.name
    assert _sample(metrics, escalations, **failure, action="exclude_node") == 1.0
    assert _sample(metrics, escalations, **failure, action="page") == 1.0
    incidents = contract.REMEDIATION_INCIDENTS.name
    assert _sample(metrics, incidents, **failure, outcome="worse") == 1.0
    jobs = contract.REMEDIATION_INCIDENT_JOBS.name
    assert _sample(metrics, jobs, **failure, outcome="lost") == 1.0
    recover = contract.REMEDIATION_TIME_TO_RECOVER.count_name
    assert _sample(metrics, recover, **failure, action="page") == 0.0


def test_ranks_removed_on_purpose_do_not_make_it_worse(
    settings: Settings, tmp_path: Path, recorder: RecordingExecutor
) -> None:
    prometheus = FakePrometheus(step=120.0, firing={"TrainingRankDown"}, ranks={"n2": 2})
    live = with_policy(settings, tmp_path, _ladder())
    with serve_verified(live, prometheus, recorder) as client:
        _send(client, RANK_DOWN)
        closed = _closed(client)
        page = closed["tried"][-1]
        trail = client.get(f"/v1/actions/{page['action_id']}", headers=AUTH).json()
    # Steps went on (past the baseline) but the alert never resolved.
    assert (closed["outcome"], closed["job_outcome"]) == ("not_recovered", "resumed")
    # No Alertmanager configured: the page fails saying so, and nobody was paged.
    assert (page["action"], page["state"], closed["paged"]) == ("page", "failed", False)
    assert "TRAINGUARD_REMEDIATION_ALERTMANAGER_URL" in trail["output"]["error"]


def test_a_rung_the_guards_hold_back_is_noted_and_the_ladder_moves_on(
    settings: Settings, tmp_path: Path, recorder: RecordingExecutor
) -> None:
    # Rung 1 restarts again: the cooldown of the restart of rung 0 holds it back, so the
    # ladder goes on to the page at once instead of waiting out rung 1's minute.
    rules = [
        {
            "alert": "TrainingRankDown",
            "actions": [{"action": "restart_from_checkpoint"}],
            "verify_seconds": 0.2,
            "escalate": [
                {"action": "restart_from_checkpoint", "verify_seconds": 60},
                {"action": "page", "verify_seconds": 0.2},
            ],
        }
    ]
    with alertmanager() as am:
        live = with_policy(settings, tmp_path, rules).model_copy(
            update={"alertmanager_url": am.url}
        )
        with serve(live, recorder) as client:
            _send(client, RANK_DOWN)
            closed = _closed(client)
    held = closed["tried"][1]
    assert (held["rung"], held["action"], held["state"]) == (
        1,
        "restart_from_checkpoint",
        "suppressed",
    )
    assert held["verdict"].startswith("held back: cooldown: restart_from_checkpoint for j1")
    assert [t["action"] for t in closed["tried"]] == [
        "restart_from_checkpoint",
        "restart_from_checkpoint",
        "page",
    ]
    assert len(am.received) == 1 and closed["paged"] is True
    assert [a for _, a, _ in recorder.executed] == ["restart_from_checkpoint"]
    assert closed["outcome"] == "not_recovered" and closed["job_outcome"] is None


def test_a_dry_run_climbs_the_ladder_without_doing_anything(
    settings: Settings, tmp_path: Path, recorder: RecordingExecutor
) -> None:
    with alertmanager() as am:
        dry = with_policy(settings, tmp_path, _ladder()).model_copy(
            update={"dry_run": True, "alertmanager_url": am.url}
        )
        with serve(dry, recorder) as client:
            _send(client, RANK_DOWN)
            closed = _closed(client)
    assert [t["state"] for t in closed["tried"]] == ["dry_run"] * 3
    assert [t["action"] for t in closed["tried"]] == [
        "restart_from_checkpoint",
        "exclude_node",
        "page",
    ]
    assert recorder.executed == [] and am.received == []
    assert (closed["outcome"], closed["paged"], closed["acted_at"]) == (
        "not_recovered",
        False,
        None,
    )


def test_approval_holds_the_ladder_until_an_operator_decides(
    settings: Settings, tmp_path: Path, recorder: RecordingExecutor
) -> None:
    waiting = with_policy(settings, tmp_path, _ladder()).model_copy(
        update={"require_approval": True}
    )
    with serve(waiting, recorder) as client:
        _send(client, RANK_DOWN)
        time.sleep(0.5)  # many verifier turns: it must not move on while approval is pending
        incident = _only_incident(client)
        assert (incident["state"], incident["rung"]) == ("acting", 0)
        assert "awaiting_approval" in incident["note"]
        assert incident["tried"][0]["verdict"] == "not done yet (awaiting_approval)"


@both_backends
def test_a_restarted_service_resumes_verifying_where_it_was(
    settings: Settings, tmp_path: Path, recorder: RecordingExecutor
) -> None:
    live = with_policy(settings, tmp_path, _ladder(restart_seconds=1.5))
    prometheus = FakePrometheus(step=100.0, firing={"TrainingRankDown"})
    with serve_verified(live, prometheus, recorder) as client:
        _send(client, RANK_DOWN)
        wait_for(lambda: _only_incident(client)["state"] == "verifying")
    # Closed mid-verification (rung 0's deadline pending); a new process on the same database
    # picks it up: the deadline passes, it climbs, and it closes.
    with serve_verified(live, prometheus, recorder) as client:
        closed = _closed(client)
    assert [t["action"] for t in closed["tried"]] == [
        "restart_from_checkpoint",
        "exclude_node",
        "page",
    ]
    assert [a for _, a, _ in recorder.executed] == ["restart_from_checkpoint", "exclude_node"]
    assert closed["baseline_step"] == 100 and closed["outcome"] == "not_recovered"


def test_a_page_alertmanager_refuses_fails_the_action(
    settings: Settings, tmp_path: Path, recorder: RecordingExecutor
) -> None:
    rules = [{"alert": "GpuXidError", "actions": [{"action": "page"}], "verify_seconds": 0.2}]
    with alertmanager() as am:
        am.status = 503
        live = with_policy(settings, tmp_path, rules).model_copy(
            update={"alertmanager_url": am.url}
        )
        with serve(live, recorder) as client:
            _send(client, alert("GpuXidError", fingerprint="x", node="n7", gpu="0", xid="79"))
            closed = _closed(client)
            (page,) = closed["tried"]
            trail = client.get(f"/v1/actions/{page['action_id']}", headers=AUTH).json()
    assert (closed["subject"], closed["job_id"], closed["failure"]) == (
        "node:n7",
        None,
        "gpu_fault",
    )
    assert (page["state"], closed["paged"], closed["outcome"]) == ("failed", False, "not_recovered")
    assert "Alertmanager answered 503" in trail["output"]["error"]
    assert am.received == []


def test_an_incident_climbs_the_longest_ladder_of_its_alerts(
    settings: Settings, tmp_path: Path, recorder: RecordingExecutor
) -> None:
    rules = [
        {"alert": "TrainingOOMRisk", "actions": [{"action": "annotate"}], "verify_seconds": 0.2},
        {
            "alert": "TrainingOOM",
            "actions": [{"action": "annotate"}],
            "verify_seconds": 0.2,
            "escalate": [{"action": "page", "verify_seconds": 0.2}],
        },
    ]
    live = with_policy(settings, tmp_path, rules)
    with serve(live, recorder) as client:
        risk = alert("TrainingOOMRisk", fingerprint="risk", job_id="j1", rank="0")
        oom = alert("TrainingOOM", fingerprint="oom", job_id="j1", rank="1")
        _send(client, risk, oom)
        closed = _closed(client)
        page = closed["tried"][-1]
        trail = client.get(f"/v1/actions/{page['action_id']}", headers=AUTH).json()
    # Opened by the risk, whose rule has no ladder; the OOM joined with one, which it climbs.
    assert closed["alert"]["fingerprint"] == "risk"
    assert [(t["rung"], t["action"], t["state"]) for t in closed["tried"]] == [
        (0, "annotate", "succeeded"),
        (0, "annotate", "suppressed"),
        (1, "page", "failed"),
    ]
    assert (trail["alert"]["fingerprint"], trail["step"]) == ("oom", 1)


def test_a_plan_step_due_later_holds_rung_zero_and_joins_it(
    settings: Settings, tmp_path: Path, recorder: RecordingExecutor
) -> None:
    rules = [
        {
            "alert": "TrainingStraggler",
            "actions": [
                {"action": "recommend", "params": {"text": "look at $node"}},
                {"action": "exclude_node", "after_seconds": 6},
            ],
            "verify_seconds": 60,
        }
    ]
    live = with_policy(settings, tmp_path, rules)
    with serve(live, recorder) as client:
        now = datetime.now(timezone.utc).isoformat()
        _send(client, alert("TrainingStraggler", starts_at=now, job_id="j1", node="n1", rank="2"))
        first = _only_incident(client)
        assert first["rung_action"] == "exclude_node"
        assert [t["action"] for t in first["tried"]] == ["recommend"]
        wait_for(lambda: "plan steps still due" in _only_incident(client)["note"])
        assert _only_incident(client)["state"] == "acting"
        wait_for(lambda: _only_incident(client)["state"] == "verifying", timeout=20)
        incident = _only_incident(client)
    assert [(t["rung"], t["action"], t["state"]) for t in incident["tried"]] == [
        (0, "recommend", "succeeded"),
        (0, "exclude_node", "succeeded"),
    ]
    assert [a for _, a, _ in recorder.executed] == ["exclude_node"]


@both_backends
def test_a_removed_node_is_acted_on_again_once_it_is_back_in_its_job(
    settings: Settings, tmp_path: Path
) -> None:
    live = with_policy(settings, tmp_path, EXCLUDE_STRAGGLERS)
    prometheus = FakePrometheus(ranks={"n1": 2, "n2": 2})
    recorder = RecordingExecutor()

    def removal_state() -> list[tuple[Any, ...]]:
        return rows(live, "SELECT vacated_at IS NOT NULL, rejoined_at IS NOT NULL FROM removals "
                    "LEFT JOIN removal_states USING (action_id)")  # fmt: skip

    def rank_down(fingerprint: str) -> dict[str, Any]:
        _send(
            client,
            alert("TrainingRankDown", fingerprint=fingerprint, job_id="j1", node="n1", rank="2"),
        )
        actions = client.get("/v1/actions", headers=AUTH).json()["actions"]
        return next(a for a in actions if a["alert"]["fingerprint"] == fingerprint)

    with serve_verified(live, prometheus, recorder) as client:
        _send(client, alert("TrainingStraggler", fingerprint="s", job_id="j1", node="n1", rank="2"))
        wait_for(lambda: removal_state() == [(0, 0)])
        # The excluded ranks' last scrapes still find them up: the removal holds.
        time.sleep(live.verify_interval_seconds * 3)
        assert removal_state() == [(0, 0)]
        assert rank_down("r1")["state"] == "skipped"
        prometheus.ranks = {"n1": 0, "n2": 2}  # gone from the job
        wait_for(lambda: removal_state() == [(1, 0)])
        assert rank_down("r2")["state"] == "skipped"
        prometheus.ranks = {"n1": 2, "n2": 2}  # the job scaled back up onto n1
        wait_for(lambda: removal_state() == [(1, 1)])
        assert rank_down("r3")["state"] != "skipped"
        wait_for(lambda: len(recorder.executed) == 2)
    assert [action for _, action, _ in recorder.executed] == [
        contract.Action.EXCLUDE_NODE,
        contract.Action.RESTART_FROM_CHECKPOINT,
    ]


def _storm(size: int) -> list[dict[str, Any]]:
    """One job's alerts of ``size`` ranks down on node n1."""
    return [
        alert("TrainingRankDown", fingerprint=f"r{i}", job_id="j1", node="n1", rank=str(i))
        for i in range(size)
    ]


@both_backends
def test_the_actions_a_storm_held_back_are_counted_not_listed_one_by_one(
    settings: Settings, tmp_path: Path, recorder: RecordingExecutor
) -> None:
    # A storm of one job's alerts: the first restart is carried out, the cooldown holds back
    # the other 299, all in the one incident. The verifier reads the rung's held-back actions
    # as a count (it runs every few seconds for every open incident, whatever the storm's size)
    # and judges the rung by the restart that was carried out.
    with serve(with_policy(settings, tmp_path, _ladder(restart_seconds=600)), recorder) as client:
        _send(client, *_storm(300))
        wait_for(lambda: len(recorder.executed) == 1)
        wait_for(lambda: _only_incident(client)["state"] == "verifying")
        (incident,) = runtime_of(client).store.read(incidents.open_incidents)
        view = _only_incident(client)
    assert [(a.action.value, a.state.value) for a in incident.actions] == [
        ("restart_from_checkpoint", "succeeded")
    ]
    assert (incident.rung, incident.held_repairs) == (0, 299)
    assert incident.held_last_at is not None
    # The view (and the page and diagnose that read it) lists the held-back restarts once.
    acted, held = view["tried"]
    assert (acted["state"], acted["count"]) == ("succeeded", 1)
    assert (held["action"], held["state"], held["count"]) == (
        "restart_from_checkpoint",
        "suppressed",
        299,
    )
    assert held["verdict"].startswith("held back: cooldown")
    assert held["last_at"] >= held["at"] >= acted["at"]


def test_the_page_after_a_storm_names_the_held_back_actions_once(
    settings: Settings, tmp_path: Path, recorder: RecordingExecutor
) -> None:
    with alertmanager() as am:
        live = with_policy(settings, tmp_path, _ladder()).model_copy(
            update={"alertmanager_url": am.url}
        )
        with serve(live, recorder) as client:
            _send(client, *_storm(300))
            closed = _closed(client)
    (page,) = am.received
    description = page["annotations"]["description"]
    (held,) = [t for t in closed["tried"] if t["state"] == "suppressed"]
    assert held["count"] == 299
    assert (
        f"rung 0: restart_from_checkpoint (action #{held['action_id']} and 298 more alike) "
        "suppressed, held back: cooldown"
    ) in description
    assert description.count("suppressed") == 1
