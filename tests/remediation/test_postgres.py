"""Postgres: replicas sharing one database, start-up errors, readiness when it goes away."""

from __future__ import annotations

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.pool import NullPool

from tests.ports import free_port
from tests.remediation.conftest import AUTH, RecordingExecutor, alert, payload, serve, wait_for
from tests.remediation.postgres import Cluster
from trainguard.remediation import cli
from trainguard.remediation.engine import Engine, Guards
from trainguard.remediation.metrics import Metrics
from trainguard.remediation.models import WebhookPayload
from trainguard.remediation.policy import load_policy
from trainguard.remediation.settings import Settings
from trainguard.remediation.store import Store
from trainguard.remediation.worker import Worker


def _replica(url: str) -> tuple[Store, Engine, Worker, RecordingExecutor]:
    store = Store(url)
    engine = Engine(load_policy(None), Guards(dry_run=False, require_approval=False))
    recorder = RecordingExecutor()
    worker = Worker(store, engine, {"local": recorder}, Metrics(store, False), sweep_interval=0.05)
    return store, engine, worker, recorder


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
    with serve(settings.model_copy(update={"database_url": url})) as client:
        assert client.get("/readyz").status_code == 200
        assert client.post("/v1/alertmanager", json=payload(alert()), headers=AUTH).is_success
        admin = create_engine(
            postgres_cluster.url("postgres").replace("postgresql:", "postgresql+psycopg:"),
            poolclass=NullPool,
            isolation_level="AUTOCOMMIT",
        )
        with admin.connect() as conn:
            database = url.rsplit("/", 1)[1]
            conn.execute(text(f'DROP DATABASE "{database}" WITH (FORCE)'))
        admin.dispose()
        response = client.get("/readyz")
        assert response.status_code == 503
        assert "store" in response.json()["status"]
