"""The verifier judges each alert by its catalogue's rule: an event alert (a count over a
window) by the events since the repair, not by its resolving; and a job that ended normally
closes its incident with the job's outcome instead of climbing the ladder."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from fastapi.testclient import TestClient

from tests.remediation.conftest import (
    AUTH,
    RecordingExecutor,
    alert,
    notify,
    payload,
    wait_for,
)
from tests.remediation.fakes import DETECTED_AT, FakePrometheus, alertmanager, with_policy
from tests.remediation.test_ladder import serve_verified
from trainguard import contract
from trainguard.contract import Action, Alert, Failure, Recovery
from trainguard.remediation.incidents import ActionFacts, AlertFacts, OpenIncident
from trainguard.remediation.models import ActionState, AlertStatus, IncidentState
from trainguard.remediation.prometheus import Reads
from trainguard.remediation.recovery import Judge
from trainguard.remediation.settings import Settings

OOM = alert("TrainingOOM", fingerprint="oom", job_id="j1", node="n1", rank="0")
RANK_DOWN = alert("TrainingRankDown", fingerprint="down", job_id="j1", node="n1", rank="1")
OOM_EVENTS = contract.OOM_EVENTS.name


def _policy(alertname: str, verify_seconds: float) -> list[dict[str, Any]]:
    return [
        {
            "alert": alertname,
            "actions": [{"action": "restart_from_checkpoint"}],
            "verify_seconds": verify_seconds,
            "escalate": [{"action": "page", "verify_seconds": verify_seconds}],
        }
    ]


def _incident(client: TestClient) -> dict[str, Any]:
    (incident,) = client.get("/v1/incidents", headers=AUTH).json()["incidents"]
    return dict(incident)


def _closed(client: TestClient, timeout: float = 20.0) -> dict[str, Any]:
    wait_for(lambda: _incident(client)["state"] == "closed", timeout)
    return _incident(client)


def _repaired(client: TestClient, recorder: RecordingExecutor) -> None:
    wait_for(lambda: bool(recorder.executed), timeout=20)
    wait_for(lambda: _incident(client)["state"] in ("verifying", "closed"), timeout=20)


def test_the_catalogue_names_the_rule_of_every_alert() -> None:
    # The four alerts that count events over a window; every other one is a state.
    events = {
        alert
        for alert in contract.FAILURES.alerts()
        if contract.FAILURES[contract.failure_of(alert)].recovery(alert) is Recovery.NO_NEW_EVENT
    }
    assert events == {
        Alert.TRAINING_OOM,
        Alert.TRAINING_NCCL_TIMEOUT,
        Alert.TRAINING_RANK_RESTARTED,
        Alert.GPU_XID_ERROR,
    }


def test_an_oom_still_in_its_window_recovers_once_the_job_trains_on_without_another(
    settings: Settings, tmp_path: Path, recorder: RecordingExecutor
) -> None:
    # TrainingOOM fires for its whole window after the OOM, whatever the job does since: the
    # verifier must not wait for it to resolve (its deadline would pass and climb the ladder).
    live = with_policy(settings, tmp_path, _policy("TrainingOOM", verify_seconds=60))
    prometheus = FakePrometheus(step=100.0, firing={"TrainingOOM"})
    with serve_verified(live, prometheus, recorder) as client:
        notify(client, payload(OOM))
        _repaired(client, recorder)
        prometheus.step = 140.0
        closed = _closed(client)
    assert (closed["outcome"], closed["job_outcome"], closed["rung"]) == ("recovered", "resumed", 0)
    assert "no new TrainingOOM event since the repair" in closed["note"]
    assert "passed step 100 (now 140)" in closed["note"]
    assert "TrainingOOM" in prometheus.firing  # still firing when it was judged recovered


def test_a_new_oom_after_the_repair_is_no_recovery_and_climbs(
    settings: Settings, tmp_path: Path, recorder: RecordingExecutor
) -> None:
    prometheus = FakePrometheus(step=100.0, firing={"TrainingOOM"})
    with alertmanager() as am:
        live = with_policy(settings, tmp_path, _policy("TrainingOOM", verify_seconds=0.5))
        live = live.model_copy(update={"alertmanager_url": am.url})
        with serve_verified(live, prometheus, recorder) as client:
            notify(client, payload(OOM))
            _repaired(client, recorder)
            prometheus.events[OOM_EVENTS] = [(time.time() + 0.1, 1.0)]
            prometheus.step = 140.0
            closed = _closed(client)
    assert (closed["outcome"], closed["paged"]) == ("not_recovered", True)
    verdict = closed["tried"][0]["verdict"]
    assert verdict == "did not recover within 0.5s"
    assert "1 new TrainingOOM event(s) (trainguard_oom_events_total)" in closed["note"]


def test_an_oom_nothing_repaired_yet_is_judged_from_its_detection(
    settings: Settings, tmp_path: Path, recorder: RecordingExecutor
) -> None:
    # Approval holds the repair; the hook's guard recovered the step on its own: no new OOM
    # since detection and the job steps on for the progress window.
    waiting = with_policy(settings, tmp_path, _policy("TrainingOOM", verify_seconds=60))
    waiting = waiting.model_copy(update={"require_approval": True})
    prometheus = FakePrometheus(step=100.0, firing={"TrainingOOM"})
    with serve_verified(waiting, prometheus, recorder) as client:
        notify(client, payload(OOM))
        wait_for(lambda: "awaiting_approval" in _incident(client)["note"], timeout=20)
        prometheus.step = 130.0
        closed = _closed(client)
    assert closed["outcome"] == "recovered"
    assert "no new TrainingOOM event since detection" in closed["note"]
    assert recorder.executed == []


def _open(*alerts: AlertFacts, repaired_at: float | None = None) -> OpenIncident:
    """An open incident of job j1 detected at DETECTED_AT, restarted at ``repaired_at``."""
    actions = (
        ()
        if repaired_at is None
        else (
            ActionFacts(
                1, 0, Action.RESTART_FROM_CHECKPOINT, ActionState.SUCCEEDED, "", 0.0, repaired_at
            ),
        )
    )
    return OpenIncident(
        id=1,
        subject="j1",
        job_id="j1",
        failure=Failure.RANK_FAILURE,
        state=IncidentState.VERIFYING,
        rung=0,
        rung_action="restart_from_checkpoint",
        rung_started_at=DETECTED_AT,
        ladder=alerts[0],
        alerts=alerts,
        actions=actions,
        held_repairs=0,
        held_last_at=None,
        deferred=False,
        first_evidence_at=None,
        detected_at=DETECTED_AT,
        received_at=DETECTED_AT,
        acted_at=repaired_at,
        deadline_at=None,
        baseline_step=100,
        baseline_ranks_up=4,
        baseline_at=DETECTED_AT,
        note="",
    )


def _facts(name: str, status: AlertStatus = AlertStatus.FIRING, **labels: str) -> AlertFacts:
    return AlertFacts(1, name, {"job_id": "j1", **labels}, status, DETECTED_AT)


def test_the_restart_a_repair_makes_is_the_repairs_not_a_new_event() -> None:
    # The service restarted the job: torchrun's count rises once with that restart.
    repaired = DETECTED_AT + 10
    prometheus = FakePrometheus(restarts=[(0.0, 0.0), (repaired + 2, 1.0)])
    judge = Judge(Reads(prometheus), progress=5.0)
    incident = _open(_facts("TrainingRankRestarted", restarts="1"), repaired_at=repaired)
    assert judge.new_events(incident, list(incident.alerts), repaired + 60) == []
    # A second rise is a rank that died again since.
    prometheus.restarts.append((repaired + 30, 2.0))
    assert judge.new_events(incident, list(incident.alerts), repaired + 60) == [
        "1 new TrainingRankRestarted event(s) (trainguard_elastic_restarts rose to 2, 1 of them "
        "the repair's)"
    ]
    # A relaunch counts from 0 again: no event.
    prometheus.restarts.append((repaired + 40, 0.0))
    assert judge.new_events(incident, list(incident.alerts), repaired + 60) == []


def test_events_are_counted_over_the_alerts_subject_since_the_repair() -> None:
    repaired = DETECTED_AT + 10
    prometheus = FakePrometheus()
    judge = Judge(Reads(prometheus), progress=5.0)
    incident = _open(_facts("TrainingOOM", rank="0"), repaired_at=repaired)
    prometheus.events[OOM_EVENTS] = [(repaired - 5, 1.0)]  # the OOM the alert fired for
    assert judge.new_events(incident, list(incident.alerts), repaired + 60) == []
    prometheus.events[OOM_EVENTS].append((repaired + 20, 2.0))
    assert judge.new_events(incident, list(incident.alerts), repaired + 60) == [
        "2 new TrainingOOM event(s) (trainguard_oom_events_total)"
    ]
    (query, _) = prometheus.queries[-1]
    assert query == 'sum(increase(trainguard_oom_events_total{job_id="j1"}[60000ms]))'
    # An Xid has no job: its node and GPU are its subject.
    xid = _open(
        AlertFacts(2, "GpuXidError", {"node": "n1", "gpu": "3"}, AlertStatus.FIRING, DETECTED_AT),
        repaired_at=repaired,
    )
    judge.new_events(xid, list(xid.alerts), repaired + 60)
    (query, _) = prometheus.queries[-1]
    assert query == 'sum(increase(trainguard_gpu_xid_errors_total{node="n1",gpu="3"}[60000ms]))'


def test_an_incident_whose_job_ended_normally_closes_with_the_jobs_outcome(
    settings: Settings, tmp_path: Path, recorder: RecordingExecutor
) -> None:
    # The OOM lands near the job's end: the job trains past it and every rank withdraws
    # before the progress window is over. Closed recovered, the job finished; no climb.
    live = with_policy(settings, tmp_path, _policy("TrainingOOM", verify_seconds=0.3))
    live = live.model_copy(update={"verify_progress_seconds": 60.0})
    prometheus = FakePrometheus(step=100.0, firing={"TrainingOOM"})
    with serve_verified(live, prometheus, recorder) as client:
        notify(client, payload(OOM))
        _repaired(client, recorder)
        prometheus.step = 120.0
        wait_for(lambda: "watching it keep training" in _incident(client)["note"])
        prometheus.step = None
        prometheus.listed = False
        closed = _closed(client)
    assert (closed["outcome"], closed["job_outcome"], closed["rung"]) == (
        "recovered",
        "finished",
        0,
    )
    assert "job j1 ended normally at step 120" in closed["note"]
    assert [a for _, a, _ in recorder.executed] == ["restart_from_checkpoint"]


def test_a_job_that_ended_before_its_repair_ran_cancels_it_and_is_not_judged(
    settings: Settings, tmp_path: Path, recorder: RecordingExecutor
) -> None:
    waiting = with_policy(settings, tmp_path, _policy("TrainingRankDown", verify_seconds=0.3))
    waiting = waiting.model_copy(update={"require_approval": True})
    prometheus = FakePrometheus(step=100.0, firing={"TrainingRankDown"})
    with serve_verified(waiting, prometheus, recorder) as client:
        notify(client, payload(RANK_DOWN))
        wait_for(lambda: "awaiting_approval" in _incident(client)["note"], timeout=20)
        prometheus.step = 110.0
        prometheus.listed = False
        closed = _closed(client)
        (action,) = client.get("/v1/actions", headers=AUTH).json()["actions"]
    assert (closed["outcome"], closed["job_outcome"], closed["paged"]) == (
        "job_ended",
        "finished",
        False,
    )
    assert "TrainingRankDown still firing" in closed["note"]
    assert action["state"] == "cancelled"
    assert recorder.executed == []


def test_a_job_whose_rank_crashed_has_not_ended(
    settings: Settings, tmp_path: Path, recorder: RecordingExecutor
) -> None:
    # Every target gone, but one's last scrape had failed (an expired target of a crashed
    # rank): the ladder goes on.
    live = with_policy(settings, tmp_path, _policy("TrainingRankDown", verify_seconds=0.3))
    prometheus = FakePrometheus(step=100.0, firing={"TrainingRankDown"})
    prometheus.listed = False
    prometheus.down_at_last_scrape = {"n1"}
    with alertmanager() as am:
        live = live.model_copy(update={"alertmanager_url": am.url})
        with serve_verified(live, prometheus, recorder) as client:
            notify(client, payload(RANK_DOWN))
            closed = _closed(client)
    assert closed["job_outcome"] != "finished" and closed["paged"] is True
