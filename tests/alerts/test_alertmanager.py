"""alerts/alertmanager.yml: valid, routes every alert where it belongs, secrets from files."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from tests.alerts.tools import ALERTS, binary, run
from trainguard.contract import Alert, Severity

CONFIG = ALERTS / "alertmanager.yml"


def config() -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load(CONFIG.read_text())
    return data


def routes_for(*labels: str) -> set[str]:
    """Receivers Alertmanager picks for an alert with these labels (``amtool`` itself)."""
    result = run(binary("amtool"), "config", "routes", "test", f"--config.file={CONFIG}", *labels)
    assert result.returncode == 0, result.stdout + result.stderr
    return set(result.stdout.strip().split(","))


def test_amtool_check_config() -> None:
    result = run(binary("amtool"), "check-config", CONFIG)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


@pytest.mark.parametrize("alert", list(Alert))
def test_every_alert_reaches_remediation_and_a_human(alert: Alert) -> None:
    critical = routes_for(f"alertname={alert.value}", "severity=critical", "job_id=j")
    assert critical == {"remediation", "pager"}
    warning = routes_for(f"alertname={alert.value}", "severity=warning", "job_id=j")
    assert warning == {"remediation", "chat"}


def test_foreign_alerts_skip_remediation() -> None:
    assert routes_for("alertname=NodeDiskFull", "severity=critical") == {"pager"}
    assert routes_for("alertname=NodeDiskFull", "severity=warning") == {"chat"}


def test_grouping_is_per_alert_and_job() -> None:
    assert config()["route"]["group_by"] == ["alertname", "job_id"]


def test_webhook_matches_the_remediation_service() -> None:
    from pydantic import SecretStr

    from trainguard.remediation.app import create_app
    from trainguard.remediation.settings import Settings

    (receiver,) = [r for r in config()["receivers"] if r["name"] == "remediation"]
    (hook,) = receiver["webhook_configs"]
    url = hook["url"]
    assert url == f"http://remediation:{Settings.model_fields['port'].default}/v1/alertmanager"
    paths = create_app(Settings(token=SecretStr("t"))).openapi()["paths"]
    assert "post" in paths["/v1/alertmanager"]
    auth = hook["http_config"]["authorization"]
    assert auth["type"] == "Bearer"
    assert auth["credentials_file"].startswith("/etc/alertmanager/secrets/")


def test_secrets_come_from_files() -> None:
    for receiver in config()["receivers"]:
        for pagerduty in receiver.get("pagerduty_configs", []):
            assert "routing_key_file" in pagerduty and "routing_key" not in pagerduty
        for slack in receiver.get("slack_configs", []):
            assert "api_url_file" in slack and "api_url" not in slack
        for hook in receiver.get("webhook_configs", []):
            assert "credentials" not in hook["http_config"]["authorization"]
    pager = next(r for r in config()["receivers"] if r["name"] == "pager")
    assert pager["pagerduty_configs"] and pager["slack_configs"]


def test_inhibitions() -> None:
    rules = config()["inhibit_rules"]

    def inhibits(source: str, target: str, equal: str) -> bool:
        for rule in rules:
            src = " ".join(rule["source_matchers"])
            dst = " ".join(rule["target_matchers"])
            if source in src and target in dst and equal in rule["equal"]:
                return True
        return False

    for target in (Alert.TRAINING_STRAGGLER, Alert.TRAINING_STALLED):
        assert inhibits(Alert.TRAINING_RANK_DOWN.value, target.value, "job_id")
    assert inhibits(Alert.TRAINING_RANK_DOWN.value, "TrainingCollectiveStalled", "job_id")
    for target in (Alert.GPU_XID_ERROR, Alert.GPU_THERMAL_THROTTLING):
        assert inhibits(Alert.GPU_NVML_DOWN.value, target.value, "node")
    assert inhibits(Severity.CRITICAL.value, Severity.WARNING.value, "alertname")
