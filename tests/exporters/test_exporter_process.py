"""The exporter started as a real process and scraped over HTTP on 127.0.0.1."""

from __future__ import annotations

import gzip
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.exporters.conftest import Samples, one, rank_env, values
from trainguard import contract
from trainguard.exporters.serving import PROMETHEUS_SCRAPE_ACCEPT

FIXTURES = Path(__file__).parent / "fixtures"


def nvml_loadable() -> bool:
    import pynvml

    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return False
    pynvml.nvmlShutdown()
    return True


class Exporter:
    def __init__(self, proc: subprocess.Popen[str], url: str) -> None:
        self.proc = proc
        self.url = url

    def scrape(self) -> Samples:
        with urllib.request.urlopen(self.url, timeout=10) as response:
            text = response.read().decode()
        out: Samples = {}
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                out[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
        return out


@contextmanager
def exporter(*args: str, env: dict[str, str] | None = None) -> Iterator[Exporter]:
    command = [sys.executable, "-m", "trainguard.exporters.app"]
    command += ["--web.listen-address", "127.0.0.1:0", *args]
    proc = subprocess.Popen(
        command,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, **(env or {})},
    )
    try:
        assert proc.stderr is not None
        url = None
        deadline = time.monotonic() + 30
        while url is None and time.monotonic() < deadline:
            line = proc.stderr.readline()
            if not line:
                break
            match = re.search(r"listening on (http://\S+/metrics)", line)
            url = match.group(1) if match else None
        assert url is not None, f"exporter did not start (exit {proc.poll()})"
        # Keep reading its log so a chatty exporter never blocks on a full pipe.
        threading.Thread(target=proc.stderr.read, daemon=True).start()
        yield Exporter(proc, url)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=10)


@pytest.fixture
def training_rank() -> Iterator[subprocess.Popen[bytes]]:
    env = {**os.environ, **rank_env(5, 1, TRAINGUARD_JOB_ID="proc-test")}
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"], env=env)
    yield child
    child.kill()
    child.wait()


def test_simulated_exporter_serves_every_collector(
    tmp_path: Path, training_rank: subprocess.Popen[bytes]
) -> None:
    shutil.copy(FIXTURES / "nccl-2.18.5-ib.log", tmp_path / "rank0.log")
    args = ["--simulate-gpus", "2", "--nccl.log-glob", str(tmp_path / "*.log"), "--dcgm-compat"]
    with exporter(*args) as running:
        samples = running.scrape()
        assert one(samples, "trainguard_exporter_info", provider="simulated") == 1.0
        assert not values(samples, contract.NVML_UP.name)  # no NVML is read: no claim about it
        assert len(values(samples, contract.GPU_TEMPERATURE.name, name="Simulated GPU")) == 2
        assert len(values(samples, "DCGM_FI_DEV_GPU_UTIL", modelName="Simulated GPU")) == 2
        mapping = values(samples, "trainguard_gpu_process_info", job_id="proc-test")
        assert [dict(k)["gpu"] + "/" + dict(k)["rank"] for k in mapping] == ["1/5"]
        for collector in ("gpu", "gpu_process", "nccl", "nccl_config"):
            assert one(samples, contract.EXPORTER_COLLECTOR_SUCCESS.name, collector=collector)
        assert values(samples, "process_resident_memory_bytes")
        deadline = time.monotonic() + 20  # the follower thread reads within its 1 s period
        while not values(samples, "trainguard_nccl_info") and time.monotonic() < deadline:
            time.sleep(0.2)
            samples = running.scrape()
        assert one(samples, "trainguard_nccl_info", transport="NET/IB,P2P") == 1.0
        running.proc.send_signal(signal.SIGTERM)
        assert running.proc.wait(timeout=15) == 0


def test_a_prometheus_scrape_gets_the_text_format_gzipped() -> None:
    with exporter("--simulate-gpus", "1") as running:
        request = urllib.request.Request(
            running.url,
            headers={"Accept": PROMETHEUS_SCRAPE_ACCEPT, "Accept-Encoding": "gzip"},
        )
        with urllib.request.urlopen(request, timeout=10) as response:
            content_type = response.headers["Content-Type"]
            encoding = response.headers["Content-Encoding"]
            body = gzip.decompress(response.read()).decode()
    assert content_type == "text/plain; version=0.0.4; charset=utf-8"
    assert encoding == "gzip"
    assert "# EOF" not in body, "not OpenMetrics"
    names = {f.name for f in text_string_to_metric_families(body)}
    assert contract.GPU_TEMPERATURE.name in names


def test_an_ipv6_listen_address_is_served_and_shown_as_a_url() -> None:
    with exporter("--web.listen-address", "[::1]:0", "--simulate-gpus", "1") as running:
        assert running.url.startswith("http://[::1]:")
        assert len(values(running.scrape(), contract.GPU_UP.name)) == 1


def test_without_a_driver_the_exporter_keeps_serving(tmp_path: Path) -> None:
    available = nvml_loadable()
    with exporter("--nccl.log-glob", str(tmp_path / "*.log")) as running:
        samples = running.scrape()
        assert one(samples, "trainguard_exporter_info", provider="nvml") == 1.0
        assert one(samples, contract.NVML_UP.name) == float(available)
        gpu_ok = one(samples, contract.EXPORTER_COLLECTOR_SUCCESS.name, collector="gpu")
        assert gpu_ok == float(available)
        assert one(samples, contract.EXPORTER_COLLECTOR_SUCCESS.name, collector="nccl") == 1.0
        assert running.scrape()  # and again: a failing collector does not wedge the next scrape


def test_collectors_are_switched_by_flag_and_environment(tmp_path: Path) -> None:
    env = {contract.ENV_EXPORTER_COLLECTOR_PREFIX + "NCCL_CONFIG": "0"}
    args = ["--simulate-gpus", "1", "--no-collector.gpu_process"]
    with exporter(*args, "--nccl.log-glob", str(tmp_path / "x"), env=env) as running:
        collectors = {
            dict(k)["collector"]
            for k in values(running.scrape(), contract.EXPORTER_COLLECTOR_SUCCESS.name)
        }
        assert collectors == {"gpu", "nccl"}


@pytest.mark.parametrize(
    ("args", "env", "message"),
    [
        (["--web.listen-address", "nonsense"], {}, "expected [host]:port"),
        (["--simulate-gpus", "0"], {}, "needs N >= 1"),
        ([], {contract.ENV_EXPORTER_COLLECTOR_PREFIX + "GPU": "maybe"}, "expected 1 or 0"),
        (["--sample.interval", "0"], {}, "expected a positive number of seconds"),
        (["--sample.interval", "soon"], {}, "expected a positive number of seconds"),
        (["--sample.timeout", "-1"], {}, "expected a positive number of seconds"),
        (["--sample.interval", "2", "--sample.timeout", "3"], {}, "must not exceed"),
        ([], {contract.ENV_EXPORTER_SAMPLE_INTERVAL: "nan"}, contract.ENV_EXPORTER_SAMPLE_INTERVAL),
    ],
)
def test_bad_configuration_is_a_clear_error(
    args: list[str], env: dict[str, str], message: str
) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "trainguard.exporters.app", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, **env},
        check=False,
    )
    assert result.returncode == 2
    assert message in result.stderr
