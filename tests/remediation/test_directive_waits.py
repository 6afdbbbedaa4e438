"""A directive action lasts until the ranks acknowledge it; the next step of its plan waits.

The plan of ``TrainingCollectiveStalled`` is dump_diagnostics, then restart_from_checkpoint: the
restart must not kill the workers before they dumped.
"""

from __future__ import annotations

import sqlite3
import time
from datetime import datetime
from pathlib import Path
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
from trainguard.remediation.settings import Settings


def _live(settings: Settings, **changes: Any) -> Settings:
    return settings.model_copy(update={"dry_run": False, "require_approval": False, **changes})


def _by_action(client: TestClient) -> dict[str, dict[str, Any]]:
    actions = client.get("/v1/actions", headers=AUTH).json()["actions"]
    return {a["action"]: a for a in actions}


def _poll(client: TestClient, rank: int, job_id: str = "j") -> list[dict[str, Any]]:
    response = client.get(
        "/v1/directives", params={"job_id": job_id, "rank": rank, "wait": 0}, headers=AUTH
    )
    assert response.status_code == 200, response.text
    return list(response.json()["directives"])


def _ack(client: TestClient, directive_id: int, rank: int, outcome: str = "success") -> None:
    response = client.post(
        f"/v1/directives/{directive_id}/ack",
        json={"rank": rank, "outcome": outcome, "detail": "" if outcome == "success" else "boom"},
        headers=AUTH,
    )
    assert response.status_code == 204, response.text


def _stall(client: TestClient, job_id: str = "j", fingerprint: str = "fp1") -> None:
    """Post a stall alert and wait until the service has decided it (its plan is queued)."""
    notify(
        client, payload(alert("TrainingCollectiveStalled", fingerprint=fingerprint, job_id=job_id))
    )


def _at(transition: dict[str, Any]) -> datetime:
    return datetime.fromisoformat(transition["at"])


def _state(client: TestClient, action: str) -> str:
    return str(_by_action(client)[action]["state"])


def test_restart_waits_until_every_polling_rank_acknowledged_the_dump(
    settings: Settings, recorder: RecordingExecutor
) -> None:
    with serve(_live(settings), recorder) as client:
        assert _poll(client, 0) == [] and _poll(client, 1) == []  # both ranks listen
        _stall(client)
        wait_for(lambda: len(_poll(client, 0)) == 1)
        (directive,) = _poll(client, 1)
        assert directive["kind"] == "dump_diagnostics"
        time.sleep(0.3)  # the worker had every chance to run the restart
        assert recorder.executed == []
        assert _state(client, "dump_diagnostics") == "running"
        assert _state(client, "restart_from_checkpoint") == "queued"
        # Another plan is not held up by this one's wait.
        other = payload(alert("TrainingRankDown", fingerprint="other", job_id="k"))
        client.post("/v1/alertmanager", json=other, headers=AUTH)
        wait_for(lambda: [target for _, _, target in recorder.executed] == [{"target": "k"}])

        _ack(client, directive["id"], 0)
        time.sleep(0.3)
        assert len(recorder.executed) == 1  # rank 1 has not dumped yet
        assert _state(client, "dump_diagnostics") == "running"
        _ack(client, directive["id"], 1)
        wait_for(lambda: len(recorder.executed) == 2)
        assert recorder.executed[1][2] == {"target": "j"}

        dump = _by_action(client)["dump_diagnostics"]
        assert dump["state"] == "succeeded"
        assert dump["output"]["ranks"] == [0, 1]
        assert dump["output"]["acknowledged_by"] == [0, 1]
        notes = {t["state"]: t["note"] for t in dump["transitions"]}
        assert "queued for rank(s) 0, 1; waiting up to 30s" in notes["waiting"]
        assert notes["succeeded"] == "acknowledged by rank(s) 0, 1"
        # The restart started only after the last acknowledgement was recorded.
        restart = _by_action(client)["restart_from_checkpoint"]
        acked_at = max(_at(t) for t in dump["transitions"] if t["state"] == "acknowledged")
        started_at = next(_at(t) for t in restart["transitions"] if t["state"] == "running")
        assert started_at >= acked_at


def test_without_acknowledgement_the_plan_goes_on_after_the_timeout(
    settings: Settings, recorder: RecordingExecutor
) -> None:
    with serve(_live(settings, directive_ack_timeout_seconds=1.0), recorder) as client:
        _stall(client)
        wait_for(lambda: _state(client, "dump_diagnostics") == "running")
        time.sleep(0.5)
        assert recorder.executed == []  # still inside the timeout
        wait_for(lambda: len(recorder.executed) == 1)
        dump = _by_action(client)["dump_diagnostics"]
        assert dump["state"] == "failed"
        assert dump["output"]["error"].startswith("timed out after 1s: no rank acknowledged")
        wait_for(lambda: _state(client, "restart_from_checkpoint") == "succeeded")
        metrics = client.get("/metrics").text
        assert (
            'trainguard_remediation_actions_executed_total{action="dump_diagnostics",'
            'executor="directive",outcome="failure"} 1.0'
        ) in metrics


def test_a_failed_acknowledgement_fails_the_directive_at_once(
    settings: Settings, recorder: RecordingExecutor
) -> None:
    with serve(_live(settings), recorder) as client:
        for rank in (0, 1):
            _poll(client, rank)
        _stall(client)
        wait_for(lambda: len(_poll(client, 0)) == 1)
        (directive,) = _poll(client, 0)
        _ack(client, directive["id"], 0, outcome="failure")
        wait_for(lambda: len(recorder.executed) == 1)  # no waiting for rank 1 nor the timeout
        dump = _by_action(client)["dump_diagnostics"]
        assert dump["state"] == "failed"
        assert dump["output"]["error"] == "rank 0 could not carry out dump_diagnostics: boom"


def test_unknown_ranks_settle_after_the_first_acknowledgement(
    settings: Settings, recorder: RecordingExecutor
) -> None:
    live = _live(settings, directive_ack_settle_seconds=0.5)
    with serve(live, recorder) as client:
        _stall(client)  # no rank polled: which ranks the directive reaches is unknown
        # Queued, and its wait recorded: polling any earlier would make rank 3 a known one.
        wait_for(lambda: _by_action(client)["dump_diagnostics"]["output"] is not None)
        (directive,) = _poll(client, 3)
        _ack(client, directive["id"], 3)
        acked = time.monotonic()
        wait_for(lambda: len(recorder.executed) == 1)
        assert time.monotonic() - acked >= 0.4  # the others had their settling time
        dump = _by_action(client)["dump_diagnostics"]
        assert dump["state"] == "succeeded" and dump["output"]["acknowledged_by"] == [3]


def _directives(db: Path) -> list[tuple[int, float]]:
    with sqlite3.connect(db) as conn:
        return conn.execute("SELECT id, created_at FROM directives").fetchall()


def test_a_restarted_service_resumes_the_wait_without_queueing_again(
    settings: Settings, recorder: RecordingExecutor
) -> None:
    live = _live(settings)
    with serve(live, recorder) as client:
        _poll(client, 0)
        _stall(client)
        wait_for(lambda: _state(client, "dump_diagnostics") == "running")
        wait_for(lambda: len(_poll(client, 0)) == 1)
    queued = _directives(live.db_path)
    with serve(live, recorder) as client:
        time.sleep(0.3)
        assert _directives(live.db_path) == queued  # not queued again
        dump = _by_action(client)["dump_diagnostics"]
        assert dump["state"] == "running"
        assert (
            "resumed (restart, take-over or failed commit): still waiting"
            in dump["transitions"][-1]["note"]
        )
        assert recorder.executed == []
        (directive,) = _poll(client, 0)
        _ack(client, directive["id"], 0)
        wait_for(lambda: len(recorder.executed) == 1)
        assert _state(client, "dump_diagnostics") == "succeeded"


def test_the_timeout_runs_from_the_stored_directive_across_a_restart(
    settings: Settings, recorder: RecordingExecutor
) -> None:
    live = _live(settings, directive_ack_timeout_seconds=1.0)
    with serve(live.model_copy(update={"directive_ack_timeout_seconds": 60.0}), recorder) as c:
        _stall(c)
        wait_for(lambda: _state(c, "dump_diagnostics") == "running")
    time.sleep(1.0)
    with serve(live, recorder) as client:
        # The second's timeout passed while the service was down: no fresh wait of 1 s.
        started = time.monotonic()
        wait_for(lambda: len(recorder.executed) == 1)
        assert time.monotonic() - started < 0.9
        assert _state(client, "dump_diagnostics") == "failed"
        assert len(_directives(live.db_path)) == 1


def test_a_targeted_rank_that_stops_polling_is_not_waited_for(
    settings: Settings, recorder: RecordingExecutor, monkeypatch: Any
) -> None:
    # Ranks count as listening for long_poll_max + grace after their last poll: keep it short.
    monkeypatch.setattr("trainguard.remediation.app.LISTENING_GRACE_SECONDS", 0.2)
    with serve(_live(settings, long_poll_max_seconds=0.3), recorder) as client:
        for rank in (0, 1, 2):
            assert _poll(client, rank) == []
        _stall(client)
        wait_for(lambda: len(_poll(client, 0)) == 1)
        (directive,) = _poll(client, 1)
        _ack(client, directive["id"], 0)
        _ack(client, directive["id"], 1)  # rank 2 died: it never polls again
        wait_for(lambda: _state(client, "dump_diagnostics") == "succeeded", timeout=10)
        dump = _by_action(client)["dump_diagnostics"]
        assert dump["output"]["ranks"] == [0, 1, 2]
        assert dump["transitions"][-1]["note"] == (
            "acknowledged by rank(s) 0, 1; rank(s) 2 stopped polling"
        )
        wait_for(lambda: len(recorder.executed) == 1)  # and the restart went ahead
