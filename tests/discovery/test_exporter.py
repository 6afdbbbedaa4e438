"""The node exporter's registration: its flags, and the exporter process registering with a live
service at start-up and withdrawing on SIGTERM."""

from __future__ import annotations

import argparse
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from tests.discovery.conftest import listed
from tests.polling import wait_for
from tests.remediation.conftest import TOKEN
from trainguard import contract
from trainguard.exporters import discovery


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    discovery.configure(parser)
    return parser.parse_args(argv)


def test_no_url_no_registration(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(contract.ENV_DISCOVERY_URL, raising=False)
    assert discovery.settings(parse()) is None
    assert discovery.start(None, "0.0.0.0", 9835, "n") is None


def test_flags_and_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv(contract.ENV_DISCOVERY_URL, "http://remediation:9095")
    monkeypatch.setenv(contract.ENV_DISCOVERY_TTL, "45")
    monkeypatch.setenv(contract.ENV_REMEDIATION_TOKEN, "from-env")
    found = discovery.settings(parse())
    assert found == discovery.DiscoverySettings("http://remediation:9095", None, 45.0, "from-env")
    token = tmp_path / "token"
    token.write_text("from-file\n")
    args = ["--discovery.token-file", str(token), "--discovery.ttl-seconds", "20"]
    found = discovery.settings(parse(*args, "--discovery.address", "10.0.0.7:9835"))
    assert found == discovery.DiscoverySettings(
        "http://remediation:9095", "10.0.0.7:9835", 20.0, "from-file"
    )


@pytest.mark.parametrize(
    ("argv", "env", "says"),
    [
        (["--discovery.ttl-seconds", "0.5"], {}, "at least 1"),
        (["--discovery.ttl-seconds", "nan"], {}, "at least 1"),
        ([], {contract.ENV_DISCOVERY_TTL: "a minute"}, "expected seconds"),
        (["--discovery.token-file", "/nonexistent/token"], {}, "--discovery.token-file"),
    ],
)
def test_flags_that_cannot_work_are_refused(
    monkeypatch: pytest.MonkeyPatch, argv: list[str], env: dict[str, str], says: str
) -> None:
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(ValueError, match=re.escape(says)):
        discovery.settings(parse("--discovery.url", "http://remediation:9095", *argv))


def test_the_exporter_registers_its_node_and_withdraws_on_sigterm(
    service: str, tmp_path: Path
) -> None:
    token = tmp_path / "token"
    token.write_text(TOKEN)
    command = [
        sys.executable, "-m", "trainguard.exporters.app",
        "--web.listen-address", "127.0.0.1:0", "--simulate-gpus", "1", "--node", "node-x",
        "--log-format", "text",
        "--discovery.url", service, "--discovery.token-file", str(token),
    ]  # fmt: skip
    env = {k: v for k, v in os.environ.items() if k != contract.ENV_REMEDIATION_TOKEN}
    process = subprocess.Popen(command, stderr=subprocess.PIPE, text=True, env=env)
    try:
        assert process.stderr is not None
        port = None
        deadline = time.monotonic() + 60
        while port is None and time.monotonic() < deadline:
            line = process.stderr.readline()
            if not line:
                break
            match = re.search(r"listening on http://127\.0\.0\.1:(\d+)/metrics", line)
            port = match.group(1) if match else None
        assert port is not None, f"the exporter did not start (exit {process.poll()})"
        threading.Thread(target=process.stderr.read, daemon=True).start()
        target = f"127.0.0.1:{port}"
        wait_for("registered", lambda: target in listed(service, "exporters"))
        assert listed(service, "exporters") == {target: {contract.LABEL_NODE: "node-x"}}
        assert listed(service, "ranks") == {}
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=30) == 0
        assert listed(service, "exporters") == {}
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(timeout=10)


def test_the_exporter_stops_at_start_up_on_a_flag_that_cannot_work(tmp_path: Path) -> None:
    command = [
        sys.executable, "-m", "trainguard.exporters.app",
        "--web.listen-address", "127.0.0.1:0", "--simulate-gpus", "1", "--log-format", "text",
        "--discovery.url", "http://127.0.0.1:9", "--discovery.token-file", str(tmp_path / "none"),
    ]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 2
    assert "--discovery.token-file" in done.stderr
