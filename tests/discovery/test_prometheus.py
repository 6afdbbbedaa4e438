"""A real Prometheus finds the ranks of running gloo jobs, and a node exporter, through the
remediation service's HTTP service discovery, with no file system shared with them.

The service runs as its command (``trainguard remediation``), Prometheus as the Debian binary on
the scrape jobs of ``deploy/prometheus-http-sd.yml`` (with a 2 s refresh and this service's
address and token file), and each job as two real processes training DDP on gloo with the hook
(``rank_job.py``), in a working directory of their own that Prometheus is never told of: no
``TRAINGUARD_FILE_SD_DIR``. Without the binary these tests skip (fail under
``TRAINGUARD_REQUIRE_BINARIES=1``).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

import httpx
import pytest
import yaml

from tests.alerts.tools import REPO, binary
from tests.polling import wait_for
from tests.ports import free_port
from tests.remediation.conftest import AUTH, TOKEN
from trainguard import contract

pytestmark = pytest.mark.e2e

CONFIG = REPO / "deploy" / "prometheus-http-sd.yml"
RANK_JOB = Path(__file__).with_name("rank_job.py")
REFRESH = "2s"
# Torch's import and the gloo rendezvous of two ranks on a loaded 2-core machine.
START_TIMEOUT = 180.0
# A few refreshes and scrapes of 2 s, with room for a loaded machine.
DROP_TIMEOUT = 60.0

T = TypeVar("T")


def prometheus_config(service: str, token_file: Path) -> dict[str, Any]:
    """The shipped http_sd scrape jobs, pointed at this service, refreshed every 2 s."""
    shipped = yaml.safe_load(CONFIG.read_text())
    jobs = []
    for job in shipped["scrape_configs"]:
        if "http_sd_configs" not in job:
            continue
        for sd in job["http_sd_configs"]:
            sd["url"] = sd["url"].replace("http://remediation:9095", service)
            sd["refresh_interval"] = REFRESH
            sd["authorization"]["credentials_file"] = str(token_file)
        jobs.append({**job, "scrape_interval": "2s"})
    return {"global": {"scrape_interval": "2s"}, "scrape_configs": jobs}


@dataclass
class Stack:
    """The remediation service and Prometheus, each a process of its own, on ``root``."""

    root: Path
    processes: list[subprocess.Popen[bytes]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.service = f"http://127.0.0.1:{free_port()}"
        self.prometheus = f"http://127.0.0.1:{free_port()}"
        self.token_file = self.root / "token"

    def start(self) -> None:
        prometheus = binary("prometheus")
        self.token_file.write_text(TOKEN)
        self.token_file.chmod(0o600)
        self._start(
            "service",
            [
                sys.executable, "-m", "trainguard", "remediation",
                "--port", self.service.rsplit(":", 1)[1],
                "--db", str(self.root / "remediation.db"),
                "--token-file", str(self.token_file),
                "--log-format", "text",
            ],
        )  # fmt: skip
        config = self.root / "prometheus.yml"
        config.write_text(yaml.safe_dump(prometheus_config(self.service, self.token_file)))
        self._start(
            "prometheus",
            [
                prometheus,
                f"--config.file={config}",
                f"--storage.tsdb.path={self.root / 'prometheus-data'}",
                f"--web.listen-address={self.prometheus.removeprefix('http://')}",
            ],
        )
        for url in (f"{self.service}/readyz", f"{self.prometheus}/-/ready"):
            wait_for(url, partial(self._answers, url), 60, self.root)

    def _start(self, name: str, command: list[str]) -> None:
        env = {**os.environ, "TRAINGUARD_REMEDIATION_SQLITE_SYNCHRONOUS": "NORMAL"}
        with (self.root / f"{name}.log").open("ab") as log:
            self.processes.append(
                subprocess.Popen(
                    command, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=self.root
                )
            )

    def _answers(self, url: str) -> bool:
        died = [p.args for p in self.processes if p.poll() is not None]
        assert not died, f"exited: {died}"
        try:
            return httpx.get(url, timeout=2).status_code == 200
        except httpx.TransportError:
            return False

    def stop(self) -> None:
        for process in self.processes:
            process.terminate()
        for process in self.processes:
            try:
                process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()

    def active_targets(self, pool: str) -> list[dict[str, Any]]:
        """Prometheus' active targets of scrape job ``pool``."""
        response = httpx.get(
            f"{self.prometheus}/api/v1/targets", params={"state": "active"}, timeout=10
        )
        assert response.status_code == 200, response.text
        targets = response.json()["data"]["activeTargets"]
        return [t for t in targets if t["scrapePool"] == pool]

    def ranks(self, job_id: str) -> dict[str, dict[str, Any]]:
        """The job's rank targets Prometheus has now, by rank."""
        found = self.active_targets(contract.SCRAPE_JOB_RANKS)
        return {
            t["labels"][contract.LABEL_RANK]: t
            for t in found
            if t["labels"].get(contract.LABEL_JOB_ID) == job_id
        }

    def query(self, expr: str) -> list[dict[str, Any]]:
        response = httpx.get(f"{self.prometheus}/api/v1/query", params={"query": expr}, timeout=10)
        assert response.status_code == 200, response.text
        result: list[dict[str, Any]] = response.json()["data"]["result"]
        return result

    def registered(self, kind: contract.DiscoveryKind) -> dict[str, dict[str, str]]:
        """What the service serves to Prometheus for ``kind``: ``{target: labels}``."""
        url = f"{self.service}{contract.DISCOVERY_PATH}/{kind.value}"
        response = httpx.get(url, headers=AUTH, timeout=10)
        assert response.status_code == 200, response.text
        return {group["targets"][0]: group["labels"] for group in response.json()}


@dataclass
class Job:
    """Two ranks of ``rank_job.py`` in ``workdir``, registering with the stack's service."""

    job_id: str
    workdir: Path
    service: str
    ttl_seconds: float
    ranks: list[subprocess.Popen[bytes]] = field(default_factory=list)

    def start(self) -> None:
        self.workdir.mkdir(parents=True)
        env = {
            name: value
            for name, value in os.environ.items()
            if name not in (contract.ENV_FILE_SD_DIR, contract.ENV_REMEDIATION_URL)
            and not name.startswith("OTEL_")
        }
        env.update(
            {
                "MASTER_ADDR": "127.0.0.1",
                "MASTER_PORT": str(free_port()),
                "WORLD_SIZE": "2",
                contract.ENV_JOB_ID: self.job_id,
                contract.ENV_NODE: f"{self.job_id}-node",
                contract.ENV_METRICS_PORT: "0",
                contract.ENV_METRICS_ADDR: "127.0.0.1",
                contract.ENV_DISCOVERY_URL: self.service,
                contract.ENV_DISCOVERY_TTL: str(self.ttl_seconds),
                contract.ENV_REMEDIATION_TOKEN: TOKEN,
            }
        )
        for rank in range(2):
            with (self.workdir / f"rank{rank}.log").open("ab") as log:
                self.ranks.append(
                    subprocess.Popen(
                        [sys.executable, "-u", str(RANK_JOB), str(self.workdir / "stop")],
                        stdout=log,
                        stderr=subprocess.STDOUT,
                        env={**env, "RANK": str(rank), "LOCAL_RANK": str(rank)},
                        cwd=self.workdir,
                    )
                )

    def stop(self) -> list[int]:
        """Tell the ranks to stop; their exit codes."""
        (self.workdir / "stop").touch()
        return [rank.wait(timeout=120) for rank in self.ranks]

    def kill(self) -> None:
        for rank in self.ranks:
            if rank.poll() is None:
                rank.kill()
                rank.wait()


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    running = Stack(tmp_path_factory.mktemp("prometheus-side"))
    try:
        running.start()
        yield running
    finally:
        running.stop()


@pytest.fixture
def job(stack: Stack, tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Job]:
    """A job with the TTL the test's ``ttl`` marker asks for; killed at the end if need be."""
    started = Job(request.param["job_id"], tmp_path / "ranks", stack.service, request.param["ttl"])
    started.start()
    try:
        yield started
    finally:
        started.kill()


def both_ranks_up(stack: Stack, job: Job) -> dict[str, dict[str, Any]] | None:
    ranks = stack.ranks(job.job_id)
    if set(ranks) == {"0", "1"} and all(t["health"] == "up" for t in ranks.values()):
        return ranks
    return None


@pytest.mark.parametrize("job", [{"job_id": "clean", "ttl": 300}], indirect=True)
def test_prometheus_discovers_a_running_job_and_drops_it_when_it_exits(
    stack: Stack, job: Job
) -> None:
    started = time.monotonic()
    ranks = wait_for(
        "both ranks discovered and scraped",
        lambda: both_ranks_up(stack, job),
        START_TIMEOUT,
        job.workdir,
        stack.root,
    )
    print(f"discovered and scraped {time.monotonic() - started:.1f} s after the ranks started")
    for rank, target in ranks.items():
        assert target["labels"][contract.LABEL_LOCAL_RANK] == rank
        assert target["labels"][contract.LABEL_NODE] == "clean-node"
        assert target["labels"]["instance"].startswith("127.0.0.1:")
    # The scrapes bring the ranks' own series: the job's world size, from each rank.
    sizes = wait_for(
        "the ranks' series",
        lambda: stack.query(f'{contract.WORLD_SIZE.name}{{{contract.LABEL_JOB_ID}="clean"}}'),
        DROP_TIMEOUT,
        job.workdir,
        stack.root,
    )
    assert sorted(s["metric"][contract.LABEL_RANK] for s in sizes) == ["0", "1"]
    assert {s["value"][1] for s in sizes} == {"2"}
    assert not list(job.workdir.rglob("*.json")), "no file_sd file was written"

    assert job.stop() == [0, 0]
    stopped = time.monotonic()
    registered = stack.registered(contract.DiscoveryKind.RANKS).values()
    assert all(labels[contract.LABEL_JOB_ID] != "clean" for labels in registered), "withdrawn"
    wait_for(
        "the job's targets dropped",
        lambda: not stack.ranks("clean"),
        DROP_TIMEOUT,
        job.workdir,
        stack.root,
    )
    # Within a few refreshes, long before the 300 s TTL: the clean exit deregistered them.
    print(f"dropped {time.monotonic() - stopped:.1f} s after the ranks exited")


@pytest.mark.parametrize("job", [{"job_id": "killed", "ttl": 9}], indirect=True)
def test_a_rank_killed_with_sigkill_drops_out_after_its_ttl(stack: Stack, job: Job) -> None:
    ranks = wait_for(
        "both ranks discovered",
        lambda: both_ranks_up(stack, job),
        START_TIMEOUT,
        job.workdir,
        stack.root,
    )
    victim = ranks["1"]["labels"]["instance"]
    job.ranks[1].send_signal(signal.SIGKILL)
    job.ranks[1].wait(timeout=30)
    killed = time.monotonic()
    # Nothing withdrew it: it was renewed at most a third of its 9 s TTL ago.
    assert victim in stack.registered(contract.DiscoveryKind.RANKS)
    wait_for(
        "the killed rank dropped",
        lambda: "1" not in stack.ranks("killed"),
        DROP_TIMEOUT,
        job.workdir,
        stack.root,
    )
    gone = time.monotonic() - killed
    assert victim not in stack.registered(contract.DiscoveryKind.RANKS)
    print(f"the killed rank dropped {gone:.1f} s after SIGKILL (TTL 9 s, refresh {REFRESH})")


def test_prometheus_discovers_a_node_exporter_and_drops_it_on_sigterm(
    stack: Stack, tmp_path: Path
) -> None:
    command = [
        sys.executable, "-m", "trainguard.exporters.app",
        "--web.listen-address", "127.0.0.1:0", "--simulate-gpus", "1", "--node", "node-x",
        "--log-format", "text", "--discovery.url", stack.service,
        "--discovery.token-file", str(stack.token_file), "--discovery.ttl-seconds", "300",
    ]  # fmt: skip
    with (tmp_path / "exporter.log").open("ab") as log:
        exporter = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
    try:

        def node_x() -> list[dict[str, Any]]:
            found = stack.active_targets(contract.SCRAPE_JOB_EXPORTER)
            return [t for t in found if t["labels"].get(contract.LABEL_NODE) == "node-x"]

        (target,) = wait_for(
            "the exporter discovered and scraped",
            lambda: [t for t in node_x() if t["health"] == "up"],
            START_TIMEOUT,
            tmp_path,
            stack.root,
        )
        assert target["labels"]["instance"].startswith("127.0.0.1:")
        exporter.send_signal(signal.SIGTERM)
        assert exporter.wait(timeout=30) == 0
        wait_for("the exporter dropped", lambda: not node_x(), DROP_TIMEOUT, tmp_path, stack.root)
    finally:
        if exporter.poll() is None:
            exporter.kill()
            exporter.wait()
