"""The demo's stack on one machine: configuration files and the processes that use them.

:func:`write_configs` renders everything into the work folder: alert rules from
the packaged ``thresholds.yml`` with demo-speed overrides (short windows and ``for`` durations),
``prometheus.yml`` (2 s scrapes, file_sd for the ranks, exemplar storage), ``alertmanager.yml``
(every alert to the remediation webhook, bearer token from a file), the remediation policy
(actions only for the demo's own job) and the token. :class:`Stack` starts the processes —
remediation service, exporter, Prometheus, Alertmanager and two torchrun elastic agents that
stand for two nodes — each in its own session with its log in the work folder, and stops every
one of them on :meth:`Stack.stop` (also on Ctrl-C), so nothing is left running.
"""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from trainguard import contract
from trainguard.alerts import rules as alert_rules
from trainguard.demo.config import DEMO_JOB_ID, NODES, DemoConfig
from trainguard.thresholds import Thresholds, default_path

REPO_ALERTS = Path(alert_rules.__file__).resolve().parent

# Demo-speed thresholds: the shipped ones are for real jobs (10-minute straggler windows).
DEMO_THRESHOLDS: dict[str, Any] = {
    "rate_window": "20s",
    "warmup_steps": 10,
    "straggler_for": "6s",
    "collective_stall_floor_seconds": 8,
    "collective_stall_step_multiplier": 5,
    "collective_stall_for": "0s",
    "stalled_seconds": 120,
    "stalled_for": "10s",
    "rank_down_for": "10s",
    "rank_absent_window": "2m",
    "rank_restart_window": "1m",
    # An OOM alert stays firing for this long after the OOM (the service verifies the repair by
    # the OOMs counted since, not by the alert resolving).
    "oom_window": "30s",
    "nccl_timeout_window": "2m",
    "dataloader_for": "1m",
    # The reliability panels (success rate, MTTR) within the demo's three minutes.
    "reliability_interval": "4s",
    "fragmentation_for": "1m",
}
# How long the service gives each of the demo's repairs to show recovery before it escalates.
VERIFY_SECONDS = 60.0
# Prometheus scrapes and evaluates every this often (the finest step diagnose reads at).
SCRAPE_SECONDS = 2
# The hook's own watchdog floor: below the alert's floor, so dumps exist when the alert fires.
HOOK_STALL_FLOOR_SECONDS = 4.0


@dataclass(frozen=True)
class Pace:
    """How fast the stack's loop turns: Prometheus' intervals, the thresholds over the shipped
    ``thresholds.yml``, the hook's watchdog floor and the remediation service's timers.

    The demo runs at :data:`DEMO_PACE`, a loop that turns in seconds; the fault matrix can also
    run at the shipped one (``benchmarks.fault_matrix_plan.shipped_pace``: ``deploy/``'s
    intervals, every threshold, floor and service setting at its default)."""

    name: str
    scrape_seconds: float  # every target but the ranks
    rank_scrape_seconds: float
    evaluation_seconds: float
    thresholds: Mapping[str, Any] = field(default_factory=dict)
    hook_stall_floor_seconds: float | None = None  # None: the hook's default
    service_env: Mapping[str, str] = field(default_factory=dict)


DEMO_PACE = Pace(
    name="fast",
    scrape_seconds=SCRAPE_SECONDS,
    rank_scrape_seconds=SCRAPE_SECONDS,
    evaluation_seconds=SCRAPE_SECONDS,
    thresholds=DEMO_THRESHOLDS,
    hook_stall_floor_seconds=HOOK_STALL_FLOOR_SECONDS,
    service_env={
        "TRAINGUARD_REMEDIATION_COOLDOWN_SECONDS": "30",
        "TRAINGUARD_REMEDIATION_SWEEP_INTERVAL_SECONDS": "0.5",
        "TRAINGUARD_REMEDIATION_BUDGET_PER_HOUR": "20",
        # Ranks count as listening for a long-poll plus 5 s after their last poll: a short
        # poll forgets the excluded node's ranks before the hang's dump directive, which then
        # waits only for the ranks alive.
        "TRAINGUARD_REMEDIATION_LONG_POLL_MAX_SECONDS": "5",
        "TRAINGUARD_REMEDIATION_VERIFY_INTERVAL_SECONDS": "1",
        # The demo steps ten times a second: 10 s of training after a repair is plenty.
        "TRAINGUARD_REMEDIATION_VERIFY_PROGRESS_SECONDS": "10",
    },
)


def _seconds(value: float) -> str:
    return f"{value:g}s"


def _dump(path: Path, data: Any) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def demo_policy(cfg: DemoConfig, jobs: str | None = None) -> dict[str, Any]:
    """Remediation for the demo's job only (or the jobs the ``jobs`` matcher selects, e.g.
    ``job_id=~"fm-.+"``): other jobs' alerts match no rule."""
    only_demo = [jobs or f'{contract.LABEL_JOB_ID}="{DEMO_JOB_ID}"']
    # Written with yaml.safe_dump, which takes plain strings: the actions' values.
    restart = [
        {"action": contract.Action.DUMP_DIAGNOSTICS.value},
        {"action": contract.Action.RESTART_FROM_CHECKPOINT.value},
    ]
    # Each repair is verified within VERIFY_SECONDS; one that did not work climbs its ladder,
    # and the last rung pages a human through Alertmanager.
    page = {"action": contract.Action.PAGE.value}
    rules: list[dict[str, Any]] = [
        {
            "alert": contract.Alert.TRAINING_STRAGGLER.value,
            "matchers": only_demo,
            "actions": [
                {
                    "action": contract.Action.EXCLUDE_NODE.value,
                    "after_seconds": cfg.straggler_exclude_after_seconds,
                    "cooldown_seconds": 600,
                }
            ],
            "verify_seconds": VERIFY_SECONDS,
            "escalate": [page],
        },
        {
            "alert": contract.Alert.TRAINING_COLLECTIVE_STALLED.value,
            "matchers": only_demo,
            "actions": restart,
            "verify_seconds": VERIFY_SECONDS,
            "escalate": [page],
        },
        {
            "alert": contract.Alert.TRAINING_NCCL_TIMEOUT.value,
            "matchers": only_demo,
            "actions": restart,
            "verify_seconds": VERIFY_SECONDS,
            "escalate": [page],
        },
        {
            "alert": contract.Alert.TRAINING_OOM.value,
            "matchers": only_demo,
            "actions": [
                {"action": contract.Action.SPLIT_MICRO_BATCHES.value, "params": {"factor": 2}}
            ],
            "verify_seconds": VERIFY_SECONDS,
            "escalate": [
                {
                    "action": contract.Action.RESTART_FROM_CHECKPOINT.value,
                    "verify_seconds": VERIFY_SECONDS,
                },
                page,
            ],
        },
    ]
    return {"version": 1, "rules": rules}


def demo_thresholds(
    override: Mapping[str, Any] | None = None, pace: Pace = DEMO_PACE
) -> Thresholds:
    """The shipped thresholds with the pace's (and ``override``) over them: what its rules are
    rendered from, and what ``trainguard diagnose`` judges its runs by."""
    thresholds = yaml.safe_load(default_path().read_text())
    thresholds.update(pace.thresholds)
    thresholds.update(override or {})
    return Thresholds.from_mapping(thresholds)


def write_configs(
    cfg: DemoConfig,
    thresholds_override: Mapping[str, Any] | None = None,
    policy: Mapping[str, Any] | None = None,
    pace: Pace = DEMO_PACE,
) -> dict[str, Path]:
    """Render every configuration file the stack needs into the work folder: the pace's
    thresholds (and ``thresholds_override`` over them) and intervals, and the demo's policy (or
    ``policy``)."""
    conf = cfg.workdir / "config"
    rules_path = conf / "trainguard.rules.yml"
    rules_path.parent.mkdir(parents=True, exist_ok=True)
    rules_path.write_text(alert_rules.render(demo_thresholds(thresholds_override, pace)))
    cfg.token_file.parent.mkdir(parents=True, exist_ok=True)
    if not cfg.token_file.exists():
        cfg.token_file.write_text(secrets.token_urlsafe(32))
        cfg.token_file.chmod(0o600)
    for folder in (cfg.file_sd, cfg.logs, cfg.dumps, cfg.checkpoint_dir):
        folder.mkdir(parents=True, exist_ok=True)
    prometheus = {
        "global": {
            "scrape_interval": _seconds(pace.scrape_seconds),
            "evaluation_interval": _seconds(pace.evaluation_seconds),
        },
        "rule_files": [str(rules_path)],
        "storage": {"exemplars": {"max_exemplars": 100000}},
        "alerting": {
            "alertmanagers": [
                {"static_configs": [{"targets": [f"127.0.0.1:{cfg.ports.alertmanager}"]}]}
            ]
        },
        "scrape_configs": [
            {
                "job_name": "trainguard-ranks",
                "honor_labels": True,
                "scrape_interval": _seconds(pace.rank_scrape_seconds),
                "file_sd_configs": [
                    {"files": [str(cfg.file_sd / "*.json")], "refresh_interval": "2s"}
                ],
            },
            {
                "job_name": "trainguard-exporter",
                "static_configs": [
                    {
                        "targets": [f"127.0.0.1:{cfg.ports.exporter}"],
                        "labels": {contract.LABEL_NODE: NODES[0]},
                    }
                ],
            },
            {
                "job_name": "trainguard-remediation",
                "static_configs": [{"targets": [f"127.0.0.1:{cfg.ports.remediation}"]}],
            },
        ],
    }
    alertmanager = {
        "route": {
            "receiver": "remediation",
            "group_by": ["alertname", contract.LABEL_JOB_ID],
            "group_wait": "1s",
            "group_interval": "2s",
            "repeat_interval": "1h",
            # The service's own page goes to people (here: nobody; Alertmanager's UI shows it),
            # never back to the service.
            "routes": [
                {
                    "matchers": [f'alertname="{contract.REMEDIATION_FAILED_ALERT}"'],
                    "receiver": "humans",
                }
            ],
        },
        "receivers": [
            {"name": "humans"},
            {
                "name": "remediation",
                "webhook_configs": [
                    {
                        "url": f"{cfg.url('remediation')}/v1/alertmanager",
                        "send_resolved": True,
                        "http_config": {"authorization": {"credentials_file": str(cfg.token_file)}},
                    }
                ],
            },
        ],
    }
    return {
        "rules": rules_path,
        "prometheus": _dump(conf / "prometheus.yml", prometheus),
        "alertmanager": _dump(conf / "alertmanager.yml", alertmanager),
        "policy": _dump(conf / "remediation-policy.yml", policy or demo_policy(cfg)),
    }


class MissingBinaryError(RuntimeError):
    """A program the demo needs is not installed; the message says how to get it."""


DEBIAN_PACKAGES = {"prometheus": "prometheus", "prometheus-alertmanager": "prometheus-alertmanager"}


def ensure_binaries() -> None:
    """Install Debian's Prometheus and Alertmanager if missing and possible, else explain."""
    missing = [name for name in DEBIAN_PACKAGES if shutil.which(name) is None]
    if not missing:
        return
    packages = [DEBIAN_PACKAGES[name] for name in missing]
    if os.geteuid() == 0 and shutil.which("apt-get"):
        print(f"installing {' '.join(packages)} from Debian ...", flush=True)
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        subprocess.run(["apt-get", "update", "-qq"], check=False, env=env)
        subprocess.run(["apt-get", "install", "-y", "-qq", *packages], check=False, env=env)
    still = [name for name in missing if shutil.which(name) is None]
    if still:
        raise MissingBinaryError(
            f"the demo needs {', '.join(still)} on PATH; install them with "
            f"`sudo apt-get install {' '.join(DEBIAN_PACKAGES[n] for n in still)}` "
            "(Debian/Ubuntu) or put the upstream binaries on PATH"
        )


SIMULATED_GPUS = 2


def local_gpu_count() -> int:
    """The GPUs NVML sees on this machine; 0 without a driver or without nvidia-ml-py."""
    try:
        from trainguard.exporters.nvml import gpu_count
    except ImportError:
        return 0
    return gpu_count()


def exporter_gpu_args(gpus: int) -> list[str]:
    """Real GPUs through NVML when there are any; simulated ones (marked so) otherwise."""
    return [] if gpus > 0 else ["--simulate-gpus", str(SIMULATED_GPUS)]


@dataclass(frozen=True)
class TrainingJob:
    """One job of the demo trainer: two torchrun agents ("nodes") on this host."""

    job_id: str
    checkpoint_dir: Path
    faults: str
    steps: int
    step_seconds: float
    rendezvous_port: int  # the store's (start_services starts it)
    metrics_port: int  # node-a's ranks serve from here, node-b's from here + 10
    trainer_args: Sequence[str] = ()
    env: Mapping[str, str] = field(default_factory=dict)
    spans_dir: Path | None = None
    max_restarts: int = 5

    def process_name(self, node: str) -> str:
        return f"agent-{node}" if self.job_id == DEMO_JOB_ID else f"agent-{self.job_id}-{node}"


class Stack:
    """Starts and stops the demo's processes; a context manager that always cleans up."""

    def __init__(self, cfg: DemoConfig, pace: Pace = DEMO_PACE) -> None:
        self.cfg = cfg
        self.pace = pace
        self.processes: dict[str, subprocess.Popen[bytes]] = {}
        self.paths: dict[str, Path] = {}
        self.gpus = 0  # GPUs found through NVML, set when the services start

    def __enter__(self) -> Stack:
        return self

    def __exit__(self, *_: object) -> None:
        self.stop()

    def _start(self, name: str, command: list[str], env: dict[str, str] | None = None) -> None:
        log = (self.cfg.logs / f"{name}.log").open("ab")
        self.processes[name] = subprocess.Popen(
            command,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env={**os.environ, **(env or {})},
            cwd=self.cfg.workdir,
            start_new_session=True,  # its own process group: stop() takes its children too
        )
        log.close()

    def start_services(
        self,
        thresholds_override: Mapping[str, Any] | None = None,
        policy: Mapping[str, Any] | None = None,
    ) -> None:
        """Remediation service, exporter, Prometheus and Alertmanager (see :func:`write_configs`
        for the two arguments)."""
        cfg = self.cfg
        self.paths = write_configs(cfg, thresholds_override, policy, self.pace)
        self.gpus = local_gpu_count()
        trainguard = [sys.executable, "-m", "trainguard"]
        self._start(
            "remediation",
            [
                *trainguard, "remediation", "--live",
                "--port", str(cfg.ports.remediation),
                "--db", str(cfg.workdir / "remediation.db"),
                "--policy", str(self.paths["policy"]),
                "--token-file", str(cfg.token_file),
            ],
            {
                "TRAINGUARD_REMEDIATION_REQUIRE_APPROVAL": "false",
                # Every action the service takes gets a `trainguard diagnose` report.
                "TRAINGUARD_REMEDIATION_DIAGNOSE_PROMETHEUS_URL": cfg.url("prometheus"),
                "TRAINGUARD_REMEDIATION_DIAGNOSE_DUMPS_DIR": str(cfg.dumps),
                # Every repair is verified from Prometheus; a ladder's last rung pages through
                # Alertmanager.
                "TRAINGUARD_REMEDIATION_PROMETHEUS_URL": cfg.url("prometheus"),
                "TRAINGUARD_REMEDIATION_ALERTMANAGER_URL": cfg.url("alertmanager"),
                "TRAINGUARD_REMEDIATION_PUBLIC_URL": cfg.url("remediation"),
                **self.pace.service_env,
            },
        )  # fmt: skip
        # The jobs' rendezvous store, apart from every agent (see trainguard.demo.rendezvous).
        self._start(
            "rendezvous",
            [
                sys.executable,
                "-m",
                "trainguard.demo.rendezvous",
                "--port",
                str(cfg.ports.rendezvous),
            ],
        )
        self._start(
            "exporter",
            [
                *trainguard, "exporter",
                "--web.listen-address", f"127.0.0.1:{cfg.ports.exporter}",
                *exporter_gpu_args(self.gpus), "--node", NODES[0],
            ],
        )  # fmt: skip
        self._start(
            "prometheus",
            [
                "prometheus",
                f"--config.file={self.paths['prometheus']}",
                f"--storage.tsdb.path={cfg.workdir / 'prometheus-data'}",
                f"--web.listen-address=127.0.0.1:{cfg.ports.prometheus}",
                "--enable-feature=exemplar-storage",
                "--web.enable-lifecycle",
            ],
        )
        self._start(
            "alertmanager",
            [
                "prometheus-alertmanager",
                f"--config.file={self.paths['alertmanager']}",
                f"--storage.path={cfg.workdir / 'alertmanager-data'}",
                f"--web.listen-address=127.0.0.1:{cfg.ports.alertmanager}",
                f"--cluster.listen-address=127.0.0.1:{cfg.ports.alertmanager_cluster}",
            ],
        )

    def training_env(self, job: TrainingJob, node: str) -> dict[str, str]:
        cfg = self.cfg
        env = {
            contract.ENV_JOB_ID: job.job_id,
            contract.ENV_NODE: node,
            # The demo's agents are torchrun on this host, even where this host is a pod or a
            # Slurm allocation that detection would name; the local executor acts on them.
            contract.ENV_SCHEDULER: contract.SCHEDULER_LOCAL,
            contract.ENV_FILE_SD_DIR: str(cfg.file_sd),
            contract.ENV_DUMP_DIR: str(cfg.dumps),
            contract.ENV_LOG_DIR: str(cfg.logs / "training"),
            contract.ENV_METRICS_PORT: str(job.metrics_port + (0 if node == NODES[0] else 10)),
            contract.ENV_METRICS_ADDR: "127.0.0.1",
            contract.ENV_REMEDIATION_URL: cfg.url("remediation"),
            contract.ENV_REMEDIATION_TOKEN: cfg.token_file.read_text().strip(),
            "TORCH_FR_BUFFER_SIZE": "2000",
            "OMP_NUM_THREADS": "1",
            # torch 2.13's shared rendezvous store cannot re-admit nodes (see README).
            "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1",
            "PYTHONUNBUFFERED": "1",
            **job.env,
        }
        if self.pace.hook_stall_floor_seconds is not None:
            env[contract.ENV_STALL_FLOOR] = str(self.pace.hook_stall_floor_seconds)
        return env

    def demo_job(self) -> TrainingJob:
        cfg = self.cfg
        return TrainingJob(
            job_id=DEMO_JOB_ID,
            checkpoint_dir=cfg.checkpoint_dir,
            faults=cfg.faults,
            steps=cfg.steps,
            step_seconds=cfg.step_seconds,
            rendezvous_port=cfg.ports.rendezvous,
            metrics_port=cfg.ports.metrics,
            spans_dir=cfg.spans_dir if cfg.spans else None,
            trainer_args=("--compute-share", str(cfg.compute_share)),
        )

    def start_training(self, job: TrainingJob | None = None) -> list[str]:
        """Two torchrun agents on this host, one per "node", c10d rendezvous, --nnodes 1:2;
        the demo's job unless ``job`` says otherwise. Returns the agents' process names."""
        job = job or self.demo_job()
        names = []
        for node in NODES:
            command = [
                sys.executable, "-m", "torch.distributed.run",
                "--nnodes", "1:2", "--nproc-per-node", "2",
                "--max-restarts", str(job.max_restarts),
                "--rdzv-backend", "c10d",
                "--rdzv-endpoint", f"127.0.0.1:{job.rendezvous_port}",
                "--rdzv-id", job.job_id,
                # The store runs on its own (start_services), so any node can be excluded.
                "--rdzv-conf", ",".join((
                    "last_call_timeout=3", "join_timeout=120", "is_host=0",
                    "keep_alive_interval=1", "keep_alive_max_attempt=5",
                )),
                "--monitor-interval", "0.5",
                "-m", "trainguard.demo.train",
                "--steps", str(job.steps),
                "--step-seconds", str(job.step_seconds),
                "--checkpoint-dir", str(job.checkpoint_dir),
                "--faults", job.faults,
                *job.trainer_args,
            ]  # fmt: skip
            if job.spans_dir is not None:
                command += ["--spans-dir", str(job.spans_dir)]
            name = job.process_name(node)
            self._start(name, command, self.training_env(job, node))
            names.append(name)
        return names

    def alive(self, name: str) -> bool:
        process = self.processes.get(name)
        return process is not None and process.poll() is None

    def failed_services(self) -> list[str]:
        """Services (not training agents, which may legitimately exit) that died."""
        return [
            name
            for name, process in list(self.processes.items())
            if not name.startswith("agent-") and process.poll() is not None
        ]

    def stop(self, grace_seconds: float = 10.0, names: Sequence[str] | None = None) -> None:
        """Terminate every process group we started (or those of ``names``); kill what has
        not exited in time."""
        # A copy: other threads may start processes meanwhile (the fault matrix runs jobs at once).
        chosen = [p for n, p in list(self.processes.items()) if names is None or n in names]
        for process in chosen:
            if process.poll() is None:
                _signal_group(process, signal.SIGTERM)
        deadline = time.monotonic() + grace_seconds
        for process in chosen:
            try:
                process.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                _signal_group(process, signal.SIGKILL)
                process.wait(5)
        for process in chosen:
            # Children that outlived their leader (torchrun workers) share its group.
            _signal_group(process, signal.SIGKILL)


def _signal_group(process: subprocess.Popen[bytes], signum: int) -> None:
    try:
        os.killpg(process.pid, signum)
    except (ProcessLookupError, PermissionError):
        return
