"""The webhook's inbox: accepted notifications are decided in order, after the answer, once;
a restart decides what was left; one that cannot be decided is kept and counted."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest
from sqlalchemy import text

from tests.remediation.conftest import (
    AUTH,
    alert,
    both_backends,
    drained,
    payload,
    rows,
    runtime_of,
    serve,
    wait_for,
)
from tests.remediation.postgres import Cluster
from trainguard import contract
from trainguard.remediation import inbox
from trainguard.remediation.engine import Engine, Guards
from trainguard.remediation.inbox import Decider
from trainguard.remediation.metrics import Metrics
from trainguard.remediation.models import WebhookPayload
from trainguard.remediation.policy import load_policy
from trainguard.remediation.settings import Settings
from trainguard.remediation.store import Store


def _metric(client: Any, spec: contract.MetricSpec) -> float:
    for line in client.get("/metrics").text.splitlines():
        if line.startswith(f"{spec.name} "):
            return float(line.split()[-1])
    raise AssertionError(f"{spec.name} not exposed")


@both_backends
def test_a_group_is_decided_in_the_order_it_was_accepted(settings: Settings) -> None:
    # Posted back to back, without waiting for any decision: firing, resolved, then the firing
    # re-send a peer delivers late. Decided in that order, the alert ends resolved with its
    # action cancelled; in any other order it would not.
    settings = settings.model_copy(update={"dry_run": False})
    firing = payload(alert("TrainingRankDown", fingerprint="a", job_id="j1"))
    resolved = payload(
        alert("TrainingRankDown", fingerprint="a", job_id="j1", status="resolved"),
        status="resolved",
    )
    with serve(settings) as client:
        ids = [
            client.post("/v1/alertmanager", json=body, headers=AUTH).json()["notification"]
            for body in (firing, resolved, firing)
        ]
        assert ids == sorted(ids)
        drained(client)
        assert rows(settings, "SELECT status, notifications FROM alerts") == [("resolved", 3)]
        assert rows(settings, "SELECT state FROM actions") == [("cancelled",)]
        decided = [
            client.get(f"/v1/notifications/{i}", headers=AUTH).json()["decided_at"] for i in ids
        ]
        assert decided == sorted(decided)


def test_the_lag_is_visible_and_a_restart_decides_what_was_left(settings: Settings) -> None:
    with serve(settings) as client:
        runtime_of(client).decider.stop()  # as if the process died before deciding
        accepted = [
            client.post(
                "/v1/alertmanager",
                json=payload(alert(fingerprint=f"f{i}", job_id=f"j{i}")),
                headers=AUTH,
            ).json()["notification"]
            for i in range(3)
        ]
        assert _metric(client, contract.REMEDIATION_INBOX_DEPTH) == 3
        wait_for(lambda: _metric(client, contract.REMEDIATION_INBOX_OLDEST_AGE) > 0)
        view = client.get(f"/v1/notifications/{accepted[0]}", headers=AUTH).json()
        assert (view["decided_at"], view["result"], view["alerts"]) == (None, None, 1)
        # A long-poll that ends before the decision answers the undecided entry.
        waited = client.get(
            f"/v1/notifications/{accepted[0]}", params={"wait": 0.2}, headers=AUTH
        ).json()
        assert waited["decided_at"] is None
        assert rows(settings, "SELECT COUNT(*) FROM alerts") == [(0,)]
    with serve(settings) as client:  # the next start drains the inbox first
        drained(client)
        wait_for(lambda: rows(settings, "SELECT COUNT(*) FROM alerts") == [(3,)])
        views = [
            client.get(f"/v1/notifications/{i}", params={"wait": 5}, headers=AUTH).json()
            for i in accepted
        ]
        assert [v["result"]["stored"] for v in views] == [1, 1, 1]
        assert _metric(client, contract.REMEDIATION_INBOX_DEPTH) == 0
        assert _metric(client, contract.REMEDIATION_INBOX_OLDEST_AGE) == 0


def test_a_notification_that_cannot_be_decided_is_kept_and_counted(
    settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    broken = payload(alert(fingerprint="broken", job_id="j1"))
    after = payload(alert(fingerprint="after", job_id="j2"))
    with serve(settings) as client:
        engine = runtime_of(client).engine
        ingest = engine.ingest
        tries = 0

        def failing(notification: Any, now: float | None = None) -> Any:
            nonlocal tries
            if notification.alerts[0].fingerprint != "broken":
                return ingest(notification, now)

            def unit(conn: Any) -> Any:
                nonlocal tries
                tries += 1
                raise RuntimeError("a bug in deciding")

            return unit

        monkeypatch.setattr(engine, "ingest", failing)
        first = client.post("/v1/alertmanager", json=broken, headers=AUTH).json()
        second = client.post("/v1/alertmanager", json=after, headers=AUTH).json()
        drained(client)
        failed = client.get(f"/v1/notifications/{first['notification']}", headers=AUTH).json()
        assert failed["decided_at"] is not None and failed["result"] is None
        assert "a bug in deciding" in failed["error"]
        assert tries == 3  # tried again a few times, then given up on: not retried for ever
        # Kept as received, for an operator to look at; the one behind it was decided.
        ((body,),) = rows(settings, "SELECT body FROM inbox WHERE error IS NOT NULL")
        assert b'"broken"' in bytes(body)
        ok = client.get(f"/v1/notifications/{second['notification']}", headers=AUTH).json()
        assert ok["result"]["stored"] == 1 and ok["error"] is None
        assert rows(settings, "SELECT fingerprint FROM alerts") == [("after",)]
        assert _metric(client, contract.REMEDIATION_INBOX_FAILED) == 1
        assert _metric(client, contract.REMEDIATION_INBOX_DEPTH) == 0
    with serve(settings) as client:  # a failed entry is not decided again at the next start
        drained(client)
        assert tries == 3


@pytest.mark.parametrize("settings", ["postgres"], indirect=True)
def test_a_nul_character_postgres_cannot_store_is_refused_before_the_inbox(
    settings: Settings,
) -> None:
    body = payload(alert(job_id="j1", fingerprint="nul"))
    body["alerts"][0]["labels"]["note"] = "a\u0000b"
    with serve(settings) as client:
        response = client.post("/v1/alertmanager", json=body, headers=AUTH)
        assert response.status_code == 422, response.text
        assert rows(settings, "SELECT COUNT(*) FROM inbox") == [(0,)]
        # The escape spelled out (a backslash, then u0000) is text like any other.
        body["alerts"][0]["labels"]["note"] = "\\u0000"
        assert client.post("/v1/alertmanager", json=body, headers=AUTH).status_code == 200


def test_replicas_draining_one_inbox_decide_each_notification_once(
    postgres_cluster: Cluster,
) -> None:
    # Two replicas' deciders on one Postgres database, started on the same 40 entries: each
    # is decided by one of them (a second decision would count its alert twice).
    url = postgres_cluster.new_database()
    replicas = []
    for _ in range(2):
        store = Store(url)
        engine = Engine(load_policy(None), Guards())
        decider = Decider(
            store, engine, Metrics(store, True), wake_worker=lambda: None, decide_within=15.0
        )
        replicas.append((store, engine, decider))
    try:
        store, engine, _ = replicas[0]
        for i in range(40):
            body = payload(alert("TrainingRankDown", fingerprint=f"f{i}", job_id=f"j{i}"))
            notification = WebhookPayload.model_validate(body)
            store.write_sync(inbox.accept(json.dumps(body).encode(), notification, time.time()))
        for _, _, decider in replicas:
            decider.start()
        wait_for(lambda: store.read(lambda conn: inbox.lag(conn, time.time()))[0] == 0, timeout=30)
        found = store.read(
            lambda conn: conn.execute(text("SELECT notifications FROM alerts")).all()
        )
        assert [row[0] for row in found] == [1] * 40
        actions = store.read(lambda conn: conn.execute(text("SELECT COUNT(*) FROM actions")))
        assert actions.scalar_one() == 40
    finally:
        for store, _, decider in replicas:
            decider.stop()
            store.close()


def test_deciding_defers_to_a_storm_until_the_lag_allowed_then_takes_a_fifth() -> None:
    """While notifications keep arriving: within ``decide_within`` of lag the decider all but
    stops (its units hold the writer every answer waits for), past it it still decides a
    fifth of the time, so a long storm's lag grows no faster than it must."""
    took = 0.004
    within, past = inbox.pause(took, 2.0, 15.0), inbox.pause(took, 16.0, 15.0)
    assert took / (took + within) < 0.05  # under a twentieth of the time within the lag
    assert took / (took + past) == pytest.approx(0.2)
    assert inbox.pause(2 * took, 2.0, 15.0) == pytest.approx(2 * within)
    # decide_within 0: never defer past the fifth.
    assert inbox.pause(took, 0.0, 0.0) == past
