"""The closed loop on the real binaries: a fake training job, Prometheus, Alertmanager, the
remediation service and a pager, wired as in production but on fast clocks.

- :class:`FakeJob` stands in for a torchrun job: one ``/metrics`` endpoint per rank, served from
  the test process with prometheus_client and announced through ``file_sd`` files, with the
  contract's metric names and the labels the real hook sets (the rank's identity labels on every
  series, where the job runs in ``rank_info``), so the shipped rules apply unchanged. A ticker
  thread advances the job's step while it is healthy; the test injects faults (an OOM on a rank,
  a straggler, a rank that dies, a node that leaves) and each rank answers the service's
  directives through the hook's own :class:`DirectiveClient`, which acknowledges them. A
  directive the job was told cures its fault ends it, and training steps on.
- :class:`FakeAgent` is a process tree shaped like a torchrun agent and its workers (environment
  and parentage as the local executor looks for them), for actions that signal agents.
- :class:`Pager` records what Alertmanager delivers to the human receiver.
- :class:`LoopStack` renders the project's rules with fast thresholds, Prometheus' and
  Alertmanager's configurations and a policy, starts ``prometheus``, ``prometheus-alertmanager``
  and ``trainguard remediation --live`` as processes, and reads them back over HTTP.

Tests poll with generous deadlines (:func:`wait_for`) and assert outcomes and orders, never
tight timings: they must pass on a loaded two-core machine.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import TracebackType
from typing import Any, TypeVar

import httpx
import yaml
from prometheus_client import CollectorRegistry
from prometheus_client.exposition import MetricsHandler
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from tests.alerts.tools import binary
from tests.ports import free_port
from trainguard import contract
from trainguard.alerts import rules as alert_rules
from trainguard.contract import Action
from trainguard.demo.stack import DEMO_THRESHOLDS
from trainguard.instrumentation.directives import Directive, DirectiveClient
from trainguard.prometheus_families import (
    counter_family,
    gauge_family,
    histogram_family,
    info_family,
)
from trainguard.thresholds import Thresholds, default_path

T = TypeVar("T")

# Faster still than the demo's: each test runs in about a minute. The OOM window is what an OOM
# alert takes to resolve once the OOMs stop; a vanished rank is remembered for the absent window.
LOOP_THRESHOLDS: dict[str, Any] = {
    **DEMO_THRESHOLDS,
    "rate_window": "10s",
    "warmup_steps": 5,
    "straggler_for": "3s",
    "rank_down_for": "5s",
    "rank_absent_window": "20s",
    "oom_window": "15s",
}
SCRAPE_SECONDS = 1
STEP_SECONDS = 0.5
COMPUTE_SECONDS = 0.2
# The ranks' long-poll, and the service's cap on it.
POLL_SECONDS = 5.0


def thresholds() -> dict[str, Any]:
    """The shipped thresholds with the loop's fast values."""
    shipped: dict[str, Any] = yaml.safe_load(default_path().read_text())
    return {**shipped, **LOOP_THRESHOLDS}


def wait_for(what: str, probe: Callable[[], T | None], timeout: float) -> T:
    """``probe()``'s first truthy value, polled twice a second; fails after ``timeout``."""
    deadline = time.monotonic() + timeout
    last: T | None = None
    while True:
        last = probe()
        if last:
            return last
        if time.monotonic() >= deadline:
            raise AssertionError(f"{what}: not seen within {timeout:g}s (last: {last!r})")
        time.sleep(0.5)


# --- the fake training job ------------------------------------------------------------------


class FakeRank(Collector):
    """One rank: its counters, its ``/metrics`` endpoint, its file_sd file, its directives."""

    def __init__(self, job: FakeJob, rank: int, local_rank: int, node: str) -> None:
        self.job = job
        self.rank = rank
        self.local_rank = local_rank
        self.node = node
        self.steps = 0  # steps this process completed (the hook's steps_total)
        self.compute_sum = 0.0
        self.last_step_at = 0.0
        self.oom_events = 0
        self.slowness = 1.0
        self.ooming = False
        self._server: ThreadingHTTPServer | None = None
        self._file_sd: Path | None = None
        self._directives: DirectiveClient | None = None

    @property
    def identity(self) -> dict[str, str]:
        return {
            contract.LABEL_JOB_ID: self.job.job_id,
            contract.LABEL_RANK: str(self.rank),
            contract.LABEL_LOCAL_RANK: str(self.local_rank),
            contract.LABEL_NODE: self.node,
        }

    @property
    def alive(self) -> bool:
        return self._server is not None

    def collect(self) -> Iterable[Metric]:
        labels = contract.RANK_IDENTITY_LABELS
        values = [self.identity[name] for name in labels]
        with self.job.lock:
            step, world_size = self.job.step, self.job.world_size
            steps, compute_sum = self.steps, self.compute_sum
            last_step_at, oom_events = self.last_step_at, self.oom_events
        gauges = (
            (contract.TRAINING_STEP, step),
            (contract.WORLD_SIZE, world_size),
            (contract.RANK_INDEX, self.rank),
            (contract.LAST_STEP_TIMESTAMP, last_step_at),
        )
        for spec, value in gauges:
            gauge = gauge_family(spec, labels=labels)
            gauge.add_metric(values, value)
            yield gauge
        for spec, value in ((contract.STEPS, steps), (contract.OOM_EVENTS, oom_events)):
            counter = counter_family(spec, labels=labels)
            counter.add_metric(values, value)
            yield counter
        # The hook exports its recovery counter from the start; this job's OOMs never recover.
        recoveries = counter_family(contract.OOM_RECOVERIES, labels=labels)
        recoveries.add_metric(values, 0)
        yield recoveries
        compute = histogram_family(contract.STEP_COMPUTE_DURATION, labels=labels)
        compute.add_metric(values, buckets=[("+Inf", steps)], sum_value=compute_sum)
        yield compute
        info = info_family(contract.RANK_INFO, labels=labels)
        info.add_metric(
            values,
            {
                contract.LABEL_BACKEND: "gloo",
                "world_size": str(world_size),
                "device": "cpu",
                contract.LABEL_PARALLELISM: contract.Parallelism.DDP.value,
                contract.LABEL_TIMING_SOURCE: contract.TimingSource.DDP_REDUCER.value,
                contract.LABEL_SCHEDULER: contract.SCHEDULER_LOCAL,
                contract.LABEL_NAMESPACE: "",
                contract.LABEL_SLURM_JOB_ID: "",
            },
        )
        yield info

    def start(self, file_sd: Path, service_url: str, token: str) -> None:
        """Serve ``/metrics``, announce it to Prometheus, poll for directives."""
        registry = CollectorRegistry(auto_describe=False)
        registry.register(self)
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), MetricsHandler.factory(registry))
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        name = f"{self.job.job_id}-rank{self.rank}"
        target = f"127.0.0.1:{self._server.server_address[1]}"
        tmp = file_sd / f".{name}.json.tmp"
        tmp.write_text(json.dumps([{"targets": [target], "labels": self.identity}]))
        self._file_sd = file_sd / f"{name}.json"
        tmp.replace(self._file_sd)
        self._directives = DirectiveClient(
            service_url,
            self.job.job_id,
            self.rank,
            lambda directive: self.job.carry_out(self, directive),
            token=token,
            poll_seconds=POLL_SECONDS,
        )
        self._directives.start()

    def kill(self) -> None:
        """The process dies: its endpoint stops answering (Prometheus' ``up`` turns 0, the
        file_sd file stays, as a killed process leaves it) and it polls no more."""
        if self._directives is not None:
            self._directives.stop(timeout=0)
            self._directives = None
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def withdraw(self) -> None:
        """Take the rank's target out of Prometheus' service discovery."""
        if self._file_sd is not None:
            self._file_sd.unlink(missing_ok=True)
            self._file_sd = None

    def remove(self) -> None:
        """The rank is gone for good: killed, and its target withdrawn."""
        self.kill()
        self.withdraw()


@dataclass(frozen=True)
class Received:
    """A directive a rank carried out."""

    rank: int
    directive: Directive


class FakeJob:
    """A synchronous data-parallel job: every live rank completes the same step each tick,
    unless a rank is out of memory (its step fails, and so the job's)."""

    def __init__(
        self, job_id: str, nodes: Sequence[str], ranks_per_node: int, start_step: int = 100
    ) -> None:
        self.job_id = job_id
        self.lock = threading.Lock()
        self.step = start_step
        self.ranks = [
            FakeRank(self, index * ranks_per_node + local, local, node)
            for index, node in enumerate(nodes)
            for local in range(ranks_per_node)
        ]
        self.world_size = len(self.ranks)
        self.received: list[Received] = []
        self._cures: set[Action] = set()
        self._stop = threading.Event()
        self._ticker = threading.Thread(target=self._tick, name=f"{job_id}-ticker", daemon=True)

    def start(self, file_sd: Path, service_url: str, token: str) -> None:
        for rank in self.ranks:
            rank.start(file_sd, service_url, token)
        self._ticker.start()

    def stop(self) -> None:
        """The job ends: every target withdrawn before any rank stops answering, so that no rank
        is seen down while others of the job are up."""
        self._stop.set()
        self._ticker.join(5)
        for rank in self.ranks:
            rank.withdraw()
        for rank in self.ranks:
            rank.kill()

    def _tick(self) -> None:
        while not self._stop.wait(STEP_SECONDS):
            with self.lock:
                live = [rank for rank in self.ranks if rank.alive]
                ooming = [rank for rank in live if rank.ooming]
                for rank in ooming:
                    rank.oom_events += 1
                if ooming:
                    continue
                self.step += 1
                now = time.time()
                for rank in live:
                    rank.steps += 1
                    rank.compute_sum += COMPUTE_SECONDS * rank.slowness
                    rank.last_step_at = now

    def rank(self, rank: int) -> FakeRank:
        (found,) = [r for r in self.ranks if r.rank == rank]
        return found

    def on_node(self, node: str) -> list[FakeRank]:
        return [rank for rank in self.ranks if rank.node == node]

    def current_step(self) -> int:
        with self.lock:
            return self.step

    def oom(self, rank: int, cured_by: Iterable[Action] = ()) -> None:
        """``rank`` runs out of memory at every step until a directive in ``cured_by`` arrives."""
        with self.lock:
            self.rank(rank).ooming = True
            self._cures = set(cured_by)

    def straggle(self, rank: int, factor: float) -> None:
        with self.lock:
            self.rank(rank).slowness = factor

    def kill(self, rank: int) -> None:
        self.rank(rank).kill()

    def leave(self, node: str, *, withdrawn: bool) -> None:
        """``node`` is taken out of the job: its ranks die (their targets withdrawn, or left
        behind as a killed process leaves its file_sd file), and the ranks left re-form the job
        with a world of their own size (they keep ranks 0..n-1: the node held the highest)."""
        leaving = self.on_node(node)
        with self.lock:
            staying = [r for r in self.ranks if r not in leaving]
            assert sorted(r.rank for r in staying) == list(range(len(staying))), staying
            self.world_size = len(staying)
        for rank in leaving:
            if withdrawn:
                rank.remove()
            else:
                rank.kill()

    def carry_out(self, rank: FakeRank, directive: Directive) -> None:
        """What the hook's directive callback does, as far as this job is concerned."""
        with self.lock:
            self.received.append(Received(rank.rank, directive))
            if directive.kind in self._cures:
                for each in self.ranks:
                    each.ooming = False
                self._cures = set()

    def directives(self) -> list[Received]:
        with self.lock:
            return list(self.received)


# A torchrun agent as the local executor finds it: workers carry the job's id, torchrun's
# LOCAL_RANK and TORCHELASTIC_RUN_ID, and their parent is the agent. On SIGTERM the agent takes
# its workers with it.
_AGENT = """
import os, signal, subprocess, sys
workers = [
    subprocess.Popen(
        ["sleep", "3600"],
        env={**os.environ, "LOCAL_RANK": str(i), "TORCHELASTIC_RUN_ID": os.environ[sys.argv[1]]},
    )
    for i in range(int(sys.argv[2]))
]
signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
signal.sigwait({signal.SIGTERM})
for worker in workers:
    worker.terminate()
for worker in workers:
    worker.wait()
"""


class FakeAgent:
    """A process tree shaped like the torchrun agent of one node of a job, and its workers."""

    def __init__(self, job_id: str, node: str, workers: int) -> None:
        env = {
            key: value
            for key, value in os.environ.items()
            if key not in ("LOCAL_RANK", "TORCHELASTIC_RUN_ID", "RANK")
        }
        env.update({contract.ENV_JOB_ID: job_id, contract.ENV_NODE: node})
        self.process = subprocess.Popen(
            [sys.executable, "-c", _AGENT, contract.ENV_JOB_ID, str(workers)],
            env=env,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )

    def alive(self) -> bool:
        return self.process.poll() is None

    def stop(self) -> None:
        _stop_group(self.process)


# --- the pager ------------------------------------------------------------------------------


class Pager:
    """The human's receiver: records every notification Alertmanager delivers to it."""

    def __init__(self) -> None:
        self.notifications: list[dict[str, Any]] = []
        lock = threading.Lock()
        delivered = self.notifications

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                with lock:
                    delivered.append(json.loads(body))
                self.send_response(200)
                self.end_headers()

            def log_message(self, format: str, *args: Any) -> None:
                """Deliveries are asserted on, not logged."""

        self._lock = lock
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}/page"
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    def alerts(self) -> list[dict[str, Any]]:
        """Every alert delivered so far (firing or resolved), in delivery order."""
        with self._lock:
            return [alert for note in self.notifications for alert in note["alerts"]]

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


# --- the stack ------------------------------------------------------------------------------


@dataclass
class LoopStack:
    """Prometheus, Alertmanager and the remediation service on ``workdir``, with ``policy``."""

    workdir: Path
    policy: Mapping[str, Any]
    token: str = field(default_factory=lambda: secrets.token_urlsafe(24))
    pager: Pager = field(default_factory=Pager)
    processes: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.ports = {name: free_port() for name in ("prometheus", "alertmanager", "service")}
        self.file_sd = self.workdir / "file_sd"
        self.logs = self.workdir / "logs"
        self.token_file = self.workdir / "token"
        self.jobs: list[FakeJob] = []
        self.agents: list[FakeAgent] = []
        self.prometheus = httpx.Client(base_url=self.url("prometheus"), timeout=10)
        self.service = httpx.Client(
            base_url=self.url("service"),
            headers={"Authorization": f"Bearer {self.token}"},
            timeout=10,
        )

    def url(self, name: str) -> str:
        return f"http://127.0.0.1:{self.ports[name]}"

    # -- start and stop ---------------------------------------------------------------------
    def __enter__(self) -> LoopStack:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        self.stop()

    def start(self) -> None:
        prometheus = binary("prometheus")
        alertmanager = binary("prometheus-alertmanager")
        for folder in (self.file_sd, self.logs):
            folder.mkdir(parents=True, exist_ok=True)
        self.token_file.write_text(self.token)
        self.token_file.chmod(0o600)
        config = self.workdir / "config"
        config.mkdir(exist_ok=True)
        rules = config / "trainguard.rules.yml"
        rules.write_text(alert_rules.render(Thresholds.from_mapping(thresholds())))
        policy = _dump(config / "policy.yml", dict(self.policy))
        self._start(
            "service",
            [
                sys.executable, "-m", "trainguard", "remediation", "--live",
                "--port", str(self.ports["service"]),
                "--db", str(self.workdir / "remediation.db"),
                "--policy", str(policy),
                "--token-file", str(self.token_file),
                "--log-format", "text",
            ],
            {
                "TRAINGUARD_REMEDIATION_PROMETHEUS_URL": self.url("prometheus"),
                "TRAINGUARD_REMEDIATION_ALERTMANAGER_URL": self.url("alertmanager"),
                "TRAINGUARD_REMEDIATION_PUBLIC_URL": self.url("service"),
                "TRAINGUARD_REMEDIATION_VERIFY_INTERVAL_SECONDS": "1",
                # The fake ranks step every scrape or so: a few seconds of progress after a
                # repair tell training goes on.
                "TRAINGUARD_REMEDIATION_VERIFY_PROGRESS_SECONDS": "4",
                "TRAINGUARD_REMEDIATION_REQUIRE_APPROVAL": "false",
                "TRAINGUARD_REMEDIATION_BUDGET_PER_HOUR": "50",
                "TRAINGUARD_REMEDIATION_SWEEP_INTERVAL_SECONDS": "0.5",
                "TRAINGUARD_REMEDIATION_LONG_POLL_MAX_SECONDS": str(POLL_SECONDS),
                "TRAINGUARD_REMEDIATION_DIRECTIVE_ACK_TIMEOUT_SECONDS": "15",
                "TRAINGUARD_REMEDIATION_SQLITE_SYNCHRONOUS": "NORMAL",
            },
        )  # fmt: skip
        self._start(
            "prometheus",
            [
                prometheus,
                f"--config.file={_dump(config / 'prometheus.yml', self._prometheus(rules))}",
                f"--storage.tsdb.path={self.workdir / 'prometheus-data'}",
                f"--web.listen-address=127.0.0.1:{self.ports['prometheus']}",
            ],
        )
        self._start(
            "alertmanager",
            [
                alertmanager,
                f"--config.file={_dump(config / 'alertmanager.yml', self._alertmanager())}",
                f"--storage.path={self.workdir / 'alertmanager-data'}",
                f"--web.listen-address=127.0.0.1:{self.ports['alertmanager']}",
                "--cluster.listen-address=",  # one instance: no gossip port
            ],
        )
        for name, path in (
            ("prometheus", "/-/ready"),
            ("alertmanager", "/-/ready"),
            ("service", "/readyz"),
        ):
            wait_for(f"{name} ready", partial(self._ready, name, path), timeout=60)

    def _ready(self, name: str, path: str) -> bool:
        died = [n for n, p in self.processes.items() if p.poll() is not None]
        assert not died, f"{died} exited:\n{self.log_tails()}"
        try:
            return httpx.get(self.url(name) + path, timeout=2).status_code == 200
        except httpx.TransportError:
            return False

    def _start(self, name: str, command: list[str], env: Mapping[str, str] | None = None) -> None:
        with (self.logs / f"{name}.log").open("ab") as log:
            self.processes[name] = subprocess.Popen(
                command,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env={**os.environ, **(env or {})},
                cwd=self.workdir,
                start_new_session=True,
            )

    def finish(self) -> None:
        """End the jobs and agents started so far (a test's own), keeping the services."""
        for job in self.jobs:
            job.stop()
        for agent in self.agents:
            agent.stop()
        self.jobs.clear()
        self.agents.clear()

    def stop(self) -> None:
        self.finish()
        for process in self.processes.values():
            _stop_group(process)
        self.pager.close()
        self.prometheus.close()
        self.service.close()

    def log_tails(self, lines: int = 15) -> str:
        """The last lines of each process's log, for failure messages."""
        tails = []
        for path in sorted(self.logs.glob("*.log")):
            text = path.read_text(errors="replace").splitlines()[-lines:]
            tails.append(f"--- {path.name}\n" + "\n".join(text))
        return "\n".join(tails)

    def _prometheus(self, rules: Path) -> dict[str, Any]:
        interval = f"{SCRAPE_SECONDS}s"
        return {
            "global": {"scrape_interval": interval, "evaluation_interval": interval},
            "rule_files": [str(rules)],
            "alerting": {
                "alertmanagers": [{"static_configs": [{"targets": [self._host("alertmanager")]}]}]
            },
            "scrape_configs": [
                {
                    "job_name": contract.SCRAPE_JOB_RANKS,
                    "honor_labels": True,
                    "file_sd_configs": [
                        {"files": [str(self.file_sd / "*.json")], "refresh_interval": interval}
                    ],
                }
            ],
        }

    def _alertmanager(self) -> dict[str, Any]:
        return {
            "route": {
                "receiver": "remediation",
                "group_by": ["alertname", contract.LABEL_JOB_ID],
                "group_wait": "1s",
                "group_interval": "2s",
                "repeat_interval": "1h",
                "routes": [
                    {
                        "receiver": "pager",
                        "matchers": [f'alertname="{contract.REMEDIATION_FAILED_ALERT}"'],
                    }
                ],
            },
            "receivers": [
                {
                    "name": "remediation",
                    "webhook_configs": [
                        {
                            "url": f"{self.url('service')}/v1/alertmanager",
                            "send_resolved": True,
                            "http_config": {
                                "authorization": {"credentials_file": str(self.token_file)}
                            },
                        }
                    ],
                },
                {
                    "name": "pager",
                    "webhook_configs": [{"url": self.pager.url, "send_resolved": True}],
                },
            ],
        }

    def _host(self, name: str) -> str:
        return f"127.0.0.1:{self.ports[name]}"

    # -- the job ----------------------------------------------------------------------------
    def job(
        self, job_id: str, nodes: Sequence[str], ranks_per_node: int, start_step: int = 100
    ) -> FakeJob:
        """A job whose ranks serve metrics and poll for directives from now on."""
        job = FakeJob(job_id, nodes, ranks_per_node, start_step)
        self.jobs.append(job)
        job.start(self.file_sd, self.url("service"), self.token)
        return job

    def agent(self, job_id: str, node: str, workers: int) -> FakeAgent:
        agent = FakeAgent(job_id, node, workers)
        self.agents.append(agent)
        return agent

    # -- reading Prometheus -----------------------------------------------------------------
    def query(self, expr: str) -> list[dict[str, Any]]:
        """An instant query's series: ``[{"metric": {...}, "value": [t, "v"]}, ...]``."""
        response = self.prometheus.get("/api/v1/query", params={"query": expr})
        assert response.status_code == 200, (expr, response.text)
        result: list[dict[str, Any]] = response.json()["data"]["result"]
        return result

    def firing(
        self, alert: contract.Alert, *, over_seconds: float = 0, **labels: str
    ) -> list[dict[str, str]]:
        """The labels of each ``alert`` Prometheus has firing now, or had firing at any time in
        the last ``over_seconds``."""
        matchers = [
            f'alertname="{alert.value}"',
            'alertstate="firing"',
            *(f'{name}="{value}"' for name, value in labels.items()),
        ]
        expr = f"ALERTS{{{','.join(matchers)}}}"
        if over_seconds:
            expr = f"max_over_time({expr}[{int(over_seconds) + 1}s])"
        return [series["metric"] for series in self.query(expr)]

    def job_step(self, job_id: str) -> float | None:
        """The job's ``max(trainguard_step)`` as Prometheus has it now (None while unscraped)."""
        found = self.query(
            f'max({contract.TRAINING_STEP.name}{{{contract.LABEL_JOB_ID}="{job_id}"}})'
        )
        return float(found[0]["value"][1]) if found else None

    # -- reading the service ----------------------------------------------------------------
    def incidents(self, **filters: str) -> list[dict[str, Any]]:
        """``GET /v1/incidents`` with ``state``/``outcome``/``job_id`` filters."""
        response = self.service.get("/v1/incidents", params=filters)
        assert response.status_code == 200, response.text
        found: list[dict[str, Any]] = response.json()["incidents"]
        return found

    def incident(self, incident_id: int | str) -> dict[str, Any]:
        response = self.service.get(f"/v1/incidents/{incident_id}")
        assert response.status_code == 200, response.text
        found: dict[str, Any] = response.json()
        return found

    def actions(self) -> list[dict[str, Any]]:
        """The audit trail, newest first (``GET /v1/actions``)."""
        response = self.service.get("/v1/actions", params={"limit": "500"})
        assert response.status_code == 200, response.text
        found: list[dict[str, Any]] = response.json()["actions"]
        return found

    def evidence(self, job_id: str) -> str:
        """What the service holds about a job, and the processes' last words: for failures."""
        actions = [
            (a["id"], a["alert"]["name"], a["alert"]["labels"].get(contract.LABEL_RANK),
             a["action"], a["state"], a["reason"])
            for a in self.actions()
            if a["alert"]["labels"].get(contract.LABEL_JOB_ID) == job_id
        ]  # fmt: skip
        incidents = [
            {k: i[k] for k in ("id", "alert", "state", "outcome", "rung", "tried", "note")}
            for i in self.incidents(job_id=job_id)
        ]
        return f"actions: {actions}\nincidents: {incidents}\n{self.log_tails()}"

    def wait_for(self, job_id: str, what: str, probe: Callable[[], T | None], timeout: float) -> T:
        """:func:`wait_for`, failing with the service's :meth:`evidence` about the job."""
        try:
            return wait_for(what, probe, timeout)
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n{self.evidence(job_id)}") from None

    def closed_incident(self, job_id: str, timeout: float) -> dict[str, Any]:
        """The job's one incident, once closed."""

        def closed() -> dict[str, Any] | None:
            found = self.incidents(job_id=job_id)
            return found[0] if len(found) == 1 and found[0]["state"] == "closed" else None

        return self.wait_for(job_id, f"incident of {job_id} closed", closed, timeout)


def _dump(path: Path, data: Mapping[str, Any]) -> Path:
    path.write_text(yaml.safe_dump(dict(data), sort_keys=False))
    return path


def _stop_group(process: subprocess.Popen[bytes], grace: float = 10.0) -> None:
    """SIGTERM a process group we started, SIGKILL it if it outlives ``grace``."""
    if process.poll() is None:
        _signal_group(process, signal.SIGTERM)
        try:
            process.wait(grace)
        except subprocess.TimeoutExpired:
            _signal_group(process, signal.SIGKILL)
            process.wait(5)
    _signal_group(process, signal.SIGKILL)  # children that outlived their leader


def _signal_group(process: subprocess.Popen[bytes], signum: int) -> None:
    try:
        os.killpg(process.pid, signum)
    except (ProcessLookupError, PermissionError):
        return
