"""Fixtures of the discovery tests: the service's settings on SQLite or on the session's Postgres
cluster (:mod:`tests.remediation.postgres`), the service on a loopback socket, a fake clock for
the registrations' expiry; and reading a target list as Prometheus does."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from pydantic import SecretStr

from tests.remediation.conftest import AUTH, TOKEN, postgres_cluster, serve_http
from trainguard import contract
from trainguard.remediation import discovery
from trainguard.remediation.app import create_app
from trainguard.remediation.settings import Settings

__all__ = ["postgres_cluster"]

both_backends = pytest.mark.parametrize("settings", ["sqlite", "postgres"], indirect=True)


@pytest.fixture
def settings(request: pytest.FixtureRequest, tmp_path: Path) -> Settings:
    base = Settings(
        token=SecretStr(TOKEN), db_path=tmp_path / "remediation.db", sqlite_synchronous="NORMAL"
    )
    if getattr(request, "param", "sqlite") == "postgres":
        cluster = request.getfixturevalue("postgres_cluster")
        return base.model_copy(update={"database_url": SecretStr(cluster.new_database())})
    return base


class Clock:
    """Stands in for the ``time`` module of the service's discovery: time moves when told."""

    def __init__(self, now: float = 1_800_000_000.0) -> None:
        self.now = now

    def time(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    fake = Clock()
    monkeypatch.setattr(discovery, "time", fake)
    return fake


@pytest.fixture
def service(settings: Settings) -> Iterator[str]:
    """The service on a loopback socket; its base URL."""
    with serve_http(create_app(settings)) as url:
        yield url


def listed(url: str, kind: str = "ranks") -> dict[str, dict[str, str]]:
    """The service's target list of ``kind`` as Prometheus reads it: ``{target: labels}``."""
    response = httpx.get(f"{url}{contract.DISCOVERY_PATH}/{kind}", headers=AUTH, timeout=10)
    assert response.status_code == 200, response.text
    assert response.headers["content-type"] == "application/json"
    return {group["targets"][0]: group["labels"] for group in response.json()}
