"""Postgres: replicas sharing one database, start-up errors, readiness when it goes away."""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping
from typing import Any

import pytest
from pydantic import SecretStr, ValidationError
from sqlalchemy import text

from tests.ports import free_port
from tests.remediation.conftest import (
    AUTH,
    RecordingExecutor,
    alert,
    both_backends,
    payload,
    rows,
    serve,
    wait_for,
)
from tests.remediation.postgres import Cluster, admin_engine
from trainguard.remediation import cli
from trainguard.remediation.engine import Engine, Guards
from trainguard.remediation.executors import ActionRecord
from trainguard.remediation.metrics import Metrics
from trainguard.remediation.models import WebhookPayload
from trainguard.remediation.policy import load_policy
from trainguard.remediation.settings import Settings
from trainguard.remediation.store import Store, StoreError
from trainguard.remediation.worker import Worker


def _replica(
    url: str, recorder: RecordingExecutor | None = None, takeover_grace: float = 0.0
) -> tuple[Store, Engine, Worker, RecordingExecutor]:
    store = Store(url)
    engine = Engine(load_policy(None), Guards(dry_run=False, require_approval=False))
    recorder = recorder or RecordingExecutor()
    worker = Worker(
        store,
        engine,
        {"local": recorder},
        Metrics(store, False),
        sweep_interval=0.05,
        takeover_grace=takeover_grace,
    )
    return store, engine, worker, recorder


class SlowExecutor(RecordingExecutor):
    """Takes a while to carry an action out, like a pod deletion waiting on the API server."""

    def execute(self, action: ActionRecord, snapshot: Mapping[str, Any]) -> dict[str, Any]:
        time.sleep(1.5)
        return super().execute(action, snapshot)


def _terminate(cluster: Cluster, which: str) -> None:
    """Ends the server sessions ``which`` (SQL yielding backend pids) selects."""
    admin = admin_engine(cluster.url("postgres"))
    try:
        with admin.connect() as conn:
            pids = conn.execute(text(which)).scalars().all()
            assert pids, which
            for pid in pids:
                conn.execute(text("SELECT pg_terminate_backend(:pid)"), {"pid": pid})
    finally:
        admin.dispose()


_LOCK_HOLDER = "SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND granted"


def _post(store: Store, engine: Engine, *fingerprints: str) -> None:
    alerts = [alert("TrainingRankDown", fingerprint=f, job_id=f"job-{f}") for f in fingerprints]
    store.write_sync(engine.ingest(WebhookPayload.model_validate(payload(*alerts))))


def test_two_replicas_execute_each_action_exactly_once(postgres_cluster: Cluster) -> None:
    url = postgres_cluster.new_database()
    replicas = [_replica(url), _replica(url)]
    for _, _, worker, _ in replicas:
        worker.start()
    try:
        # Both replicas accept webhooks; whichever worker holds the lock executes everything.
        for i in range(20):
            store, engine, _, _ = replicas[i % 2]
            _post(store, engine, f"a{i}")
            replicas[0][2].wake()
            replicas[1][2].wake()

        def executed() -> list[int]:
            return [e[0] for *_, recorder in replicas for e in recorder.executed]

        wait_for(lambda: len(executed()) == 20)
        assert sorted(executed()) == sorted(set(executed()))
        assert sorted(len(r.executed) for *_, r in replicas) == [0, 20]
        # The executing replica goes away: the other one's worker takes over.
        active = next(i for i, (*_, r) in enumerate(replicas) if r.executed)
        store, _, worker, _ = replicas.pop(active)
        worker.stop()
        store.close()
        (store, engine, worker, recorder) = replicas[0]
        _post(store, engine, "after")
        worker.wake()
        wait_for(lambda: len(recorder.executed) == 1)
    finally:
        for store, _, worker, _ in replicas:
            worker.stop()
            store.close()


def test_an_unreachable_database_fails_start_up_in_one_line(
    capsys: pytest.CaptureFixture[str],
) -> None:
    url = f"postgresql://trainguard:s3cret@127.0.0.1:{free_port()}/remediation"
    assert cli.main(["--insecure-no-auth", "--database-url", url]) == 2
    error = capsys.readouterr().err
    assert error.count("\n") == 1
    assert "127.0.0.1" in error
    assert "s3cret" not in error


def test_a_database_url_that_is_not_postgres_is_refused(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert cli.main(["--insecure-no-auth", "--database-url", "mysql://db/remediation"]) == 2
    assert "postgresql://" in capsys.readouterr().err


def test_not_ready_when_the_database_goes_away(
    settings: Settings, postgres_cluster: Cluster
) -> None:
    url = postgres_cluster.new_database()
    with serve(settings.model_copy(update={"database_url": SecretStr(url)})) as client:
        assert client.get("/readyz").status_code == 200
        assert client.post("/v1/alertmanager", json=payload(alert()), headers=AUTH).is_success
        admin = admin_engine(postgres_cluster.url("postgres"))
        with admin.connect() as conn:
            database = url.rsplit("/", 1)[1]
            conn.execute(text(f'DROP DATABASE "{database}" WITH (FORCE)'))
        admin.dispose()
        response = client.get("/readyz")
        assert response.status_code == 503
        assert "store" in response.json()["status"]


def test_a_replica_that_loses_its_lock_mid_action_does_not_get_it_run_twice(
    postgres_cluster: Cluster,
) -> None:
    # The lock holder's session drops (a failover, a network blip) while its process lives on
    # and is executing: the replica that takes over must not resume that action meanwhile.
    url = postgres_cluster.new_database()
    replicas = [_replica(url, SlowExecutor(), takeover_grace=3.0) for _ in range(2)]
    for _, _, worker, _ in replicas:
        worker.start()
    try:
        store, engine, _, _ = replicas[0]
        _post(store, engine, "first")
        for _, _, worker, _ in replicas:
            worker.wake()
        time.sleep(0.5)  # the lock holder is inside the slow execution now
        _terminate(postgres_cluster, _LOCK_HOLDER)
        # The other replica takes the lock and, after its grace, executes what comes next.
        _post(store, engine, "second")
        for _, _, worker, _ in replicas:
            worker.wake()

        def executed() -> list[int]:
            return [e[0] for *_, recorder in replicas for e in recorder.executed]

        wait_for(lambda: len(executed()) >= 2, timeout=20)
        time.sleep(4)  # past the grace: a resumed duplicate would show up now
        assert sorted(executed()) == sorted(set(executed())), executed()
        assert len(executed()) == 2
    finally:
        for store, _, worker, _ in replicas:
            worker.stop()
            store.close()


def test_replicas_take_turns_on_the_guards(postgres_cluster: Cluster) -> None:
    # Alerts of one job reach two replicas at the same instant: the cooldown still holds, so
    # only one restart is queued per job.
    url = postgres_cluster.new_database()
    replicas = [_replica(url) for _ in range(2)]
    try:
        jobs = [f"job-{n}" for n in range(15)]
        barrier = threading.Barrier(2)

        def post(index: int) -> None:
            store, engine, _, _ = replicas[index]
            for job in jobs:
                barrier.wait(5)
                alerts = [alert("TrainingRankDown", fingerprint=f"{job}-{index}", job_id=job)]
                store.write_sync(engine.ingest(WebhookPayload.model_validate(payload(*alerts))))

        threads = [threading.Thread(target=post, args=(i,)) for i in range(2)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
        states = replicas[0][0].read(
            lambda conn: conn.execute(text("SELECT subject, state FROM actions")).all()
        )
        queued = sorted(subject for subject, state in states if state == "queued")
        assert queued == sorted(jobs), states
        assert len(states) == 2 * len(jobs)
    finally:
        for store, *_ in replicas:
            store.close()


def test_the_writer_recovers_from_a_lost_connection(postgres_cluster: Cluster) -> None:
    url = postgres_cluster.new_database()
    store, engine, _, _ = _replica(url)
    try:
        _post(store, engine, "before")
        writer = store.write_sync(
            lambda conn: conn.execute(text("SELECT pg_backend_pid()")).scalar_one()
        )
        _terminate(postgres_cluster, f"SELECT {int(writer)}")
        outcomes: list[str] = []
        for attempt in range(3):
            try:
                _post(store, engine, f"after-{attempt}")
            except StoreError as error:
                outcomes.append(f"refused: {error}")
            else:
                outcomes.append("stored")
                break
        # At most the batch that met the dead connection is refused (503: Alertmanager
        # retries); the writer carries on with a new connection.
        assert outcomes[-1] == "stored", outcomes
        assert len(outcomes) <= 2, outcomes
        assert store.writer_alive()
    finally:
        store.close()


def test_a_malformed_url_fails_in_one_line_without_the_password(
    capsys: pytest.CaptureFixture[str],
) -> None:
    url = "postgresql://trainguard:s3cret@db:notaport/remediation"
    assert cli.main(["--insecure-no-auth", "--database-url", url]) == 2
    error = capsys.readouterr().err
    assert error.count("\n") == 1
    assert "cannot be parsed" in error
    assert "s3cret" not in error
    assert "s3cret" not in repr(Settings(database_url=SecretStr(url), insecure_no_auth=True))


@both_backends
def test_data_the_database_cannot_store_is_refused_for_good(settings: Settings) -> None:
    # Postgres keeps no NUL character in text: retrying would never succeed, so the answer is
    # 422 (Alertmanager does not retry it), and nothing of the notification is stored.
    body = payload(alert(job_id="j1", fingerprint="nul"))
    body["alerts"][0]["generatorURL"] = "http://prometheus/graph?g0.expr=\u0000"
    with serve(settings) as client:
        response = client.post("/v1/alertmanager", json=body, headers=AUTH)
        if settings.database_url is None:
            assert response.status_code == 200  # SQLite stores it as it is
            return
        assert response.status_code == 422, response.text
        assert "cannot store" in response.json()["detail"]
        assert rows(settings, "SELECT COUNT(*) FROM alerts") == [(0,)]
        ok = client.post("/v1/alertmanager", json=payload(alert(job_id="j1")), headers=AUTH)
        assert ok.status_code == 200


def test_the_take_over_grace_must_outlast_an_execution() -> None:
    url = SecretStr("postgresql://db/remediation")
    with pytest.raises(ValidationError, match="must exceed executor_timeout_seconds"):
        Settings(database_url=url, executor_timeout_seconds=120, insecure_no_auth=True)
    Settings(database_url=url, executor_timeout_seconds=120, takeover_grace_seconds=180)
    # One SQLite process takes nothing over: no constraint there.
    Settings(executor_timeout_seconds=120)
