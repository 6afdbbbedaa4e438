"""``/v1/discovery/<kind>``: authentication, validation, expiry, bounds and replicas."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from fastapi.testclient import TestClient

from tests.discovery.conftest import Clock, both_backends
from tests.remediation.conftest import AUTH, rows
from trainguard import contract
from trainguard.remediation.app import create_app
from trainguard.remediation.settings import Settings

RANKS = f"{contract.DISCOVERY_PATH}/{contract.DiscoveryKind.RANKS.value}"
EXPORTERS = f"{contract.DISCOVERY_PATH}/{contract.DiscoveryKind.EXPORTERS.value}"


def rank(
    target: str = "node-1:9400", job_id: str = "job-a", rank: int = 0, **extra: Any
) -> dict[str, Any]:
    labels = {
        contract.LABEL_JOB_ID: job_id,
        contract.LABEL_RANK: str(rank),
        contract.LABEL_LOCAL_RANK: str(rank),
        contract.LABEL_NODE: "node-1",
    }
    return {"target": target, "labels": labels, "ttl_seconds": 30, **extra}


@contextmanager
def serve(settings: Settings) -> Iterator[TestClient]:
    with TestClient(create_app(settings)) as client:
        yield client


def listed(client: TestClient, path: str = RANKS) -> dict[str, dict[str, str]]:
    """The target list as Prometheus reads it: ``{target: labels}``."""
    response = client.get(path, headers=AUTH)
    assert response.status_code == 200, response.text
    assert response.headers["content-type"] == "application/json"
    groups = response.json()
    assert isinstance(groups, list)
    found = {}
    for group in groups:
        assert set(group) == {"targets", "labels"}
        (target,) = group["targets"]
        found[target] = group["labels"]
    return found


def test_every_method_needs_the_bearer_token(settings: Settings, clock: Clock) -> None:
    with serve(settings) as client:
        assert client.post(RANKS, json=rank(), headers=AUTH).status_code == 200
        wrong = {"Authorization": "Bearer not-the-token"}
        for headers in ({}, wrong):
            assert client.get(RANKS, headers=headers).status_code == 401
            assert client.post(RANKS, json=rank("node-2:9400"), headers=headers).status_code == 401
            response = client.delete(RANKS, params={"target": "node-1:9400"}, headers=headers)
            assert response.status_code == 401
        assert list(listed(client)) == ["node-1:9400"]


@both_backends
def test_registered_targets_are_served_in_the_http_sd_format(
    settings: Settings, clock: Clock
) -> None:
    with serve(settings) as client:
        response = client.post(RANKS, json=rank(), headers=AUTH)
        assert response.status_code == 200, response.text
        assert response.json()["target"] == "node-1:9400"
        client.post(RANKS, json=rank("[fd00::7]:9401", rank=1), headers=AUTH)
        exporter = {"target": "node-1:9835", "labels": {contract.LABEL_NODE: "node-1"}}
        assert client.post(EXPORTERS, json=exporter, headers=AUTH).status_code == 200
        ranks = listed(client)
        assert ranks == {
            "node-1:9400": rank()["labels"],
            "[fd00::7]:9401": rank(rank=1)["labels"],
        }
        assert listed(client, EXPORTERS) == {"node-1:9835": {contract.LABEL_NODE: "node-1"}}
        # A renewal is the same registration again: one target, the latest labels.
        client.post(RANKS, json=rank(job_id="job-b"), headers=AUTH)
        assert listed(client)["node-1:9400"][contract.LABEL_JOB_ID] == "job-b"
        assert len(listed(client)) == 2


@pytest.mark.parametrize(
    ("change", "field", "says"),
    [
        ({"target": "node-1"}, "target", "not host:port"),
        ({"target": "node-1:0"}, "target", "not host:port"),
        ({"target": "node-1:70000"}, "target", "not host:port"),
        ({"target": "http://node-1:9400"}, "target", "not host:port"),
        ({"target": "node 1:9400"}, "target", "not host:port"),
        ({"target": "[fd00::zz]:9400"}, "target", "fd00::zz"),
        ({"labels": {"__address__": "evil:80"}}, "labels", "Prometheus' own"),
        ({"labels": {"__scheme__": "https"}}, "labels", "Prometheus' own"),
        ({"labels": {"job": "x"}}, "labels", "Prometheus' own"),
        ({"labels": {"instance": "x"}}, "labels", "Prometheus' own"),
        ({"labels": {"1rank": "x"}}, "labels", "not a Prometheus label name"),
        ({"labels": {"node-name": "x"}}, "labels", "not a Prometheus label name"),
        ({"labels": {"node": "x" * 257}}, "labels", "at most 256 characters"),
        ({"labels": {"node": "a\nb"}}, "labels", "control characters"),
        ({"labels": {f"l{i}": "v" for i in range(33)}}, "labels", "at most 32 items"),
        ({"ttl_seconds": 0.5}, "ttl_seconds", "greater than or equal to 1"),
        ({"ttl_seconds": "nan"}, "ttl_seconds", "finite number"),
        ({"extra": 1}, "extra", "Extra inputs are not permitted"),
    ],
)
def test_bad_registrations_are_refused_with_the_reason(
    settings: Settings, clock: Clock, change: dict[str, Any], field: str, says: str
) -> None:
    with serve(settings) as client:
        response = client.post(RANKS, json={**rank(), **change}, headers=AUTH)
        assert response.status_code == 422, response.text
        (error,) = response.json()["detail"]
        assert error["loc"][:2] == ["body", field]
        assert says in error["msg"]
        assert listed(client) == {}


def test_what_depends_on_the_kind_or_the_settings_is_refused_with_the_reason(
    settings: Settings, clock: Clock
) -> None:
    with serve(settings.model_copy(update={"discovery_max_ttl_seconds": 120.0})) as client:
        response = client.post(RANKS, json=rank(ttl_seconds=121), headers=AUTH)
        assert response.status_code == 422
        assert "discovery_max_ttl_seconds (120)" in response.json()["detail"]
        anonymous = {"target": "node-1:9400", "labels": {contract.LABEL_RANK: "0"}}
        response = client.post(RANKS, json=anonymous, headers=AUTH)
        assert response.status_code == 422
        assert "'job_id'" in response.json()["detail"]
        # An exporter names no job.
        assert client.post(EXPORTERS, json=anonymous, headers=AUTH).status_code == 200
        assert (
            client.post(f"{contract.DISCOVERY_PATH}/gpus", json=anonymous, headers=AUTH).status_code
            == 422
        )
        assert listed(client) == {}


@both_backends
def test_a_registration_expires_unless_renewed_and_expired_rows_are_purged(
    settings: Settings, clock: Clock
) -> None:
    with serve(settings) as client:
        client.post(RANKS, json=rank("node-1:9400", ttl_seconds=10), headers=AUTH)
        client.post(RANKS, json=rank("node-2:9400", rank=1, ttl_seconds=10), headers=AUTH)
        clock.advance(8)
        client.post(RANKS, json=rank("node-2:9400", rank=1, ttl_seconds=10), headers=AUTH)
        clock.advance(3)  # node-1 renewed 11 s ago, node-2 3 s ago
        assert list(listed(client)) == ["node-2:9400"]
        metrics = client.get("/metrics").text
        assert f'{contract.REMEDIATION_DISCOVERY_TARGETS.name}{{kind="ranks"}} 1.0' in metrics
        # Served or not, the expired row is gone at the next registration.
        assert len(rows(settings, "SELECT target FROM discovery_targets")) == 2
        client.post(EXPORTERS, json={"target": "node-1:9835"}, headers=AUTH)
        stored = rows(settings, "SELECT kind, target FROM discovery_targets ORDER BY kind")
        assert stored == [("exporters", "node-1:9835"), ("ranks", "node-2:9400")]
        clock.advance(10)
        assert listed(client) == {}


def test_deregistration_withdraws_a_target_at_once(settings: Settings, clock: Clock) -> None:
    with serve(settings) as client:
        client.post(RANKS, json=rank("node-1:9400"), headers=AUTH)
        client.post(RANKS, json=rank("node-1:9401", rank=1), headers=AUTH)
        response = client.delete(RANKS, params={"target": "node-1:9400"}, headers=AUTH)
        assert response.status_code == 204
        assert list(listed(client)) == ["node-1:9401"]
        # Again, or a target never registered, or one of the other kind: nothing to withdraw.
        for path, target in ((RANKS, "node-1:9400"), (EXPORTERS, "node-1:9401")):
            response = client.delete(path, params={"target": target}, headers=AUTH)
            assert response.status_code == 204
        assert list(listed(client)) == ["node-1:9401"]


def test_a_client_cannot_register_more_than_the_bounds(settings: Settings, clock: Clock) -> None:
    bounded = settings.model_copy(
        update={"discovery_max_targets": 3, "discovery_max_targets_per_job": 2}
    )
    with serve(bounded) as client:
        for port in (9400, 9401):
            assert client.post(RANKS, json=rank(f"n:{port}"), headers=AUTH).status_code == 200
        response = client.post(RANKS, json=rank("n:9402"), headers=AUTH)
        assert response.status_code == 429
        assert "job job-a has 2 ranks" in response.json()["detail"]
        # Renewing a registered target is never refused.
        assert client.post(RANKS, json=rank("n:9401"), headers=AUTH).status_code == 200
        assert (
            client.post(RANKS, json=rank("n:9402", job_id="job-b"), headers=AUTH).status_code == 200
        )
        response = client.post(RANKS, json=rank("n:9403", job_id="job-c"), headers=AUTH)
        assert response.status_code == 429
        assert "3 ranks targets are registered" in response.json()["detail"]
        # The bound is per kind; and an expired target makes room.
        assert client.post(EXPORTERS, json={"target": "n:9835"}, headers=AUTH).status_code == 200
        clock.advance(31)
        response = client.post(RANKS, json=rank("n:9403", job_id="job-c"), headers=AUTH)
        assert response.status_code == 200
        assert list(listed(client)) == ["n:9403"]


@both_backends
def test_two_replicas_on_one_database_serve_the_same_targets(
    settings: Settings, clock: Clock
) -> None:
    with serve(settings) as first, serve(settings) as second:
        first.post(RANKS, json=rank("node-1:9400"), headers=AUTH)
        second.post(RANKS, json=rank("node-2:9400", rank=1), headers=AUTH)
        assert listed(first) == listed(second)
        assert sorted(listed(first)) == ["node-1:9400", "node-2:9400"]
        second.delete(RANKS, params={"target": "node-1:9400"}, headers=AUTH)
        assert list(listed(first)) == ["node-2:9400"]
        clock.advance(31)
        assert listed(first) == listed(second) == {}


def test_the_routes_are_in_the_openapi_document(settings: Settings, clock: Clock) -> None:
    with serve(settings) as client:
        paths = client.get("/openapi.json").json()["paths"]
        operations = paths[f"{contract.DISCOVERY_PATH}/{{kind}}"]
        assert set(operations) == {"get", "post", "delete"}
        schema = json.dumps(operations["get"]["responses"]["200"])
        assert "TargetGroup" in schema
