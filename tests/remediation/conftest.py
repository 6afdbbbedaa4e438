"""Fixtures: a service on a temporary database, payload builders, a recording executor.

``settings`` is a SQLite database; tests marked :data:`both_backends` run twice, the second time
on a database of their own in the session's Postgres cluster (:mod:`tests.remediation.postgres`).
"""

from __future__ import annotations

import logging
import socket
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn
from fastapi import FastAPI
from fastapi.testclient import TestClient
from pydantic import SecretStr
from sqlalchemy import create_engine, make_url, text
from sqlalchemy.pool import NullPool

from tests.remediation import postgres
from trainguard.contract import Action
from trainguard.remediation.app import create_app, default_executors
from trainguard.remediation.deps import Runtime
from trainguard.remediation.executors import ActionRecord, Executor
from trainguard.remediation.hub import DirectiveHub
from trainguard.remediation.settings import Settings
from trainguard.remediation.store import Store

TOKEN = "test-token-0123456789"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
OPERATOR_TOKEN = "operator-token-9876543210"
OPERATOR_AUTH = {"Authorization": f"Bearer {OPERATOR_TOKEN}"}


def alert(
    name: str = "TrainingCollectiveStalled",
    *,
    status: str = "firing",
    fingerprint: str = "fp1",
    starts_at: str = "2026-01-01T00:00:00Z",
    **labels: str,
) -> dict[str, Any]:
    return {
        "status": status,
        "labels": {"alertname": name, "severity": "warning", **labels},
        "annotations": {"summary": f"{name} fired"},
        "startsAt": starts_at,
        "endsAt": "0001-01-01T00:00:00Z" if status == "firing" else "2026-01-01T01:00:00Z",
        "generatorURL": "http://prometheus:9090/graph",
        "fingerprint": fingerprint,
    }


def payload(*alerts: dict[str, Any], status: str = "firing") -> dict[str, Any]:
    return {
        "version": "4",
        "groupKey": '{}:{alertname="x"}',
        "truncatedAlerts": 0,
        "status": status,
        "receiver": "trainguard",
        "groupLabels": {},
        "commonLabels": {},
        "commonAnnotations": {},
        "externalURL": "http://alertmanager:9093",
        "alerts": list(alerts),
    }


class RecordingExecutor:
    """Stands in for a scheduler: records what it was asked to do."""

    actions: frozenset[Action] = frozenset(
        {Action.RESTART_FROM_CHECKPOINT, Action.EXCLUDE_NODE, Action.DRAIN_NODE, Action.ANNOTATE}
    )

    def __init__(self, name: str = "local") -> None:
        self.name = name
        self.executed: list[tuple[int, Action, dict[str, Any]]] = []

    def prepare(self, action: ActionRecord) -> dict[str, Any]:
        return {"target": action.labels.get("job_id")}

    def execute(self, action: ActionRecord, snapshot: Mapping[str, Any]) -> dict[str, Any]:
        self.executed.append((action.id, action.action, dict(snapshot)))
        return {"done": action.action}


both_backends = pytest.mark.parametrize("settings", ["sqlite", "postgres"], indirect=True)


@pytest.fixture(autouse=True)
def _restore_root_logging() -> Iterator[None]:
    """Undo the process logging a test's run of the service command sets up: its ECS handlers
    add the process's identity to every record, which later tests' records must not carry."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    for handler in root.handlers[:]:
        if handler not in handlers:
            root.removeHandler(handler)
            handler.close()
    root.setLevel(level)


@pytest.fixture(scope="session")
def postgres_cluster() -> Iterator[postgres.Cluster]:
    with postgres.cluster() as cluster:
        yield cluster


@pytest.fixture
def settings(request: pytest.FixtureRequest, tmp_path: Path) -> Settings:
    base = Settings(
        token=SecretStr(TOKEN),
        operator_token=SecretStr(OPERATOR_TOKEN),
        db_path=tmp_path / "remediation.db",
        sweep_interval_seconds=0.05,
        sqlite_synchronous="NORMAL",
        long_poll_max_seconds=5.0,
    )
    if getattr(request, "param", "sqlite") == "postgres":
        cluster: postgres.Cluster = request.getfixturevalue("postgres_cluster")
        return base.model_copy(update={"database_url": SecretStr(cluster.new_database())})
    return base


def fresh_database(settings: Settings, name: str) -> Settings:
    """The same settings on another, empty database (of the same backend)."""
    if settings.database_url is None:
        return settings.model_copy(update={"db_path": settings.db_path.with_suffix(f".{name}")})
    server = settings.database_url.get_secret_value()
    url = postgres.create_database(server, f"{make_url(server).database}_{name}")
    return settings.model_copy(update={"database_url": SecretStr(url)})


def rows(settings: Settings, sql: str) -> list[tuple[Any, ...]]:
    """What ``sql`` returns from the service's database, read on a connection of its own."""
    database = settings.database()
    url = f"sqlite:///{database}" if isinstance(database, Path) else database
    engine = create_engine(url, poolclass=NullPool)
    try:
        with engine.connect() as conn:
            return [tuple(row) for row in conn.execute(text(sql))]
    finally:
        engine.dispose()


@pytest.fixture
def recorder() -> RecordingExecutor:
    return RecordingExecutor()


def executors_with(
    *replacements: Executor,
) -> Callable[[Settings, Store, DirectiveHub], Mapping[str, Executor]]:
    def build(settings: Settings, store: Store, hub: DirectiveHub) -> Mapping[str, Executor]:
        registry = dict(default_executors(settings, store, hub))
        registry.update({e.name: e for e in replacements})
        return registry

    return build


@contextmanager
def serve(settings: Settings, *executors: Executor) -> Iterator[TestClient]:
    app = create_app(settings, executors_with(*executors))
    with TestClient(app) as client:
        yield client


@contextmanager
def serve_http(app: FastAPI) -> Iterator[str]:
    """Run ``app`` on a real loopback socket; yields its base URL."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        assert time.monotonic() < deadline, "server did not start"
        time.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(10)
        sock.close()


# How long a test waits for the inbox to drain: far more than deciding takes, for loaded machines.
DRAIN_SECONDS = 30.0


def runtime_of(client: TestClient) -> Runtime:
    """What the app served by ``client`` runs on (its store, engine, decider, ...)."""
    app = client.app
    assert isinstance(app, FastAPI)
    runtime: Runtime = app.state.runtime
    return runtime


def drained(client: TestClient) -> None:
    """Every notification the service accepted so far is decided: the webhook answers once a
    notification is in the inbox, and its decider decides it after (no sleeping)."""
    assert runtime_of(client).decider.drain(DRAIN_SECONDS), "the inbox did not drain"


def decided(client: TestClient, response: httpx.Response) -> dict[str, Any]:
    """What the notification the webhook's ``response`` accepted was decided to."""
    assert response.status_code == 200, response.text
    drained(client)
    notification = response.json()["notification"]
    view = client.get(f"/v1/notifications/{notification}", headers=AUTH).json()
    assert view["decided_at"] is not None and view["error"] is None, view
    result: dict[str, Any] = view["result"]
    return result


def notify(client: TestClient, body: Mapping[str, Any]) -> dict[str, Any]:
    """Post a notification and wait for its decision; what it was decided to."""
    return decided(client, client.post("/v1/alertmanager", json=body, headers=AUTH))


def wait_for(predicate: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.02)
