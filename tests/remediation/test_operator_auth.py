"""Operator endpoints (approve, reject, breaker reset) take the operator token, never the
webhook token Alertmanager and the ranks hold."""

from __future__ import annotations

from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from pydantic import SecretStr

from tests.remediation.conftest import (
    AUTH,
    OPERATOR_AUTH,
    OPERATOR_TOKEN,
    TOKEN,
    alert,
    notify,
    payload,
    serve,
)
from trainguard.remediation.app import create_app
from trainguard.remediation.settings import ConfigurationError, Settings


def _waiting_action(client: TestClient) -> int:
    body = payload(alert("TrainingRankDown", job_id="j1"))
    notify(client, body)
    (action,) = client.get("/v1/actions", headers=AUTH).json()["actions"]
    assert action["state"] == "awaiting_approval"
    return int(action["id"])


def test_the_webhook_token_cannot_approve_reject_or_reset(settings: Settings) -> None:
    with serve(settings.model_copy(update={"dry_run": False})) as client:
        action_id = _waiting_action(client)
        for path in (
            f"/v1/actions/{action_id}/approve",
            f"/v1/actions/{action_id}/reject",
            "/v1/breakers/j1/reset",
        ):
            response = client.post(path, headers=AUTH)
            assert response.status_code == 403, path
            assert response.json()["detail"] == (
                "the webhook token cannot approve, reject or reset circuit breakers; "
                "present the operator token"
            )
        view = client.get(f"/v1/actions/{action_id}", headers=AUTH).json()
        assert view["state"] == "awaiting_approval"
        for headers in ({}, {"Authorization": "Bearer wrong"}):
            response = client.post(f"/v1/actions/{action_id}/approve", headers=headers)
            assert response.status_code == 401
            assert response.json()["detail"] == "missing or wrong operator token"
            assert response.headers["www-authenticate"] == "Bearer"


def test_the_operator_token_approves_and_reads_but_does_not_post_alerts(
    settings: Settings,
) -> None:
    with serve(settings.model_copy(update={"dry_run": False})) as client:
        action_id = _waiting_action(client)
        response = client.post(f"/v1/actions/{action_id}/reject", headers=OPERATOR_AUTH)
        assert response.status_code == 200 and response.json()["state"] == "rejected"
        assert client.get("/v1/actions", headers=OPERATOR_AUTH).status_code == 200
        assert client.get("/v1/breakers", headers=OPERATOR_AUTH).status_code == 200
        # 404, not 401: the operator may reset, there is just no open breaker.
        assert client.post("/v1/breakers/j1/reset", headers=OPERATOR_AUTH).status_code == 404
        webhook = client.post("/v1/alertmanager", json=payload(alert()), headers=OPERATOR_AUTH)
        assert webhook.status_code == 401
        directives = client.get(
            "/v1/directives", params={"job_id": "j1", "rank": 0, "wait": 0}, headers=OPERATOR_AUTH
        )
        assert directives.status_code == 401


def test_without_an_operator_token_operator_endpoints_are_closed(settings: Settings) -> None:
    closed = settings.model_copy(update={"dry_run": False, "operator_token": None})
    with serve(closed) as client:
        action_id = _waiting_action(client)
        response = client.post(f"/v1/actions/{action_id}/approve", headers=AUTH)
        assert response.status_code == 403
        detail = response.json()["detail"]
        assert detail.startswith("operator endpoints are disabled: no operator token is configured")
        assert "TRAINGUARD_REMEDIATION_OPERATOR_TOKEN or " in detail
        assert "TRAINGUARD_REMEDIATION_OPERATOR_TOKEN_FILE" in detail
        assert client.post("/v1/breakers/j1/reset", headers=AUTH).status_code == 403


def test_the_insecure_flag_opens_operator_endpoints(tmp_path: Path) -> None:
    insecure = Settings(db_path=tmp_path / "db", insecure_no_auth=True, dry_run=False)
    with serve(insecure) as client:
        action_id = _waiting_action(client)
        assert client.post(f"/v1/actions/{action_id}/approve").status_code == 200


def test_operator_token_from_a_file_named_in_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    token_file = tmp_path / "operator-token"
    token_file.write_text("from-a-file\n")
    monkeypatch.setenv("TRAINGUARD_REMEDIATION_OPERATOR_TOKEN_FILE", str(token_file))
    with serve(Settings(db_path=tmp_path / "db", token=SecretStr(TOKEN), dry_run=False)) as client:
        action_id = _waiting_action(client)
        headers = {"Authorization": "Bearer from-a-file"}
        assert client.post(f"/v1/actions/{action_id}/approve", headers=headers).status_code == 200


def test_operator_token_misconfigurations_refuse_to_start(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError, match="must differ from the webhook token"):
        create_app(
            Settings(
                db_path=tmp_path / "db", token=SecretStr(TOKEN), operator_token=SecretStr(TOKEN)
            )
        )
    with pytest.raises(ConfigurationError, match="cannot read operator_token_file"):
        create_app(
            Settings(
                db_path=tmp_path / "db",
                token=SecretStr(TOKEN),
                operator_token_file=tmp_path / "missing",
            )
        )
    with pytest.raises(ConfigurationError, match="either operator_token or operator_token_file"):
        create_app(
            Settings(
                db_path=tmp_path / "db",
                token=SecretStr(TOKEN),
                operator_token=SecretStr(OPERATOR_TOKEN),
                operator_token_file=tmp_path / "missing",
            )
        )
