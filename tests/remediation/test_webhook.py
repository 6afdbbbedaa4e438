"""The webhook: auth, size limit, validation, durable storage, dedupe and resolution."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.remediation.conftest import (
    AUTH,
    OPERATOR_AUTH,
    TOKEN,
    alert,
    both_backends,
    decided,
    drained,
    notify,
    payload,
    rows,
    serve,
    wait_for,
)
from trainguard import contract
from trainguard.remediation.app import create_app
from trainguard.remediation.settings import ConfigurationError, Settings


@both_backends
def test_commits_the_notification_before_answering_200(settings: Settings) -> None:
    sent = payload(alert(job_id="j1"))
    with serve(settings) as client:
        response = client.post("/v1/alertmanager", json=sent, headers=AUTH)
        assert response.status_code == 200, response.text
        accepted = response.json()
        assert accepted["alerts"] == 1
        # The answer came after the commit: another connection sees the entry at once.
        ((body, group_key, alerts),) = rows(
            settings,
            f"SELECT body, group_key, alerts FROM inbox WHERE id = {accepted['notification']}",
        )
        assert (group_key, alerts) == (sent["groupKey"], 1)
        assert body is None or json.loads(bytes(body)) == sent  # the body, until it is decided
        result = decided(client, response)
        assert result["stored"] == 1 and result["duplicates"] == 0
        assert rows(settings, "SELECT fingerprint, name, status FROM alerts") == [
            ("fp1", "TrainingCollectiveStalled", "firing")
        ]
        assert len(result["planned_actions"]) == 2  # dump_diagnostics, restart_from_checkpoint
        # Decided: the entry keeps what it came to, not the body (the alerts table has it).
        view = client.get(f"/v1/notifications/{accepted['notification']}", headers=AUTH).json()
        assert view["result"] == result and view["error"] is None
        assert rows(settings, "SELECT body IS NULL FROM inbox") == [(1,)]
        assert client.get("/v1/notifications/99", headers=AUTH).status_code == 404


@pytest.mark.parametrize(
    "headers",
    [{}, {"Authorization": "Bearer wrong"}, {"Authorization": f"Basic {TOKEN}"}],
    ids=["none", "wrong", "not-bearer"],
)
def test_401_without_the_token(settings: Settings, headers: dict[str, str]) -> None:
    with serve(settings) as client:
        response = client.post("/v1/alertmanager", json=payload(alert()), headers=headers)
        assert response.status_code == 401
        assert response.headers["www-authenticate"] == "Bearer"
        assert client.get("/v1/actions", headers=headers).status_code == 401
        assert client.get("/v1/notifications/1", headers=headers).status_code == 401
        assert rows(settings, "SELECT * FROM inbox") == []
        assert 'reason="unauthorized"' in client.get("/metrics").text


def test_the_bearer_scheme_is_case_insensitive(settings: Settings) -> None:
    with serve(settings) as client:
        headers = {"Authorization": f"bearer {TOKEN}"}
        response = client.post("/v1/alertmanager", json=payload(alert()), headers=headers)
        assert response.status_code == 200, response.text
        assert client.get("/v1/actions", headers=headers).status_code == 200


def test_413_over_the_body_limit(settings: Settings) -> None:
    settings = settings.model_copy(update={"max_body_bytes": 2000})
    big = payload(*[alert(fingerprint=f"f{i}", job_id="j") for i in range(20)])
    with serve(settings) as client:
        response = client.post("/v1/alertmanager", json=big, headers=AUTH)
        assert response.status_code == 413
        assert "2000 bytes" in response.json()["detail"]

        def chunks() -> Iterator[bytes]:  # no Content-Length: the limit still holds
            data = json.dumps(big).encode()
            for i in range(0, len(data), 500):
                yield data[i : i + 500]

        response = client.post(
            "/v1/alertmanager",
            content=chunks(),
            headers={**AUTH, "Content-Type": "application/json"},
        )
        assert response.status_code == 413
        small = json.dumps(payload(alert(job_id="j"))).encode()
        response = client.post(
            "/v1/alertmanager",
            content=iter([small[:100], small[100:]]),
            headers={**AUTH, "Content-Type": "application/json"},
        )
        assert response.status_code == 200, response.text
        assert 'reason="too_large"' in client.get("/metrics").text


@pytest.mark.parametrize(
    ("mutate", "where"),
    [
        (lambda p: p.update(version="3"), ["body", "version"]),
        (lambda p: p["alerts"][0].pop("fingerprint"), ["body", "alerts", 0, "fingerprint"]),
        (lambda p: p["alerts"][0]["labels"].pop("alertname"), ["body", "alerts", 0, "labels"]),
        (lambda p: p["alerts"][0].update(startsAt="yesterday"), ["body", "alerts", 0, "startsAt"]),
        (lambda p: p.update(alerts=[]), ["body", "alerts"]),
        (lambda p: p.update(truncatedAlerts=-1), ["body", "truncatedAlerts"]),
    ],
    ids=["version", "fingerprint", "alertname", "startsAt", "no-alerts", "truncated"],
)
def test_422_names_the_bad_field(settings: Settings, mutate, where) -> None:
    body = payload(alert(job_id="j"))
    mutate(body)
    with serve(settings) as client:
        response = client.post("/v1/alertmanager", json=body, headers=AUTH)
        assert response.status_code == 422
        assert [error["loc"] for error in response.json()["detail"]] == [where]
        assert rows(settings, "SELECT * FROM inbox") == []


@both_backends
def test_duplicate_delivery_is_stored_once(settings: Settings) -> None:
    body = payload(alert(job_id="j1"))
    with serve(settings) as client:
        first = notify(client, body)
        second = notify(client, body)
        assert (first["stored"], first["duplicates"]) == (1, 0)
        assert (second["stored"], second["duplicates"]) == (0, 1)
        assert second["planned_actions"] == []
        assert rows(settings, "SELECT notifications FROM alerts") == [(2,)]
        assert rows(settings, "SELECT COUNT(*) FROM actions") == [(2,)]
        # A new startsAt for the same fingerprint is a new alert.
        again = payload(alert(job_id="j1", starts_at="2026-01-02T00:00:00Z"))
        assert notify(client, again)["stored"] == 1
        metrics = client.get("/metrics").text
        assert f"{contract.REMEDIATION_ALERTS_DEDUPLICATED.name} 1.0" in metrics


@both_backends
def test_resolved_cancels_pending_actions(settings: Settings) -> None:
    settings = settings.model_copy(update={"dry_run": False})
    with serve(settings) as client:
        notify(client, payload(alert(job_id="j1")))
        actions = client.get("/v1/actions", headers=AUTH).json()["actions"]
        restart = next(a for a in actions if a["action"] == "restart_from_checkpoint")
        assert restart["state"] == "awaiting_approval"
        dump = next(a for a in actions if a["action"] == "dump_diagnostics")
        # The worker claims the queued directive on its own time: once it has, the restart
        # awaiting approval is the one action the resolution finds pending.
        wait_for(
            lambda: (
                client.get(f"/v1/actions/{dump['id']}", headers=AUTH).json()["state"] != "queued"
            )
        )
        resolved = payload(alert(job_id="j1", status="resolved"), status="resolved")
        body = notify(client, resolved)
        assert body["resolved"] == 1 and body["cancelled_actions"] == 1
        view = client.get(f"/v1/actions/{restart['id']}", headers=AUTH).json()
        assert view["state"] == "cancelled"
        assert view["alert"]["status"] == "resolved"
        assert [t["state"] for t in view["transitions"]] == ["awaiting_approval", "cancelled"]
        approve = client.post(f"/v1/actions/{restart['id']}/approve", headers=OPERATOR_AUTH)
        assert approve.status_code == 409


@both_backends
def test_a_firing_notification_after_the_resolution_plans_nothing(settings: Settings) -> None:
    settings = settings.model_copy(update={"dry_run": False})
    resolved = payload(alert(job_id="j1", status="resolved"), status="resolved")
    with serve(settings) as client:
        notify(client, resolved)
        late = notify(client, payload(alert(job_id="j1")))
        assert (late["duplicates"], late["planned_actions"]) == (1, [])
        assert client.get("/v1/actions", headers=AUTH).json()["actions"] == []
        assert rows(settings, "SELECT status, notifications FROM alerts") == [("resolved", 2)]


@both_backends
def test_one_notification_of_many_alerts_is_stored_alert_by_alert(settings: Settings) -> None:
    # More alerts than one statement stores (the webhook stores them in chunks), each of its own
    # job: every action must be planned for its own alert.
    alerts = [alert("TrainingRankDown", fingerprint=f"f{i}", job_id=f"j{i}") for i in range(120)]
    with serve(settings) as client:
        body = notify(client, payload(*alerts))
        assert (body["stored"], body["duplicates"], len(body["planned_actions"])) == (120, 0, 120)
        found = rows(
            settings,
            "SELECT alerts.fingerprint, actions.subject, alerts.notifications FROM actions "
            "JOIN alerts ON alerts.id = actions.alert_id",
        )
        assert sorted(found) == sorted((f"f{i}", f"j{i}", 1) for i in range(120))
        assert sorted(body["planned_actions"]) == [
            row[0] for row in rows(settings, "SELECT id FROM actions ORDER BY id")
        ]


@both_backends
def test_an_alert_twice_in_one_notification_is_stored_once(settings: Settings) -> None:
    twice = alert("TrainingRankDown", fingerprint="a", job_id="j1")
    other = alert("TrainingRankDown", fingerprint="b", job_id="j2")
    with serve(settings) as client:
        body = notify(client, payload(twice, other, twice))
        assert (body["stored"], body["duplicates"], len(body["planned_actions"])) == (2, 1, 2)
        assert sorted(rows(settings, "SELECT fingerprint, notifications FROM alerts")) == [
            ("a", 2),
            ("b", 1),
        ]


@both_backends
def test_a_resolution_in_the_same_notification_cancels_what_it_planned(
    settings: Settings,
) -> None:
    settings = settings.model_copy(update={"dry_run": False})
    firing = alert("TrainingRankDown", fingerprint="a", job_id="j1")
    resolved = alert("TrainingRankDown", fingerprint="a", job_id="j1", status="resolved")
    with serve(settings) as client:
        body = notify(client, payload(firing, resolved))
        assert (body["resolved"], body["cancelled_actions"]) == (1, 1)
        (action_id,) = body["planned_actions"]
        view = client.get(f"/v1/actions/{action_id}", headers=AUTH).json()
        assert view["state"] == "cancelled"
        # The audit trail keeps the order: decided first, then cancelled.
        assert [t["state"] for t in view["transitions"]] == ["awaiting_approval", "cancelled"]


def test_refuses_to_start_without_a_token(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError, match="no bearer token"):
        create_app(Settings(db_path=tmp_path / "db"))
    with pytest.raises(ConfigurationError, match="cannot read token_file"):
        create_app(Settings(db_path=tmp_path / "db", token_file=tmp_path / "missing"))
    empty = tmp_path / "empty"
    empty.write_text("\n")
    with pytest.raises(ConfigurationError, match="empty"):
        create_app(Settings(db_path=tmp_path / "db", token_file=empty))


def test_token_file_and_insecure_flag(tmp_path: Path) -> None:
    token_file = tmp_path / "token"
    token_file.write_text("from-a-file\n")
    with serve(Settings(db_path=tmp_path / "a.db", token_file=token_file)) as client:
        good = {"Authorization": "Bearer from-a-file"}
        assert client.get("/v1/actions", headers=good).status_code == 200
        assert client.get("/v1/actions").status_code == 401
    with serve(Settings(db_path=tmp_path / "b.db", insecure_no_auth=True)) as client:
        assert client.get("/v1/actions").status_code == 200


def test_token_from_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRAINGUARD_REMEDIATION_TOKEN", "env-token")
    monkeypatch.setenv("TRAINGUARD_REMEDIATION_DB_PATH", str(tmp_path / "env.db"))
    with serve(Settings()) as client:
        assert (
            client.get("/v1/actions", headers={"Authorization": "Bearer env-token"}).status_code
            == 200
        )


def test_operations_endpoints(settings: Settings) -> None:
    with serve(settings) as client:
        assert client.get("/healthz").json() == {"status": "ok"}
        assert client.get("/readyz").json() == {"status": "ready"}
        client.post("/v1/alertmanager", json=payload(alert(job_id="j1")), headers=AUTH)
        drained(client)
        metrics = client.get("/metrics").text
        for spec in contract.REMEDIATION_METRICS:
            assert f"# TYPE {spec.name.removesuffix('_total')}" in metrics, spec.name
        assert f'{contract.REMEDIATION_ALERTS_RECEIVED.name}{{status="firing"}} 1.0' in metrics
        assert f'{contract.REMEDIATION_ACTIONS.name}{{state="dry_run"}} 2.0' in metrics
        assert f"{contract.REMEDIATION_DRY_RUN.name} 1.0" in metrics
        assert f"{contract.REMEDIATION_INBOX_DEPTH.name} 0.0" in metrics
        assert f"{contract.REMEDIATION_DECISION_LAG.name}_count 1.0" in metrics
        spec = client.get("/openapi.json").json()
        assert {"/v1/alertmanager", "/v1/actions", "/v1/directives", "/readyz"} <= set(
            spec["paths"]
        )
        assert "HTTPBearer" in spec["components"]["securitySchemes"]
        # The webhook checks the token in a dependency of its own; its document says so.
        assert spec["paths"]["/v1/alertmanager"]["post"]["security"] == [{"HTTPBearer": []}]
        assert "OperatorBearer" in spec["components"]["securitySchemes"]
