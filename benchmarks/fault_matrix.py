"""The fault-injection matrix: how often trainguard detects, names and repairs each failure.

Runs many short real jobs (the demo trainer under torchrun: 2 "nodes" x 2 gloo ranks) against
one real stack (Prometheus, Alertmanager, the remediation service and the exporter at the demo's
speed, :mod:`trainguard.demo.stack`), each with one fault of :data:`CATALOGUE` (every demo
fault kind registered in ``trainguard.demo.faults``, at each of its factors) on a random rank
at a random time, or none (healthy runs, +-10% compute jitter per rank and step, as many as the
faulty runs together). A run is seeded (``--seed``), so a matrix can be replayed.

For every run it records whether an alert of the fault's failure fired and how long after the
injection (Prometheus' ``ALERTS``, the rules' own verdict), every alert that fired (those of
another failure, and any in a healthy run, are false), the top cause and rank of
``trainguard diagnose`` over the run, the remediation service's action and verdict (recovered or
not, when). It writes ``runs.json`` (every run), ``table.md`` (per fault kind: detection rate,
p50/p95 time to detect, root-cause top-1 accuracy, recovery rate, p50/p95 time to recover; false
alerts per healthy hour) and ``detect.png`` (time to detect per kind) in ``--out``, and ends with

    runs=<n> detection=<x> root_cause=<y> recovery=<z> false_alerts=<k> p95_detect_s=<s>

``--quick`` runs each fault kind once and one healthy run (the test suite runs it).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import socket
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx

from trainguard import contract
from trainguard.contract import Action, Alert, Failure
from trainguard.demo.config import DemoConfig, Ports
from trainguard.demo.faults import FaultKind, FaultLedger, fault_kinds
from trainguard.demo.run import fetch_incidents, wait_ready
from trainguard.demo.stack import (
    DEMO_THRESHOLDS,
    Stack,
    TrainingJob,
    demo_policy,
    demo_thresholds,
    ensure_binaries,
)

JOB_PREFIX = "fm-"
STEP_SECONDS = 0.1
DATA_SECONDS = 0.01
JITTER = 0.1
# A fault fires this long after its job's first step (uniform, seeded): past the warm-up and
# with a full rate window of healthy steps behind it.
FAULT_AFTER = (12.0, 20.0)
# How long a healthy run trains; faulty runs train until their incident closes.
HEALTHY_SECONDS = 60.0
# After the fault: the longest a run waits for detection and the service's verdict.
RUN_DEADLINE_SECONDS = 150.0
# Jobs start at least this far apart.
START_SPACING_SECONDS = 8.0
# A run that has not started training by then failed to start.
START_DEADLINE_SECONDS = 90.0
# Each rank's memory capacity (the hook's TRAINGUARD_MEMORY_CAPACITY_BYTES): a demo rank holds
# some 300-400 MB, so a creeping one nears capacity within seconds.
RANK_MEMORY_CAPACITY = 1 << 30

# The matrix's alert settings on top of the demo's (see docs/fault-matrix.md for why).
THRESHOLDS: dict[str, Any] = {
    # 1.2x compute reads about 1.17x of the step compute (the fixed cost of a step is not
    # slowed), and the healthy jitter averages out over the rate window: 1.1 separates them.
    "straggler_factor": 1.1,
    "stalled_seconds": 15,
    "stalled_for": "0s",
    "oom_risk_predict_window": "20s",
    "oom_risk_predict_horizon_seconds": 120,
    "oom_risk_for": "0s",
    "dataloader_for": "20s",
}
# Seconds an alert waits by configuration from the fault to firing, per alert: the windows and
# `for` durations of THRESHOLDS/DEMO_THRESHOLDS; p95 time to detect is held to 2x this.
SCRAPE_AND_EVAL_SECONDS = 4.0
RESTART_SECONDS = 10.0
# The alerts the matrix policy repairs (the others only recommend, or nothing).
ACTED_ON = (
    Alert.TRAINING_STRAGGLER,
    Alert.TRAINING_COLLECTIVE_STALLED,
    Alert.TRAINING_NCCL_TIMEOUT,
    Alert.TRAINING_OOM,
    Alert.TRAINING_STALLED,
    Alert.TRAINING_RANK_DOWN,
    Alert.TRAINING_OOM_RISK,
)


def _seconds(duration: str | float | int) -> float:
    if isinstance(duration, (int, float)):
        return float(duration)
    units = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}
    for unit in ("ms", "s", "m", "h"):
        if duration.endswith(unit):
            return float(duration[: -len(unit)]) * units[unit]
    return float(duration)


def configured_delay(alert: Alert) -> float:
    """How long ``alert`` waits by configuration before it can fire, plus a scrape and an
    evaluation: the "configured threshold" the matrix holds p95 time to detect to (2x)."""
    t = {**DEMO_THRESHOLDS, **THRESHOLDS}
    by_alert = {
        Alert.TRAINING_STRAGGLER: _seconds(t["rate_window"]) + _seconds(t["straggler_for"]),
        Alert.TRAINING_COLLECTIVE_STALLED: _seconds(t["collective_stall_floor_seconds"])
        + _seconds(t["collective_stall_for"]),
        Alert.TRAINING_STALLED: _seconds(t["stalled_seconds"]) + _seconds(t["stalled_for"]),
        Alert.TRAINING_RANK_DOWN: _seconds(t["rank_down_for"]),
        # A restarted rank reports its new count once it has started again (imports, the
        # rendezvous, the process group): allow the demo's 10 s for that.
        Alert.TRAINING_RANK_RESTARTED: RESTART_SECONDS,
        Alert.TRAINING_OOM: 0.0,
        Alert.TRAINING_OOM_RISK: _seconds(t["oom_risk_predict_window"]) / 2
        + _seconds(t["oom_risk_for"]),
        Alert.TRAINING_NCCL_TIMEOUT: 0.0,
        Alert.TRAINING_DATALOADER_BOUND: _seconds(t["rate_window"]) + _seconds(t["dataloader_for"]),
    }
    return by_alert.get(alert, 0.0) + SCRAPE_AND_EVAL_SECONDS


@dataclass(frozen=True)
class FaultSpec:
    """One run kind of the matrix: a fault kind at one factor, and what should catch it."""

    name: str
    kind: FaultKind
    factor: float

    @property
    def failure(self) -> Failure:
        return self.kind.failure

    @property
    def alerts(self) -> tuple[Alert, ...]:
        return self.kind.alerts

    @property
    def threshold_s(self) -> float:
        return min(configured_delay(a) for a in self.alerts)


CATALOGUE: tuple[FaultSpec, ...] = tuple(
    FaultSpec(name, kind, factor) for kind in fault_kinds() for name, factor in kind.matrix_runs()
)
HEALTHY = "healthy"


def matrix_policy(cfg: DemoConfig) -> dict[str, Any]:
    """The demo's policy for every matrix job, plus repairs for the failures only it injects."""
    policy = demo_policy(cfg, jobs=f'{contract.LABEL_JOB_ID}=~"{JOB_PREFIX}.+"')
    matchers = policy["rules"][0]["matchers"]
    restart = {"action": Action.RESTART_FROM_CHECKPOINT.value}
    page = {"action": Action.PAGE.value}
    for alert in ACTED_ON[4:]:
        policy["rules"].append(
            {
                "alert": alert.value,
                "matchers": matchers,
                "actions": [restart],
                "verify_seconds": 60.0,
                "escalate": [page],
            }
        )
    return policy


@dataclass
class RunPlan:
    index: int
    fault: str  # a FaultSpec name, or HEALTHY
    rank: int
    at_s: float
    seed: int

    @property
    def job_id(self) -> str:
        return f"{JOB_PREFIX}{self.index:03d}-{self.fault.replace('.', '')}"


@dataclass
class RunResult:
    plan: RunPlan
    started: bool = False
    error: str | None = None
    injected_at: float | None = None
    trained_seconds: float = 0.0
    detected: bool = False
    detect_s: float | None = None
    alerts: dict[str, float] = field(default_factory=dict)  # name -> seconds from job start
    false_alerts: list[str] = field(default_factory=list)
    cause: str | None = None
    cause_rank: int | None = None
    diagnosis: list[str] = field(default_factory=list)  # its symptoms, most severe first
    root_cause_right: bool = False
    action: str | None = None
    outcome: str | None = None
    recover_s: float | None = None


def plan_runs(seed: int, repeats: int, healthy: int) -> list[RunPlan]:
    """Every fault kind ``repeats`` times and ``healthy`` healthy runs, shuffled, seeded."""
    rng = random.Random(seed)
    kinds = [spec.name for spec in CATALOGUE for _ in range(repeats)] + [HEALTHY] * healthy
    rng.shuffle(kinds)
    return [
        RunPlan(
            i, kind, rng.randrange(4), round(rng.uniform(*FAULT_AFTER), 1), rng.randrange(1 << 30)
        )
        for i, kind in enumerate(kinds)
    ]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


class Matrix:
    """Runs the plans on one stack, ``parallel`` jobs at a time."""

    def __init__(self, cfg: DemoConfig, stack: Stack) -> None:
        self.cfg = cfg
        self.stack = stack
        self.prometheus = cfg.url("prometheus")
        self._ports_lock = threading.Lock()
        self._next_metrics_port = 9500
        self._start_lock = threading.Lock()
        self._last_start = 0.0

    def job(self, plan: RunPlan) -> TrainingJob:
        spec = _spec(plan.fault)
        faults = "" if spec is None else f"{spec.kind.name}:rank={plan.rank},at={plan.at_s}s"
        if spec is not None and spec.kind.slows:
            faults += f",factor={spec.factor}"
        with self._ports_lock:
            metrics_port = self._next_metrics_port
            self._next_metrics_port += 20
        return TrainingJob(
            job_id=plan.job_id,
            checkpoint_dir=self.cfg.workdir / "jobs" / plan.job_id,
            faults=faults,
            steps=1_000_000,  # stopped by the matrix
            step_seconds=STEP_SECONDS,
            rendezvous_port=self.cfg.ports.rendezvous,
            metrics_port=metrics_port,
            trainer_args=(
                "--jitter",
                str(JITTER),
                "--seed",
                str(plan.seed),
                "--data-seconds",
                str(DATA_SECONDS),
            ),
            env={
                contract.ENV_MEMORY_CAPACITY: str(RANK_MEMORY_CAPACITY),
                contract.ENV_LOG_DIR: str(self.logs(plan)),
            },
        )

    def logs(self, plan: RunPlan) -> Path:
        """The job's own log folder (its ranks' ECS events)."""
        return self.cfg.logs / "training" / plan.job_id

    def run(self, plan: RunPlan) -> RunResult:
        result = RunResult(plan)
        job = self.job(plan)
        job.checkpoint_dir.mkdir(parents=True, exist_ok=True)
        with self._start_lock:
            # Jobs start a few seconds apart: four ranks importing torch at once take both cores.
            time.sleep(max(0.0, self._last_start + START_SPACING_SECONDS - time.time()))
            self._last_start = time.time()
        names = self.stack.start_training(job)
        started = time.time()
        try:
            self._follow(plan, job, result)
        except Exception as error:  # one broken run is recorded, the matrix goes on
            result.error = f"{type(error).__name__}: {error}"
        finally:
            self.stack.stop(names=names, grace_seconds=5)
            for target in self.cfg.file_sd.glob(f"{plan.job_id}-rank*.json"):
                target.unlink(missing_ok=True)
        try:
            self._score(plan, job, result, started)
        except Exception as error:
            result.error = result.error or f"scoring: {type(error).__name__}: {error}"
        return result

    def _follow(self, plan: RunPlan, job: TrainingJob, result: RunResult) -> None:
        spec = _spec(plan.fault)
        first_step = _wait(lambda: _first_step(job), START_DEADLINE_SECONDS)
        if first_step is None:
            result.error = "the job did not start training"
            return
        result.started = True
        if spec is None:
            time.sleep(max(0.0, first_step + HEALTHY_SECONDS - time.time()))
            result.trained_seconds = time.time() - first_step
            return
        ledger = FaultLedger(job.checkpoint_dir)
        fired = _wait(lambda: ledger.fired(spec.kind), plan.at_s + START_DEADLINE_SECONDS)
        if fired is None:
            result.error = "the fault did not fire"
            return
        result.injected_at = fired.at
        deadline = fired.at + RUN_DEADLINE_SECONDS
        while time.time() < deadline:
            time.sleep(2.0)
            incidents = [i for i in self._incidents(plan) if i.get("failure") == spec.failure]
            if any(i.get("state") == "closed" for i in incidents):
                break
            if not incidents and self._fired(plan, spec) and not _acts_on(spec):
                break
        result.trained_seconds = time.time() - first_step

    def _incidents(self, plan: RunPlan) -> list[dict[str, Any]]:
        try:
            return fetch_incidents(self.cfg, plan.job_id)
        except (httpx.HTTPError, OSError):
            return []

    def _fired(self, plan: RunPlan, spec: FaultSpec) -> bool:
        names = "|".join(a.value for a in spec.alerts)
        query = f'ALERTS{{alertstate="firing",alertname=~"{names}",job_id="{plan.job_id}"}}'
        data = httpx.get(f"{self.prometheus}/api/v1/query", params={"query": query}).json()
        return bool(data["data"]["result"])

    def _alerts_over(self, plan: RunPlan, start: float, end: float) -> dict[str, float]:
        """Each alert that fired for the job, with its first firing time (Unix seconds)."""
        response = httpx.get(
            f"{self.prometheus}/api/v1/query_range",
            params={
                "query": f'ALERTS{{alertstate="firing",job_id="{plan.job_id}"}}',
                "start": start,
                "end": end,
                "step": "1s",
            },
            timeout=30,
        )
        first: dict[str, float] = {}
        for series in response.json()["data"]["result"]:
            name = series["metric"]["alertname"]
            when = min(float(t) for t, _ in series["values"])
            first[name] = min(when, first.get(name, when))
        return first

    def _score(self, plan: RunPlan, job: TrainingJob, result: RunResult, started: float) -> None:
        from trainguard.diagnose import diagnose

        spec = _spec(plan.fault)
        end = time.time() + 6  # the last evaluations of the run
        time.sleep(6)
        alerts = self._alerts_over(plan, started, end)
        result.alerts = {name: round(t - started, 1) for name, t in alerts.items()}
        expected = {a.value for a in spec.alerts} if spec is not None else set()
        incidents = self._incidents(plan)
        acted = [_timestamp(i["acted_at"]) for i in incidents if i.get("acted_at")]
        # An alert that first fires after the service acted reports the repair (a restart is a
        # restart), not a failure the fault did not cause.
        repaired_at = min(acted, default=float("inf"))
        result.false_alerts = sorted(
            name for name, t in alerts.items() if name not in expected and t < repaired_at
        )
        if spec is not None and result.injected_at is not None:
            hits = [t for name, t in alerts.items() if name in expected]
            if hits:
                result.detected = True
                result.detect_s = round(min(hits) - result.injected_at, 1)
        try:
            report = diagnose(
                self.prometheus,
                plan.job_id,
                since_seconds=end - started + 10,
                until=end,
                dumps=self.cfg.dumps,
                # The ranks' events and the agents' output (which worker failed, its pid).
                logs=[
                    *map(str, sorted(self.logs(plan).glob("*.ndjson"))),
                    *map(str, sorted(self.cfg.logs.glob(f"agent-{plan.job_id}-*.log"))),
                ],
                sustain_seconds=10.0,
                min_step_seconds=2.0,
                incidents=incidents,
                thresholds=demo_thresholds(THRESHOLDS),
            )
            result.diagnosis = [
                f"{x.failure.value} (severity {x.severity}, ranks {x.ranks}): {x.summary}"
                for x in report.symptoms
            ]
            if report.failure is not None:
                result.cause = report.failure.value
                ranks = report.scope.ranks or report.symptoms[0].ranks
                result.cause_rank = ranks[0] if len(ranks) == 1 else None
        except Exception as error:
            result.cause = f"error: {type(error).__name__}: {error}"
        if spec is not None:
            result.root_cause_right = (
                result.cause == spec.failure.value and result.cause_rank == plan.rank
            )
            mine = [i for i in incidents if i.get("failure") == spec.failure.value]
            if mine and result.injected_at is not None:
                incident = min(mine, key=lambda i: i["detected_at"])
                result.outcome = incident.get("outcome")
                tried = incident.get("tried") or []
                result.action = tried[0].get("action") if tried else None
                if incident.get("recovered_at"):
                    result.recover_s = round(
                        _timestamp(incident["recovered_at"]) - result.injected_at, 1
                    )


def _timestamp(value: str) -> float:
    from datetime import datetime

    return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()


def _acts_on(spec: FaultSpec) -> bool:
    """Whether the matrix policy repairs this fault (else its run ends once it is detected)."""
    return any(alert in ACTED_ON for alert in spec.alerts)


def _spec(name: str) -> FaultSpec | None:
    return next((s for s in CATALOGUE if s.name == name), None)


def _first_step(job: TrainingJob) -> float | None:
    path = job.checkpoint_dir / "events.jsonl"
    if not path.exists():
        return None
    for line in path.read_text().splitlines():
        if '"step"' in line:
            try:
                event = json.loads(line)
            except json.JSONDecodeError:
                continue
            if event.get("event") == "step":
                return float(event["t"])
    return None


def _wait(probe: Any, timeout: float) -> Any:
    deadline = time.time() + timeout
    while time.time() < deadline:
        value = probe()
        if value is not None:
            return value
        time.sleep(1.0)
    return None


def _percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


@dataclass
class KindRow:
    kind: str
    runs: int
    detection: float
    p50_detect_s: float | None
    p95_detect_s: float | None
    threshold_s: float
    root_cause: float
    acted: int
    recovery: float | None
    p50_recover_s: float | None
    p95_recover_s: float | None
    false_alerts: int


def summarize(results: list[RunResult]) -> tuple[list[KindRow], dict[str, Any]]:
    rows = []
    for spec in CATALOGUE:
        mine = [r for r in results if r.plan.fault == spec.name]
        if not mine:
            continue
        detects = [r.detect_s for r in mine if r.detect_s is not None]
        acted = [r for r in mine if r.action is not None]
        recovered = [r for r in acted if r.outcome == "recovered"]
        recovers = [r.recover_s for r in recovered if r.recover_s is not None]
        rows.append(
            KindRow(
                kind=spec.name,
                runs=len(mine),
                detection=sum(r.detected for r in mine) / len(mine),
                p50_detect_s=_percentile(detects, 0.5),
                p95_detect_s=_percentile(detects, 0.95),
                threshold_s=spec.threshold_s,
                root_cause=sum(r.root_cause_right for r in mine) / len(mine),
                acted=len(acted),
                recovery=len(recovered) / len(acted) if acted else None,
                p50_recover_s=_percentile(recovers, 0.5),
                p95_recover_s=_percentile(recovers, 0.95),
                false_alerts=sum(len(r.false_alerts) for r in mine),
            )
        )
    faulty = [r for r in results if r.plan.fault != HEALTHY]
    healthy = [r for r in results if r.plan.fault == HEALTHY]
    healthy_hours = sum(r.trained_seconds for r in healthy) / 3600
    healthy_false = sum(len(r.false_alerts) for r in healthy)
    acted = [r for r in faulty if r.action is not None]
    detects = [r.detect_s for r in faulty if r.detect_s is not None]
    totals = {
        "runs": len(results),
        "faulty": len(faulty),
        "healthy": len(healthy),
        "detection": sum(r.detected for r in faulty) / len(faulty) if faulty else None,
        "root_cause": sum(r.root_cause_right for r in faulty) / len(faulty) if faulty else None,
        "recovery": sum(r.outcome == "recovered" for r in acted) / len(acted) if acted else None,
        "false_alerts": healthy_false,
        "false_alerts_per_healthy_hour": healthy_false / healthy_hours if healthy_hours else None,
        "healthy_hours": round(healthy_hours, 3),
        "p95_detect_s": _percentile(detects, 0.95),
        "errors": sum(r.error is not None for r in results),
    }
    return rows, totals


def table(rows: list[KindRow], totals: dict[str, Any]) -> str:
    def pct(value: float | None) -> str:
        return "-" if value is None else f"{100 * value:.0f}%"

    def sec(value: float | None) -> str:
        return "-" if value is None else f"{value:.1f}"

    lines = [
        "| fault | runs | detected | p50 / p95 detect (s) | 2x threshold (s) | root cause top-1 "
        "| acted | recovered | p50 / p95 recover (s) | false alerts |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        lines.append(
            f"| {row.kind} | {row.runs} | {pct(row.detection)} | {sec(row.p50_detect_s)} / "
            f"{sec(row.p95_detect_s)} | {2 * row.threshold_s:.0f} | {pct(row.root_cause)} | "
            f"{row.acted} | {pct(row.recovery)} | {sec(row.p50_recover_s)} / "
            f"{sec(row.p95_recover_s)} | {row.false_alerts} |"
        )
    per_hour = totals["false_alerts_per_healthy_hour"]
    lines += [
        "",
        f"Healthy runs: {totals['healthy']} ({totals['healthy_hours']:.2f} h of training), "
        f"{totals['false_alerts']} false alert(s)"
        + ("" if per_hour is None else f", {per_hour:.2f} per healthy hour")
        + f"; runs that broke: {totals['errors']}.",
    ]
    if "minutes" in totals:
        low, high = totals["load_average"]
        lines[-1] += f" {totals['minutes']} min, load average {low:.1f}-{high:.1f}."
    return "\n".join(lines) + "\n"


def plot(results: list[RunResult], path: Path) -> Path | None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    names = [s.name for s in CATALOGUE if any(r.plan.fault == s.name for r in results)]
    fig, ax = plt.subplots(figsize=(10, 4.5))
    for x, name in enumerate(names):
        values = [r.detect_s for r in results if r.plan.fault == name and r.detect_s is not None]
        ax.scatter([x] * len(values), values, s=18, color="tab:blue")
        spec = _spec(name)
        if spec is not None:
            ax.hlines(2 * spec.threshold_s, x - 0.35, x + 0.35, color="tab:red")
    ax.set_xticks(range(len(names)), names, rotation=30, ha="right")
    ax.set_ylabel("time to detect (s)")
    ax.set_title("time to detect per fault kind (red: 2x the alert's configured delay)")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="each fault kind once, one healthy")
    parser.add_argument("--repeats", type=int, default=3, help="runs of each fault kind")
    parser.add_argument("--healthy", type=int, help="healthy runs (default: the faulty count)")
    parser.add_argument("--parallel", type=int, default=4, help="jobs at a time")
    parser.add_argument("--seed", type=int, default=20261205)
    parser.add_argument("--only", help="comma-separated fault kinds (and/or healthy)")
    parser.add_argument("--out", type=Path, default=Path("build/fault-matrix"))
    return parser.parse_args(argv)


def run_matrix(args: argparse.Namespace) -> tuple[list[RunResult], dict[str, Any]]:
    repeats = 1 if args.quick else args.repeats
    faulty = repeats * len(CATALOGUE)
    healthy = args.healthy if args.healthy is not None else (1 if args.quick else faulty)
    plans = plan_runs(args.seed, repeats, healthy)
    if args.only:
        chosen = set(args.only.split(","))
        plans = [p for p in plans if p.fault in chosen]
    ensure_binaries()
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    # Every matrix starts from empty stores: no series, alerts or incidents of an earlier one.
    shutil.rmtree(out / "work", ignore_errors=True)
    cfg = DemoConfig(workdir=out / "work", ports=_free_ports(), spans=False)
    results: list[RunResult] = []
    loads: list[float] = []  # the 1-minute load average as each run ended (a shared machine)
    started = time.time()
    with Stack(cfg) as stack:
        stack.start_services(THRESHOLDS, matrix_policy(cfg))
        wait_ready(cfg)
        matrix = Matrix(cfg, stack)
        print(f"fault matrix: {len(plans)} runs, {args.parallel} at a time, seed {args.seed}")
        with ThreadPoolExecutor(max_workers=args.parallel) as pool:
            for result in pool.map(matrix.run, plans):
                results.append(result)
                loads.append(os.getloadavg()[0])
                _progress(result, len(results), len(plans), started)
    rows, totals = summarize(results)
    (out / "runs.json").write_text(
        json.dumps(
            {"seed": args.seed, "runs": [asdict(r) for r in results], "totals": totals}, indent=1
        )
    )
    text = table(rows, totals)
    (out / "table.md").write_text(text)
    plot(results, out / "detect.png")
    print(text, flush=True)
    return results, totals


def _free_ports() -> Ports:
    return Ports(
        prometheus=free_port(),
        alertmanager=free_port(),
        alertmanager_cluster=free_port(),
        remediation=free_port(),
        exporter=free_port(),
        rendezvous=free_port(),
        metrics=9400,
    )


def _progress(result: RunResult, done: int, total: int, started: float) -> None:
    detect = "-" if result.detect_s is None else f"{result.detect_s:.1f}s"
    print(
        f"[{done}/{total} {time.time() - started:5.0f}s] {result.plan.job_id} "
        f"rank {result.plan.rank}: "
        f"detected {detect}, cause {result.cause}@{result.cause_rank}, action {result.action}, "
        f"outcome {result.outcome}, false {result.false_alerts or '-'}"
        + (f", error {result.error}" if result.error else ""),
        flush=True,
    )


def last_line(totals: dict[str, Any]) -> str:
    def num(value: float | None) -> str:
        return "nan" if value is None else f"{value:.4f}"

    p95 = totals["p95_detect_s"]
    p95_text = "nan" if p95 is None else f"{p95:.1f}"
    return (
        f"runs={totals['runs']} detection={num(totals['detection'])} "
        f"root_cause={num(totals['root_cause'])} recovery={num(totals['recovery'])} "
        f"false_alerts={totals['false_alerts']} p95_detect_s={p95_text}"
    )


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    _, totals = run_matrix(args)
    print(last_line(totals), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
