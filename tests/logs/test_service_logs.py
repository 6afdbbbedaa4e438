"""The exporter and the remediation service, run as processes, log ECS JSON with their name."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx

from tests.ports import free_port
from trainguard import contract


def _records(path: Path, until: float, want: int = 1) -> list[dict[str, Any]]:
    while time.monotonic() < until:
        if path.exists():
            lines = path.read_text().splitlines()
            if len(lines) >= want:
                return [json.loads(line) for line in lines]
        time.sleep(0.1)
    raise AssertionError(f"no ECS records in {path}")


def _run(args: list[str], log_file: Path, **env: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", *args],
        env={**os.environ, contract.ENV_LOG_FILE: str(log_file), **env},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def test_the_exporter_logs_ecs_json(tmp_path: Path) -> None:
    log_file = tmp_path / "exporter.ndjson"
    args = ["trainguard.exporters.app", "--web.listen-address", "127.0.0.1:0"]
    proc = _run([*args, "--simulate-gpus", "1"], log_file)
    try:
        records = _records(log_file, time.monotonic() + 30)
    finally:
        proc.kill()
        proc.wait(timeout=10)
    warning = next(r for r in records if "simulating 1 GPUs" in r["message"])
    assert warning["log.level"] == "warning"
    assert warning["service"]["name"] == contract.SERVICE_EXPORTER
    assert warning["data_stream"]["dataset"] == "trainguard.exporter"


def test_the_remediation_service_logs_ecs_json(tmp_path: Path) -> None:
    log_file = tmp_path / "remediation.ndjson"
    port = free_port()
    args = ["trainguard.remediation.cli", "--port", str(port), "--insecure-no-auth"]
    proc = _run(args, log_file, TRAINGUARD_REMEDIATION_DB_PATH=str(tmp_path / "r.db"))
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                time.sleep(0.1)
        records = _records(log_file, time.monotonic() + 10)
    finally:
        proc.kill()
        proc.wait(timeout=10)
    assert records, "uvicorn's start-up lines come through the ECS handler"
    assert {r["service"]["name"] for r in records} == {contract.SERVICE_REMEDIATION}
    assert all(r["data_stream"]["dataset"] == "trainguard.remediation" for r in records)
    assert not any("GET /readyz" in r["message"] for r in records), "no access log lines"
