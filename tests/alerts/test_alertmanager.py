"""alertmanager.yml: valid, routes every alert where it belongs, secrets from files, and the real
Alertmanager inhibits the alerts its rules say (its API, receivers kept offline)."""

from __future__ import annotations

import shutil
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from tests.alerts.tools import ALERTS, binary, run
from tests.ports import free_port
from trainguard import contract
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


@pytest.mark.parametrize("severity", list(Severity))
def test_the_services_own_page_reaches_humans_and_never_the_service(severity: Severity) -> None:
    """TrainguardRemediationFailed, with every label the service posts it with: the pager
    only (the service acting on its own page would loop)."""
    page = routes_for(
        f"alertname={contract.REMEDIATION_FAILED_ALERT}",
        f"{contract.LABEL_SEVERITY}={severity.value}",
        f"{contract.LABEL_JOB_ID}=j",
        f"{contract.LABEL_FAILURE}=hang",
        f"{contract.LABEL_INCIDENT}=7",
        f"{contract.LABEL_RUNG}=3",
        f"{contract.LABEL_NODE}=n1",
    )
    assert page == {"pager"}


def test_notifications_link_each_alert_s_source() -> None:
    """The text a human gets names the runbook and the alert's source: for the service's own
    page, its incident in the service (amtool renders with example alerts)."""
    result = run(
        binary("amtool"),
        "template",
        "render",
        f"--template.glob={CONFIG.parent / 'trainguard.tmpl'}",
        '--template.text={{ template "trainguard.text" . }}',
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Runbook: " in result.stdout
    assert "Source: https://generatorurl.com" in result.stdout


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


# --- the real Alertmanager, offline -------------------------------------------------------

SECRETS_DIR = "/etc/alertmanager/secrets/"


class _Accept(BaseHTTPRequestHandler):
    """Stands in for the remediation service, PagerDuty and Slack: takes every notification."""

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.send_response(200)
        self.end_headers()

    def log_message(self, format: str, *args: Any) -> None:
        """Notifications are not what these tests look at; keep pytest's output clean."""


@contextmanager
def notification_sink() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Accept)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()


def offline_config(tmp_path: Path, sink: str) -> Path:
    """alertmanager.yml with every receiver sending to ``sink`` and secrets in tmp_path.

    Routes, inhibitions and templates stay as committed; only where notifications go changes.
    """
    data = config()
    secrets = tmp_path / "secrets"
    secrets.mkdir()

    def secret(path: str, content: str) -> str:
        assert path.startswith(SECRETS_DIR), path
        local = secrets / path.removeprefix(SECRETS_DIR)
        local.write_text(content)
        return str(local)

    for receiver in data["receivers"]:
        for hook in receiver.get("webhook_configs", []):
            hook["url"] = sink
            auth = hook["http_config"]["authorization"]
            auth["credentials_file"] = secret(auth["credentials_file"], "test-token")
        for pagerduty in receiver.get("pagerduty_configs", []):
            pagerduty["url"] = sink
            pagerduty["routing_key_file"] = secret(pagerduty["routing_key_file"], "test-key")
        for slack in receiver.get("slack_configs", []):
            slack["api_url_file"] = secret(slack["api_url_file"], sink)
    data["templates"] = [str(CONFIG.parent / template) for template in data["templates"]]
    rendered = tmp_path / "alertmanager.yml"
    rendered.write_text(yaml.safe_dump(data, sort_keys=False))
    return rendered


def wait_until(check: Callable[[], bool], timeout: float = 10.0) -> bool:
    """Polls ``check`` until it holds (True) or ``timeout`` seconds pass (False)."""
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


@pytest.fixture
def alertmanager(tmp_path: Path) -> Iterator[httpx.Client]:
    """A running Alertmanager with the committed config; yields a client of its API."""
    # Upstream's binary is "alertmanager"; Debian's package renames it.
    name = "alertmanager" if shutil.which("alertmanager") else "prometheus-alertmanager"
    executable = binary(name)
    port = free_port()
    with notification_sink() as sink:
        proc = subprocess.Popen(
            [
                executable,
                f"--config.file={offline_config(tmp_path, sink)}",
                f"--storage.path={tmp_path / 'data'}",
                f"--web.listen-address=127.0.0.1:{port}",
                # No peers: an empty address turns the gossip cluster off.
                "--cluster.listen-address=",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=5) as client:

                def ready() -> bool:
                    if proc.poll() is not None:
                        assert proc.stderr is not None
                        pytest.fail(f"alertmanager exited {proc.returncode}: {proc.stderr.read()}")
                    try:
                        return client.get("/-/ready").status_code == 200
                    except httpx.TransportError:
                        return False

                assert wait_until(ready), "alertmanager did not start"
                yield client
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=5)


def _alert(alert: Alert, severity: Severity, **labels: str) -> dict[str, Any]:
    return {"labels": {"alertname": alert.value, contract.LABEL_SEVERITY: severity.value, **labels}}


def test_alertmanager_inhibits_symptoms_of_a_down_rank_and_of_a_blind_node(
    alertmanager: httpx.Client,
) -> None:
    job, rank, node = contract.LABEL_JOB_ID, contract.LABEL_RANK, contract.LABEL_NODE
    sent = {
        "rank down": _alert(Alert.TRAINING_RANK_DOWN, Severity.CRITICAL, **{job: "j1", rank: "2"}),
        "straggler, same job": _alert(
            Alert.TRAINING_STRAGGLER, Severity.WARNING, **{job: "j1", rank: "3"}
        ),
        "straggler, other job": _alert(
            Alert.TRAINING_STRAGGLER, Severity.WARNING, **{job: "j2", rank: "3"}
        ),
        "nvml down": _alert(Alert.GPU_NVML_DOWN, Severity.CRITICAL, **{node: "n1"}),
        "xid, same node": _alert(
            Alert.GPU_XID_ERROR, Severity.WARNING, **{node: "n1", contract.LABEL_GPU: "0"}
        ),
        "xid, other node": _alert(
            Alert.GPU_XID_ERROR, Severity.WARNING, **{node: "n2", contract.LABEL_GPU: "0"}
        ),
    }
    expected_inhibited = {"straggler, same job", "xid, same node"}
    response = alertmanager.post("/api/v2/alerts", json=list(sent.values()))
    assert response.status_code == 200, response.text

    def inhibited() -> dict[str, bool]:
        by_labels = {
            frozenset(a["labels"].items()): bool(a["status"]["inhibitedBy"])
            for a in alertmanager.get("/api/v2/alerts").json()
        }
        return {
            key: by_labels[labels]
            for key, alert in sent.items()
            if (labels := frozenset(alert["labels"].items())) in by_labels
        }

    expected = {key: key in expected_inhibited for key in sent}
    # Alertmanager takes alerts in asynchronously: wait until it lists every one of them and
    # its inhibitor has seen the sources.
    wait_until(lambda: inhibited() == expected)
    assert inhibited() == expected
