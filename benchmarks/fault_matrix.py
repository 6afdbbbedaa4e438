"""The fault-injection matrix: how often trainguard detects, names and repairs each failure.

Runs many short real jobs (the demo trainer under torchrun: 2 "nodes" x 2 gloo ranks) against
one real stack (Prometheus, Alertmanager, the remediation service and the exporter,
:mod:`trainguard.demo.stack`), each with one fault of ``fault_matrix_plan.CATALOGUE`` (every
demo fault kind registered in ``trainguard.demo.faults``, at each of its factors) on a random
rank at a random time, or none (healthy runs, as many as the faulty runs together). A run is
seeded (``--seed``), so a matrix can be replayed.

``--defaults`` picks the settings (``fault_matrix_plan.Settings``): ``shipped`` (scored: the
shipped thresholds, default policy, ``deploy/prometheus.yml``'s intervals, the hook's and the
service's defaults, the whole noise model in every run) or ``fast`` (the demo's pace with the
matrix's thresholds and policy: the quick matrix of the test suite).

For every run it records whether an alert of the fault's failure fired after the injection,
naming the faulty rank, and how long after (Prometheus' ``ALERTS``, the rules' own verdict),
every alert the fault does not explain (false), the top cause and rank of
``trainguard diagnose`` over the run, the remediation service's action and verdict (recovered or
not, when). It writes ``runs.json`` (every run), ``table.md`` (per fault kind: detection rate,
p50/p95 time to detect against its bound, root-cause top-1 accuracy, recovery rate, p50/p95
time to recover; false alerts per 1,000 rank-hours) and ``detect.png`` (time to detect per
kind) in ``--out``, and ends with

    runs=<n> detection=<x> root_cause=<y> recovery=<z> false_alerts=<k> p95_detect_s=<s> \
defaults=<shipped|fast>

``--quick`` runs each fault kind once, the drill's three times, and one healthy run.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import asdict
from pathlib import Path
from typing import Any

import httpx

from benchmarks.fault_matrix_plan import (
    CATALOGUE,
    COMPUTE_SHARE,
    DATA_SECONDS,
    DRILL_KINDS,
    FAST,
    QUICK_DRILL_RUNS,
    RANK_MEMORY_CAPACITY,
    SHIPPED,
    START_DEADLINE_SECONDS,
    START_SPACING_SECONDS,
    STEP_SECONDS,
    FaultSpec,
    FiredAlert,
    RunPlan,
    RunResult,
    Settings,
    judge,
    plan_runs,
    settings_named,
    spec_named,
)
from benchmarks.fault_matrix_report import (
    escalations_line,
    last_line,
    plot,
    summarize,
    table,
)
from benchmarks.harness.processes import free_port
from trainguard import contract
from trainguard.demo.config import DemoConfig, Ports
from trainguard.demo.faults import FaultLedger
from trainguard.demo.run import fetch_incidents, wait_ready
from trainguard.demo.stack import (
    Stack,
    TrainingJob,
    ensure_binaries,
)


class Matrix:
    """Runs the plans on one stack, ``parallel`` jobs at a time."""

    def __init__(self, cfg: DemoConfig, stack: Stack, settings: Settings) -> None:
        self.cfg = cfg
        self.stack = stack
        self.settings = settings
        # Read once: what the rules were rendered from is what diagnose judges by, even if the
        # thresholds file changes while the matrix runs.
        self.thresholds = settings.rule_thresholds
        self.prometheus = cfg.url("prometheus")
        self._ports_lock = threading.Lock()
        self._next_metrics_port = 9500
        self._start_lock = threading.Lock()
        self._last_start = 0.0

    def job(self, plan: RunPlan) -> TrainingJob:
        spec = spec_named(plan.fault)
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
                "--noise",
                self.settings.noise,
                "--compute-share",
                str(COMPUTE_SHARE),
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
        spec = spec_named(plan.fault)
        first_step = _wait(lambda: _first_step(job), START_DEADLINE_SECONDS)
        if first_step is None:
            result.error = "the job did not start training"
            return
        result.started = True
        if spec is None:
            time.sleep(max(0.0, first_step + self.settings.healthy_seconds - time.time()))
            result.trained_seconds = time.time() - first_step
            return
        ledger = FaultLedger(job.checkpoint_dir)
        fired = _wait(lambda: ledger.fired(spec.kind), plan.at_s + START_DEADLINE_SECONDS)
        if fired is None:
            result.error = "the fault did not fire"
            return
        result.injected_at = fired.at
        result.injected_node = fired.node
        deadline = fired.at + self.settings.run_deadline_seconds
        while time.time() < deadline:
            time.sleep(2.0)
            incidents = [i for i in self._incidents(plan) if i.get("failure") == spec.failure]
            if any(i.get("state") == "closed" for i in incidents):
                break
            if not incidents and self._fired(plan, spec) and not self.settings.acts_on(spec):
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

    def _alerts_over(self, plan: RunPlan, start: float, end: float) -> list[FiredAlert]:
        """Each alert series that fired for the job, with where it points and its first firing
        time (Unix seconds)."""
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
        fired: list[FiredAlert] = []
        for series in response.json()["data"]["result"]:
            labels = series["metric"]
            rank = labels.get(contract.LABEL_RANK)
            fired.append(
                FiredAlert(
                    labels["alertname"],
                    min(float(t) for t, _ in series["values"]),
                    rank=None if rank is None else int(rank),
                    node=labels.get(contract.LABEL_NODE),
                )
            )
        return fired

    def _score(self, plan: RunPlan, job: TrainingJob, result: RunResult, started: float) -> None:
        from trainguard.diagnose import diagnose

        spec = spec_named(plan.fault)
        end = time.time() + 6  # the last evaluations of the run
        time.sleep(6)
        alerts = self._alerts_over(plan, started, end)
        result.alerts = {str(alert): round(alert.first - started, 1) for alert in alerts}
        incidents = self._incidents(plan)
        result.escalations = sum(int(i.get("rung") or 0) for i in incidents)
        result.pages = sum(bool(i.get("paged")) for i in incidents)
        acted = [_timestamp(i["acted_at"]) for i in incidents if i.get("acted_at")]
        injected = None
        if result.injected_at is not None and result.injected_node is not None:
            injected = (result.injected_at, plan.rank, result.injected_node)
        verdict = judge(spec, injected, alerts, min(acted, default=None))
        result.false_alerts = sorted(str(alert) for alert in verdict.false_alerts)
        if verdict.detect_at is not None and result.injected_at is not None:
            result.detected = True
            result.detect_s = round(verdict.detect_at - result.injected_at, 1)
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
                sustain_seconds=self.settings.diagnose_sustain_seconds,
                min_step_seconds=self.settings.pace.rank_scrape_seconds,
                incidents=incidents,
                thresholds=self.thresholds,
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


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--quick",
        action="store_true",
        help=f"each fault kind once ({QUICK_DRILL_RUNS} times the drill's: "
        f"{', '.join(DRILL_KINDS)}), one healthy",
    )
    parser.add_argument(
        "--defaults",
        choices=(SHIPPED, FAST),
        default=SHIPPED,
        help="the settings to run at: the shipped thresholds, policy and intervals (scored), or "
        "the demo's fast ones (the quick matrix of the test suite)",
    )
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
    more = {kind: QUICK_DRILL_RUNS - 1 for kind in DRILL_KINDS} if args.quick else None
    plans = plan_runs(args.seed, repeats, healthy, more)
    if args.only:
        chosen = set(args.only.split(","))
        plans = [p for p in plans if p.fault in chosen]
    settings = settings_named(args.defaults)
    ensure_binaries()
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    # Every matrix starts from empty stores: no series, alerts or incidents of an earlier one.
    shutil.rmtree(out / "work", ignore_errors=True)
    cfg = DemoConfig(workdir=out / "work", ports=_free_ports(), spans=False)
    results: list[RunResult] = []
    loads: list[float] = []  # the 1-minute load average as each run ended (a shared machine)
    started = time.time()
    with Stack(cfg, settings.pace) as stack:
        stack.start_services(settings.thresholds, settings.policy(cfg))
        wait_ready(cfg)
        matrix = Matrix(cfg, stack, settings)
        print(
            f"fault matrix: {len(plans)} runs, {args.parallel} at a time, seed {args.seed}, "
            f"{settings.name} defaults"
        )
        with ThreadPoolExecutor(max_workers=args.parallel) as pool:
            # Progress as each run ends, not in plan order (a long run would hide the others).
            for future in as_completed([pool.submit(matrix.run, plan) for plan in plans]):
                result = future.result()
                results.append(result)
                loads.append(os.getloadavg()[0])
                _progress(result, len(results), len(plans), started)
    results.sort(key=lambda r: r.plan.index)
    rows, totals = summarize(results, settings)
    totals["minutes"] = round((time.time() - started) / 60, 1)
    totals["load_average"] = (min(loads, default=0.0), max(loads, default=0.0))
    (out / "runs.json").write_text(
        json.dumps(
            {"seed": args.seed, "runs": [asdict(r) for r in results], "totals": totals}, indent=1
        )
    )
    text = table(rows, totals)
    (out / "table.md").write_text(text)
    plot(results, out / "detect.png", settings)
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
        f"outcome {result.outcome}, escalations {result.escalations}, pages {result.pages}, "
        f"false {result.false_alerts or '-'}" + (f", error {result.error}" if result.error else ""),
        flush=True,
    )


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    _, totals = run_matrix(args)
    print(escalations_line(totals), flush=True)
    print(last_line(totals), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
