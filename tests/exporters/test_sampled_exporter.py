"""The exporter process samples before it listens, serves only /metrics, checks its timing flags."""

from __future__ import annotations

import argparse
import time
import urllib.error
import urllib.request

import pytest

from tests.exporters.conftest import one, values
from tests.exporters.test_exporter_process import exporter
from trainguard import contract
from trainguard.exporters.app import sample_timing


def _status(url: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as error:
        return error.code, error.read()


def test_the_first_scrape_serves_a_sample_taken_before_the_server_listened() -> None:
    # One sample an hour: every scrape of this test serves the one taken at start-up.
    with exporter("--simulate-gpus", "2", "--sample.interval", "3600") as running:
        listening_seen = time.time()  # the exporter printed its address before this
        first = running.scrape()
        assert one(first, contract.EXPORTER_LAST_SAMPLE_TIMESTAMP.name) < listening_seen
        assert len(values(first, contract.GPU_TEMPERATURE.name)) == 2
        for collector in ("gpu", "gpu_process", "nccl", "nccl_config"):
            assert one(first, contract.EXPORTER_COLLECTOR_SUCCESS.name, collector=collector)
            assert one(first, contract.EXPORTER_COLLECTOR_TIMEOUTS.name, collector=collector) == 0
        base = running.url.removesuffix("/metrics")
        status, body = _status(base + "/metrics")
        assert status == 200
        assert one(running.scrape(), contract.EXPORTER_LAST_SAMPLE_TIMESTAMP.name) == one(
            first, contract.EXPORTER_LAST_SAMPLE_TIMESTAMP.name
        )
        status, body = _status(base + "/")
        assert status == 200 and b"/metrics" in body and b"trainguard_gpu" not in body
        status, body = _status(base + "/nonexistent")
        assert status == 404 and b"trainguard_gpu" not in body


@pytest.mark.parametrize(
    ("flags", "env", "expected"),
    [
        ((None, None), {}, (5.0, 3.0)),
        (("1", None), {}, (1.0, 1.0)),  # the timeout never exceeds the interval by default
        ((None, None), {contract.ENV_EXPORTER_SAMPLE_INTERVAL: "30"}, (30.0, 3.0)),
        (("10", "7.5"), {contract.ENV_EXPORTER_SAMPLE_INTERVAL: "30"}, (10.0, 7.5)),
        ((None, None), {contract.ENV_EXPORTER_SAMPLE_TIMEOUT: "4"}, (5.0, 4.0)),
    ],
)
def test_sample_timing_flag_beats_env_beats_default(
    monkeypatch: pytest.MonkeyPatch,
    flags: tuple[str | None, str | None],
    env: dict[str, str],
    expected: tuple[float, float],
) -> None:
    monkeypatch.delenv(contract.ENV_EXPORTER_SAMPLE_INTERVAL, raising=False)
    monkeypatch.delenv(contract.ENV_EXPORTER_SAMPLE_TIMEOUT, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    args = argparse.Namespace(sample_interval=flags[0], sample_timeout=flags[1])
    assert sample_timing(args) == expected
