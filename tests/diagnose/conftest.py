"""A real Prometheus holding the synthetic history, and a real hang's Flight Recorder dumps.

The history (``synthetic.history``) is backfilled with ``promtool tsdb create-blocks-from
openmetrics`` and served by ``prometheus`` on a loopback port, with trainguard's rules file
loaded. Both are started once per session; without the binaries these tests skip (fail under
``TRAINGUARD_REQUIRE_BINARIES=1``).
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from tests.alerts.tools import RULES_FILE, binary
from tests.diagnose import hang_run, synthetic
from tests.instrumentation.harness import run_ranks
from tests.ports import free_port
from tests.prometheus_process import backfill


@dataclass(frozen=True)
class History:
    url: str
    now: float  # end of the window the tests diagnose


@pytest.fixture(scope="session")
def history(tmp_path_factory: pytest.TempPathFactory) -> Iterator[History]:
    prometheus = binary("prometheus")
    root = tmp_path_factory.mktemp("prometheus")
    now = time.time()
    source = root / "history.om"
    source.write_text(synthetic.history(now - 3600))
    data = root / "data"
    backfill(source, data)
    source.unlink()  # about 85 MB of text, no longer needed
    config = root / "prometheus.yml"
    config.write_text(f"global:\n  evaluation_interval: 15s\nrule_files:\n  - {RULES_FILE}\n")
    port = free_port()
    log = (root / "prometheus.log").open("w")
    process = subprocess.Popen(
        [
            prometheus,
            f"--config.file={config}",
            f"--storage.tsdb.path={data}",
            f"--web.listen-address=127.0.0.1:{port}",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                if httpx.get(f"{url}/-/ready", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert process.poll() is None, (root / "prometheus.log").read_text()
            assert time.monotonic() < deadline, "prometheus did not become ready"
            time.sleep(0.1)
        yield History(url, now)
    finally:
        process.terminate()
        process.wait(10)
        log.close()


@dataclass(frozen=True)
class HangRun:
    dumps: Path
    logs: Path


@pytest.fixture(scope="session")
def hang(tmp_path_factory: pytest.TempPathFactory) -> HangRun:
    """Three real gloo ranks with the hook; rank 2 sleeps 5 s inside a step."""
    out = tmp_path_factory.mktemp("hang")
    run_ranks(hang_run.hang_with_logs, 3, out, sleep_s=5.0)
    return HangRun(out / "dumps", out / "logs")
