"""Durability: nothing acknowledged is lost to kill -9, and actions run exactly once."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import Connection, text
from sqlalchemy.exc import IntegrityError

from tests.ports import free_port
from tests.remediation.conftest import (
    AUTH,
    TOKEN,
    RecordingExecutor,
    alert,
    both_backends,
    drained,
    payload,
    rows,
    serve,
    wait_for,
)
from trainguard.remediation.settings import Settings


def _db(path: Path, sql: str, *args: object) -> list[tuple[object, ...]]:
    with sqlite3.connect(path) as conn:
        return conn.execute(sql, args).fetchall()


def _crash_after_claim(db: Path, action_id: int, snapshot: str) -> None:
    """Leave the action as a killed worker would: claimed (running) with its snapshot."""
    with sqlite3.connect(db) as conn:
        conn.execute(
            "UPDATE actions SET state = 'running', snapshot = ? WHERE id = ?", (snapshot, action_id)
        )


def test_running_action_resumes_once_from_its_snapshot(
    settings: Settings, recorder: RecordingExecutor
) -> None:
    live = settings.model_copy(update={"dry_run": False})
    with serve(live, recorder) as client:
        client.post(
            "/v1/alertmanager", json=payload(alert("TrainingRankDown", job_id="j")), headers=AUTH
        )
        drained(client)
        (action,) = client.get("/v1/actions", headers=AUTH).json()["actions"]
        assert action["state"] == "awaiting_approval"
    _crash_after_claim(live.db_path, action["id"], '{"target": "from-snapshot"}')
    with serve(live, recorder) as client:
        wait_for(lambda: recorder.executed != [])
        wait_for(
            lambda: (
                client.get(f"/v1/actions/{action['id']}", headers=AUTH).json()["state"]
                == "succeeded"
            )
        )
        view = client.get(f"/v1/actions/{action['id']}", headers=AUTH).json()
        assert "resumed (restart, take-over or failed commit)" in view["transitions"][-2]["note"]
    # The executor acted on the stored snapshot, not on a fresh look at the world.
    assert recorder.executed == [
        (action["id"], "restart_from_checkpoint", {"target": "from-snapshot"})
    ]


def test_directive_queued_before_a_crash_is_not_queued_twice(settings: Settings) -> None:
    live = settings.model_copy(update={"dry_run": False, "directive_ack_settle_seconds": 0.1})
    with serve(live) as client:
        client.post(
            "/v1/alertmanager", json=payload(alert("TrainingOOMRisk", job_id="j")), headers=AUTH
        )
        (directive,) = client.get(
            "/v1/directives", params={"job_id": "j", "rank": 0, "wait": 5}, headers=AUTH
        ).json()["directives"]
        client.post(f"/v1/directives/{directive['id']}/ack", json={"rank": 0}, headers=AUTH)
        wait_for(
            lambda: (
                {a["state"] for a in client.get("/v1/actions", headers=AUTH).json()["actions"]}
                == {"succeeded"}
            )
        )
    ((action_id,),) = _db(live.db_path, "SELECT action_id FROM directives")
    assert isinstance(action_id, int)
    # The process died after queueing the directive but before recording that it waits.
    _crash_after_claim(live.db_path, action_id, '{"job_id": "j", "rank": null}')
    _db(live.db_path, "UPDATE actions SET output = NULL WHERE id = ?", action_id)
    with serve(live) as client:
        wait_for(
            lambda: (
                client.get(f"/v1/actions/{action_id}", headers=AUTH).json()["state"] == "succeeded"
            )
        )
    assert _db(live.db_path, "SELECT COUNT(*) FROM directives") == [(1,)]


def _start(settings: Settings, port: int) -> subprocess.Popen[bytes]:
    database = (
        {"TRAINGUARD_REMEDIATION_DB_PATH": str(settings.db_path)}
        if settings.database_url is None
        else {"TRAINGUARD_REMEDIATION_DATABASE_URL": settings.database_url.get_secret_value()}
    )
    env = {
        **os.environ,
        **database,
        "TRAINGUARD_REMEDIATION_TOKEN": TOKEN,
        "TRAINGUARD_REMEDIATION_REQUIRE_APPROVAL": "false",
        "TRAINGUARD_REMEDIATION_COOLDOWN_SECONDS": "0",
        "TRAINGUARD_REMEDIATION_BUDGET_PER_HOUR": "1000000",
        # No rank polls: each directive fails by its acknowledgement timeout, soon.
        "TRAINGUARD_REMEDIATION_DIRECTIVE_ACK_TIMEOUT_SECONDS": "0.2",
        # Postgres: the restarted service waits this long before it resumes running actions
        # (the process that held the lock could still be executing one); the executors here
        # finish at once.
        "TRAINGUARD_REMEDIATION_EXECUTOR_TIMEOUT_SECONDS": "1",
        "TRAINGUARD_REMEDIATION_TAKEOVER_GRACE_SECONDS": "2",
    }
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "trainguard.remediation.cli",
            "--port",
            str(port),
            "--live",
            "--log-level",
            "WARNING",
        ],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 30
    while True:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=1).status_code == 200:
                return proc
        except httpx.TransportError:
            pass
        assert proc.poll() is None, "the service exited"
        assert time.monotonic() < deadline, "the service did not become ready"
        time.sleep(0.1)


@both_backends
def test_kill_9_under_load_loses_nothing_acknowledged(settings: Settings) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    proc = _start(settings, port)
    acked: list[str] = []
    errors = 0
    lock = threading.Lock()
    stop = threading.Event()

    def load(worker: int) -> None:
        nonlocal errors
        with httpx.Client(base_url=url, headers=AUTH, timeout=5) as client:
            n = 0
            while not stop.is_set():
                fingerprint = f"w{worker}-{n}"
                n += 1
                body = payload(
                    alert("TrainingOOMRisk", fingerprint=fingerprint, job_id=f"job{worker}")
                )
                try:
                    response = client.post("/v1/alertmanager", json=body)
                except httpx.TransportError:
                    with lock:
                        errors += 1
                    continue
                if response.status_code == 200:
                    with lock:
                        acked.append(fingerprint)

    threads = [threading.Thread(target=load, args=(i,)) for i in range(4)]
    for thread in threads:
        thread.start()
    wait_for(lambda: len(acked) >= 200, timeout=30)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    time.sleep(0.3)
    stop.set()
    for thread in threads:
        thread.join()
    assert errors > 0  # requests were in flight when the process died

    # Every acknowledged notification is in the inbox; the restarted service decides those the
    # killed one had not, before anything else.
    assert rows(settings, "SELECT COUNT(*) FROM inbox")[0][0] >= len(acked)
    proc = _start(settings, port)
    try:
        wait_for(
            lambda: rows(settings, "SELECT COUNT(*) FROM inbox WHERE decided_at IS NULL") == [(0,)],
            timeout=60,
        )
        assert rows(settings, "SELECT COUNT(*) FROM inbox WHERE error IS NOT NULL") == [(0,)]
        stored = {row[0] for row in rows(settings, "SELECT fingerprint FROM alerts")}
        assert set(acked) <= stored, f"{len(set(acked) - stored)} acknowledged alerts lost"
        # Every stored alert was planned in the unit that stored it: two actions each.
        planned = rows(
            settings,
            "SELECT COUNT(*) FROM actions JOIN alerts ON alerts.id = actions.alert_id",
        )[0][0]
        assert planned == 2 * len(stored)

        def drained() -> bool:
            left = rows(
                settings, "SELECT COUNT(*) FROM actions WHERE state IN ('queued', 'running')"
            )
            return bool(left[0][0] == 0)

        wait_for(drained, timeout=60)
        # Exactly once: each checkpoint_now action queued exactly one directive, and, with no
        # rank to acknowledge it, failed by the acknowledgement timeout and by nothing else.
        # The error is the output's only "error" key (json.dumps spells it this way).
        timed_out = rows(
            settings,
            "SELECT COUNT(*) FROM actions WHERE action = 'checkpoint_now' AND state = 'failed' "
            """AND output LIKE '%"error": "timed out after 0.2s: no rank%'""",
        )
        assert timed_out == rows(settings, "SELECT COUNT(*) FROM directives")
        assert timed_out == rows(
            settings, "SELECT COUNT(*) FROM actions WHERE action = 'checkpoint_now'"
        )
        assert rows(settings, "SELECT COUNT(*) FROM actions WHERE state = 'failed'") == timed_out
        assert rows(settings, "SELECT DISTINCT state FROM actions WHERE action = 'recommend'") == [
            ("succeeded",)
        ]
    finally:
        proc.terminate()
        proc.wait(10)


def test_a_caller_that_gave_up_gets_nothing_written(tmp_path: Path) -> None:
    from trainguard.remediation.store import Store

    store = Store(tmp_path / "s.db")
    gate = threading.Event()
    try:
        blocker = store.submit(lambda conn: gate.wait(5))
        wait_for(blocker.running)  # the next units queue behind it
        abandoned = store.submit(
            lambda conn: conn.execute(text("INSERT INTO breakers VALUES ('x', 0, 'r')"))
        )
        assert abandoned.cancel()
        kept = store.submit(
            lambda conn: conn.execute(text("INSERT INTO breakers VALUES ('y', 0, 'r')"))
        )
        gate.set()
        blocker.result(5)
        kept.result(5)
        assert store.writer_alive()
        assert _db(tmp_path / "s.db", "SELECT subject FROM breakers") == [("y",)]
    finally:
        store.close()


def test_a_requests_unit_commits_before_a_background_unit_queued_before_it(
    tmp_path: Path,
) -> None:
    """The webhook's answer does not wait for a decision queued beside it."""
    from trainguard.remediation.store import Store

    store = Store(tmp_path / "s.db")
    gate, answered = threading.Event(), threading.Event()
    insert = "INSERT INTO breakers (subject, tripped_at, reason) VALUES ('{}', 0, 'r')"

    def background(conn: Any) -> bool:
        conn.execute(text(insert.format("background")))
        # Under one commit with the request's unit, that answer would come after this returns.
        return answered.wait(5)

    try:
        blocker = store.submit(lambda conn: gate.wait(5))
        wait_for(blocker.running)  # the next units queue behind it, in one batch
        behind = store.submit(background)
        request = store.submit(
            lambda conn: conn.execute(text(insert.format("request"))), answering=True
        )
        request.add_done_callback(lambda _: answered.set())
        gate.set()
        assert behind.result(10), "the request's unit waited for the background unit"
        request.result(5)
        assert sorted(_db(tmp_path / "s.db", "SELECT subject FROM breakers")) == [
            ("background",),
            ("request",),
        ]
    finally:
        store.close()


@both_backends
def test_a_unit_alone_that_fails_writes_nothing_and_the_store_goes_on(settings: Settings) -> None:
    """A batch of one unit runs without a savepoint: its failure rolls the transaction back."""
    from trainguard.remediation.store import Store, StoreError

    store = Store(settings.database(), synchronous="NORMAL")
    insert = "INSERT INTO breakers (subject, tripped_at, reason) VALUES ('{}', 0, 'r')"

    def half_done(conn: Connection) -> None:
        conn.execute(text(insert.format("half")))
        raise LookupError("the unit's own error, after a write")

    try:
        with pytest.raises(LookupError, match="after a write"):
            store.write_sync(half_done)
        duplicate = insert.format("twice") + ", ('twice', 0, 'r')"
        with pytest.raises(StoreError, match="the database refused the change"):
            store.write_sync(lambda conn: conn.execute(text(duplicate)))
        store.write_sync(lambda conn: conn.execute(text(insert.format("after"))))
        assert store.writer_alive()
        assert rows(settings, "SELECT subject FROM breakers") == [("after",)]
    finally:
        store.close()


@both_backends
def test_a_unit_the_database_refuses_is_a_store_error_and_its_batch_is_kept(
    settings: Settings,
) -> None:
    from trainguard.remediation import operators
    from trainguard.remediation.models import Decision
    from trainguard.remediation.sql import Statement
    from trainguard.remediation.store import Store, StoreError

    store = Store(settings.database(), synchronous="NORMAL")
    gate = threading.Event()
    try:
        blocker = store.submit(lambda conn: gate.wait(5))
        wait_for(blocker.running)  # the units below share one batch
        before = store.submit(operators.reset_breaker("nobody"))  # a domain error
        insert = "INSERT INTO breakers (subject, tripped_at, reason) VALUES ('{}', 0, 'r')"
        refused = store.submit(
            lambda conn: conn.execute(text(insert.format("a") + ", ('a', 0, 'r')"))
        )
        kept = store.submit(lambda conn: conn.execute(text(insert.format("b"))))
        # The same refusal on the write path's own statements (run on the DBAPI cursor).
        duplicate = Statement(insert.format("b"))
        refused_raw = store.submit(lambda conn: duplicate.run(conn, {}))
        decided = store.submit(operators.decide(12345, True, Decision()))
        gate.set()
        with pytest.raises(StoreError, match="the database refused the change"):
            refused.result(5)
        kept.result(5)
        with pytest.raises(StoreError, match="the database refused the change") as raised:
            refused_raw.result(5)
        assert isinstance(raised.value.__cause__, IntegrityError)
        with pytest.raises(LookupError, match="no open circuit breaker"):
            before.result(5)
        with pytest.raises(LookupError, match="no action 12345"):
            decided.result(5)
        assert store.writer_alive()
        assert rows(settings, "SELECT subject FROM breakers") == [("b",)]
    finally:
        store.close()


def test_an_action_whose_claim_was_committed_but_not_answered_still_runs(
    settings: Settings, recorder: RecordingExecutor, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The claim's commit succeeds but its answer is lost (a connection dropped after COMMIT):
    # the worker must not leave the action running for good, nor run it twice.
    from trainguard.remediation.engine import Engine, Guards
    from trainguard.remediation.metrics import Metrics
    from trainguard.remediation.models import WebhookPayload
    from trainguard.remediation.policy import load_policy
    from trainguard.remediation.store import Store, StoreError
    from trainguard.remediation.worker import Worker

    store = Store(settings.database(), synchronous="NORMAL")
    engine = Engine(load_policy(None), Guards(dry_run=False, require_approval=False))
    alerts = payload(alert("TrainingRankDown", fingerprint="z", job_id="job-z"))
    store.write_sync(engine.ingest(WebhookPayload.model_validate(alerts)))
    committed = store.write_sync
    writes = 0

    def answer_lost_once(unit: Any) -> Any:
        nonlocal writes
        result = committed(unit)
        writes += 1
        if writes == 2:  # the sweep, then the claim
            raise StoreError("commit failed: connection lost after COMMIT")
        return result

    monkeypatch.setattr(store, "write_sync", answer_lost_once)
    worker = Worker(store, engine, {"local": recorder}, Metrics(store, False), sweep_interval=0.05)
    worker.start()
    try:
        wait_for(lambda: len(recorder.executed) == 1)
        wait_for(lambda: rows(settings, "SELECT state FROM actions") == [("succeeded",)], timeout=5)
        time.sleep(0.3)
        assert len(recorder.executed) == 1
    finally:
        worker.stop()
        store.close()


def test_sqlite_checkpoints_run_off_the_writer(tmp_path: Path) -> None:
    # Commits do not copy the WAL into the database file (no checkpoint inside a webhook's
    # commit); the store's own thread does, so the file itself catches up soon after.
    from trainguard.remediation.store import Store

    path = tmp_path / "c.db"
    store = Store(path, synchronous="NORMAL")
    try:
        (autocheckpoint,) = store.read(
            lambda conn: conn.exec_driver_sql("PRAGMA wal_autocheckpoint").one()
        )
        assert autocheckpoint == 0
        store.write_sync(
            lambda conn: conn.execute(text("INSERT INTO breakers VALUES ('x', 0, 'r')"))
        )

        def in_the_file() -> bool:
            # immutable=1 reads the database file alone, ignoring the WAL, and takes no lock: a
            # read while the checkpointer copies pages into the file can see it half written
            # ("malformed"), which means "not there yet", as a missing schema does.
            with sqlite3.connect(f"file:{path}?immutable=1", uri=True) as conn:
                try:
                    found = conn.execute("SELECT subject FROM breakers").fetchall()
                except sqlite3.DatabaseError:
                    return False
            return found == [("x",)]

        wait_for(in_the_file, timeout=10)
    finally:
        store.close()
    # The torn reads above were the probe's, never the file's: with its lock, the file is whole.
    with sqlite3.connect(path) as conn:
        assert conn.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
        assert conn.execute("SELECT subject FROM breakers").fetchall() == [("x",)]
