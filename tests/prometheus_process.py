"""A real Prometheus for the tests: one process on a free loopback port over a config file.

Tests that scrape something for real (the simulated exporter, relabelled pods) start it with
:func:`prometheus_process` and query it over HTTP; the binary is Debian's ``prometheus``
(missing: the test skips, or fails under ``TRAINGUARD_REQUIRE_BINARIES=1``).
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx

from tests.deploy.stack import binary
from tests.ports import free_port

# Prometheus' start on a loaded 2-core machine, with room to spare.
READY_TIMEOUT = 90.0


@dataclass(frozen=True)
class PrometheusProcess:
    url: str
    log: Path
    process: subprocess.Popen[bytes]

    def log_tail(self, lines: int = 30) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])


def _ready(url: str) -> bool:
    try:
        return httpx.get(f"{url}/-/ready", timeout=2).status_code == 200
    except httpx.TransportError:
        return False


def backfill(source: Path, data: Path) -> None:
    """Turn the OpenMetrics history in ``source`` into TSDB blocks under ``data`` (``promtool
    tsdb create-blocks-from openmetrics``), for a Prometheus started on ``data``."""
    made = subprocess.run(
        [
            binary("promtool", "Debian: prometheus"),
            "tsdb",
            "create-blocks-from",
            "openmetrics",
            "-q",
            str(source),
            str(data),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert made.returncode == 0, made.stderr


@contextmanager
def prometheus_process(config: Path, workdir: Path, *flags: str) -> Iterator[PrometheusProcess]:
    """Prometheus over ``config``, its data and log in ``workdir``; ready when yielded."""
    url = f"http://127.0.0.1:{free_port()}"
    log = workdir / "prometheus.log"
    with log.open("wb") as out:
        process = subprocess.Popen(
            [
                binary("prometheus", "Debian: prometheus"),
                f"--config.file={config}",
                f"--storage.tsdb.path={workdir / 'prometheus-data'}",
                f"--web.listen-address={url.removeprefix('http://')}",
                *flags,
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
    running = PrometheusProcess(url, log, process)
    try:
        deadline = time.monotonic() + READY_TIMEOUT
        while not _ready(url):
            if process.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"Prometheus did not get ready:\n{running.log_tail()}")
            time.sleep(0.25)
        yield running
    finally:
        process.terminate()
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
