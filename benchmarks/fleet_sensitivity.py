"""The straggler detector's operating curve: detection rate and time to detect per slowdown, and
the false alerts of healthy jobs under the same noise, through the real Prometheus and rules.

One process serves many simulated jobs (``benchmarks/fleet.py``, each job its own ``Fleet`` of
``--ranks-per-job`` ranks on nodes of its own, one captured exposition for all): for each factor
of ``--factors``, ``--jobs-per-factor`` jobs each get one rank (seeded, never the noise model's
persistently slower rank) whose compute slows by that factor, and ``--healthy-jobs`` jobs stay
healthy. Every job's compute carries the healthy noise model (``--noise``, each job its own seed;
by default a noisy neighbour on each job's second node). The slowdowns start spread over one
minute after ``--warmup`` (so they fall on every phase of the rules' evaluation), then the run
goes on for ``--horizon`` minutes. Prometheus runs with the shipped
``deploy/prometheus.yml`` intervals and the shipped rules, every ``for`` as shipped.

A slowdown is detected when ``TrainingStraggler`` fires for its job naming the slowed rank after
it started; its time to detect is from the start to the rule evaluation that first wrote the
series as firing (its first ``ALERTS{alertstate="firing"}`` sample, read once the run ends, as the
fault matrix reads its runs: the moment Prometheus sends it to Alertmanager, not a later poll).
Every other alert series that fires is false: in a slowed job anything but that one, in a healthy
job anything. It writes ``sensitivity.json`` and ``sensitivity.png``
(detection rate and p50/p95 time to detect by factor) into ``--out``, prints the table, and ends
with one line per factor and the healthy jobs' line::

    factor=<f> jobs=<n> detection=<x> p50_detect_s=<s> p95_detect_s=<s>
    healthy_rank_hours=<h> false_alerts=<k> false_alerts_per_1000_rank_hours=<r>

    .venv/bin/python -m benchmarks.fleet_sensitivity --jobs-per-factor 25 --horizon 20

``--merge A/sensitivity.json B/sensitivity.json --out C`` runs nothing and pools earlier runs (a
few factors each, at 200 jobs per factor) into one table and plot.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import shutil
import socket
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from benchmarks.fleet import Fleet, Workload
from benchmarks.fleet_template import GPUS_PER_NODE, Template, capture
from benchmarks.harness.processes import Children, RunError, wait_for
from benchmarks.harness.prometheus import Api
from benchmarks.harness.stats import percentile
from benchmarks.scale import stopping
from benchmarks.scale_config import start_watched_prometheus, wait_all_up
from trainguard import contract
from trainguard.demo.noise import Noise

FACTORS = (1.05, 1.1, 1.15, 1.2, 1.3, 1.5, 2.0)
POLL_SECONDS = 5.0
STRAGGLER = contract.Alert.TRAINING_STRAGGLER.value


def log(message: str) -> None:
    print(f"[fleet-sensitivity {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


@dataclass
class JobPlan:
    """One simulated job: its id, the rank slowed and by how much (factor 1: healthy), and when
    its slowdown starts, in seconds after the warm-up."""

    job_id: str
    factor: float
    slow_rank: int
    start_after_s: float
    seed: int


@dataclass
class JobResult:
    plan: JobPlan
    started_at: float | None = None
    detect_s: float | None = None
    false_alerts: list[str] = field(default_factory=list)


def plan_jobs(
    factors: list[float], per_factor: int, healthy: int, ranks: int, seed: int, noise: Noise
) -> list[JobPlan]:
    """Every factor ``per_factor`` times and ``healthy`` healthy jobs, seeded: the slowed rank
    is any rank but the noise model's skewed one, the start uniform over a minute."""
    rng = random.Random(seed)
    candidates = [r for r in range(ranks) if r != noise.skewed_rank]
    factored = [f for f in factors for _ in range(per_factor)] + [1.0] * healthy
    return [
        JobPlan(
            f"sens-{i:04d}",
            factor,
            rng.choice(candidates),
            round(rng.uniform(0.0, 60.0), 1),
            rng.randrange(1 << 30),
        )
        for i, factor in enumerate(factored)
    ]


@dataclass
class Jobs:
    """The served fleets, one per job, at ``/jobs/<i>/ranks/<r>/metrics``. The server's thread
    renders while the watch starts slowdowns: one lock keeps a fleet whole for either."""

    fleets: list[Fleet]
    plans: list[JobPlan]
    lock: threading.Lock = field(default_factory=threading.Lock)

    def start(self, job: int, now: float) -> float:
        with self.lock:
            return self.fleets[job].start_faults(now, hang=False)

    def app(self) -> Starlette:
        async def metrics(request: Request) -> Response:
            job, rank = int(request.path_params["job"]), int(request.path_params["rank"])
            if not 0 <= job < len(self.fleets) or not 0 <= rank < self.fleets[job].ranks:
                return Response("no such rank\n", status_code=404, media_type="text/plain")
            fleet = self.fleets[job]
            with self.lock:
                body = fleet.render(rank, time.time())
            return Response(body, headers={"content-type": fleet.template.content_type})

        async def status(request: Request) -> JSONResponse:
            return JSONResponse({"jobs": len(self.fleets), "steps": self.fleets[0].steps})

        routes = [
            Route("/jobs/{job:int}/ranks/{rank:int}/metrics", metrics),
            Route("/status", status),
        ]
        return Starlette(routes=routes)

    def file_sd(self, address: str) -> list[dict[str, Any]]:
        return [
            target
            for i, fleet in enumerate(self.fleets)
            for target in fleet.file_sd(address, path_prefix=f"/jobs/{i}")
        ]


def build_jobs(args: argparse.Namespace, template: Template, noise: Noise) -> Jobs:
    plans = plan_jobs(
        args.factors, args.jobs_per_factor, args.healthy_jobs, args.ranks_per_job, args.seed, noise
    )
    nodes_per_job = -(-args.ranks_per_job // GPUS_PER_NODE)
    fleets = []
    for i, plan in enumerate(plans):
        first_node = i * nodes_per_job
        # The neighbour of each job's second node (its first when it has one).
        neighbour = f"node-{first_node + min(1, nodes_per_job - 1):04d}"
        job_noise = Noise.parse(args.noise.replace("{neighbour}", neighbour), seed=plan.seed)
        hung = next(r for r in range(args.ranks_per_job) if r != plan.slow_rank)
        fleets.append(
            Fleet(
                template,
                args.ranks_per_job,
                plan.job_id,
                slow_rank=plan.slow_rank,
                hung_rank=hung,  # never hung: the slowdowns start without a hang
                workload=Workload(step_seconds=args.step_seconds, slow_factor=plan.factor),
                seed=plan.seed,
                noise=job_noise,
                first_node=first_node,
            )
        )
    return Jobs(fleets, plans)


def first_firing(samples: list[dict[str, Any]]) -> dict[tuple[str, str, str], float]:
    """(alert, job, rank) -> the first evaluation (Unix seconds) that wrote it firing, from the
    raw samples of ``ALERTS{alertstate="firing"}[range]``."""
    fired: dict[tuple[str, str, str], float] = {}
    for series in samples:
        labels = series["metric"]
        key = (
            labels.get(contract.LABEL_ALERTNAME, ""),
            labels.get(contract.LABEL_JOB_ID, ""),
            labels.get(contract.LABEL_RANK, ""),
        )
        first = min(float(at) for at, _value in series["values"])
        fired[key] = min(first, fired.get(key, first))
    return fired


def judge(
    plans: list[JobPlan], started: dict[str, float], fired: dict[tuple[str, str, str], float]
) -> list[JobResult]:
    """Each job's verdict from the alert series that fired ((alert, job, rank) -> first firing
    evaluation) and when its slowdown started."""
    results = {plan.job_id: JobResult(plan, started.get(plan.job_id)) for plan in plans}
    for (name, job_id, rank), first in sorted(fired.items(), key=lambda item: item[1]):
        result = results.get(job_id)
        if result is None:
            continue
        plan, start = result.plan, result.started_at
        slowed = name == STRAGGLER and rank == str(plan.slow_rank) and plan.factor != 1.0
        if slowed and start is not None and first >= start:
            if result.detect_s is None:
                result.detect_s = round(first - start, 1)
        else:
            result.false_alerts.append(f"{name} rank {rank or '-'}")
    return list(results.values())


def summarize(
    results: list[JobResult], factors: list[float], healthy_rank_hours: float
) -> dict[str, Any]:
    rows = []
    for factor in factors:
        mine = [r for r in results if r.plan.factor == factor]
        detects = [r.detect_s for r in mine if r.detect_s is not None]
        rows.append(
            {
                "factor": factor,
                "jobs": len(mine),
                "detection": len(detects) / len(mine) if mine else None,
                "p50_detect_s": percentile(detects, 0.5),
                "p95_detect_s": percentile(detects, 0.95),
                "false_alerts": sum(len(r.false_alerts) for r in mine),
            }
        )
    healthy = [r for r in results if r.plan.factor == 1.0]
    false_alerts = sum(len(r.false_alerts) for r in healthy)
    return {
        "rows": rows,
        "healthy_rank_hours": healthy_rank_hours,
        "false_alerts": false_alerts,
        "false_alerts_per_1000_rank_hours": 1000 * false_alerts / healthy_rank_hours
        if healthy_rank_hours
        else None,
    }


def merge(summaries: list[dict[str, Any]]) -> dict[str, Any]:
    """One summary of several runs' (``sensitivity.json``): their jobs pooled, the factors of
    all, the healthy rank-hours added up, the shortest horizon. Runs of a few factors each fit
    a machine that one run of every factor at 200 jobs would not."""
    results = [
        JobResult(JobPlan(**r["plan"]), r["started_at"], r["detect_s"], list(r["false_alerts"]))
        for summary in summaries
        for r in summary["results"]
    ]
    factors = sorted({r.plan.factor for r in results} - {1.0})
    pooled = summarize(results, factors, sum(s["healthy_rank_hours"] for s in summaries))
    pooled["results"] = [asdict(r) for r in results]
    pooled["horizon_s"] = min(s["horizon_s"] for s in summaries)
    return pooled


def lines(summary: dict[str, Any]) -> list[str]:
    def num(value: float | None, digits: int) -> str:
        return "nan" if value is None else f"{value:.{digits}f}"

    out = [
        f"factor={row['factor']:g} jobs={row['jobs']} detection={num(row['detection'], 4)} "
        f"p50_detect_s={num(row['p50_detect_s'], 1)} p95_detect_s={num(row['p95_detect_s'], 1)}"
        for row in summary["rows"]
    ]
    out.append(
        f"healthy_rank_hours={summary['healthy_rank_hours']:.2f} "
        f"false_alerts={summary['false_alerts']} "
        f"false_alerts_per_1000_rank_hours={num(summary['false_alerts_per_1000_rank_hours'], 2)}"
    )
    return out


def plot(summary: dict[str, Any], horizon_s: float, path: Path) -> Path | None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    rows = summary["rows"]
    factors = [row["factor"] for row in rows]
    fig, (rate, delay) = plt.subplots(1, 2, figsize=(10, 4))
    rate.plot(factors, [100 * (row["detection"] or 0) for row in rows], marker="o")
    rate.set_xlabel("slowdown of one rank (x)")
    rate.set_ylabel(f"detected within {horizon_s / 60:g} min (%)")
    rate.set_ylim(-5, 105)
    for key, label in (("p50_detect_s", "p50"), ("p95_detect_s", "p95")):
        points = [(row["factor"], row[key]) for row in rows if row[key] is not None]
        if points:
            delay.plot(*zip(*points, strict=True), marker="o", label=label)
    delay.set_xlabel("slowdown of one rank (x)")
    delay.set_ylabel("time to detect (s)")
    if delay.lines:
        delay.legend()
    per_1000 = summary["false_alerts_per_1000_rank_hours"]
    fig.suptitle(
        "TrainingStraggler at the shipped defaults, simulated jobs with the noise model\n"
        "healthy jobs: "
        + ("-" if per_1000 is None else f"{per_1000:.2f} false alerts per 1,000 rank-hours"),
        fontsize=10,
    )
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


def run(args: argparse.Namespace, children: Children, stop: threading.Event) -> dict[str, Any]:
    noise = Noise.parse(args.noise.replace("{neighbour}", "node-0001"), seed=args.seed)
    log("capturing a rank's exposition")
    captured = capture(args.ranks_per_job, "capture")
    jobs = build_jobs(args, Template(captured.exposition, captured.content_type), noise)
    ranks = sum(fleet.ranks for fleet in jobs.fleets)
    work = Path(tempfile.mkdtemp(prefix="fleet-sensitivity-", dir=args.workdir))
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    address = f"127.0.0.1:{sock.getsockname()[1]}"
    targets = work / "targets.json"
    targets.write_text(json.dumps(jobs.file_sd(address)))
    server = uvicorn.Server(
        uvicorn.Config(jobs.app(), log_level="warning", access_log=False, backlog=4096)
    )
    serving = threading.Thread(
        target=lambda: asyncio.run(server.serve(sockets=[sock])), name="fleet", daemon=True
    )
    serving.start()
    try:
        prometheus, prom_address = start_watched_prometheus(
            children, work, targets, args.scrape_interval, args.eval_interval
        )
        with Api(prom_address) as api:
            return _watch(args, api, jobs, ranks, prometheus, stop)
    finally:
        server.should_exit = True
        serving.join(timeout=10)
        children.stop()
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)


def _watch(
    args: argparse.Namespace,
    api: Api,
    jobs: Jobs,
    ranks: int,
    prometheus: Any,
    stop: threading.Event,
) -> dict[str, Any]:
    wait_for("prometheus ready", api.ready, 120, prometheus)
    wait_all_up(api, ranks, 600, prometheus)
    log(f"{len(jobs.fleets)} jobs, {ranks} ranks up; warming up {args.warmup:g} s")
    began = time.time()
    warm_until = began + args.warmup
    end = warm_until + 60.0 + 60 * args.horizon
    started: dict[str, float] = {}
    next_report = began + 60.0
    while (now := time.time()) < end:
        for i, plan in enumerate(jobs.plans):
            due = now >= warm_until + plan.start_after_s
            if plan.factor != 1.0 and plan.job_id not in started and due:
                started[plan.job_id] = jobs.start(i, now)
        if now >= next_report:
            next_report += 60.0
            detected = api.scalar(
                f"count(count by ({contract.LABEL_JOB_ID}) ({contract.ALERTS_SERIES}{{"
                f'{contract.LABEL_ALERTNAME}="{STRAGGLER}",'
                f'{contract.LABEL_ALERTSTATE}="{contract.ALERTSTATE_FIRING}"}}))'
            )
            log(
                f"{(now - began) / 60:4.1f} of {(end - began) / 60:.1f} min: "
                f"{len(started)} slowed, {int(detected or 0)} job(s) with a straggler alert firing"
            )
        if stop.wait(POLL_SECONDS):
            raise RunError("stopped")
    # The last evaluations of the run are in before the series are read.
    time.sleep(2 * POLL_SECONDS)
    fired = first_firing(
        api.samples(
            f'{contract.ALERTS_SERIES}{{{contract.LABEL_ALERTSTATE}="{contract.ALERTSTATE_FIRING}"}}',
            time.time() - began,
        )
    )
    results = judge(jobs.plans, started, fired)
    healthy_jobs = sum(1 for plan in jobs.plans if plan.factor == 1.0)
    rank_hours = healthy_jobs * args.ranks_per_job * (end - began) / 3600
    summary = summarize(results, args.factors, rank_hours)
    summary["results"] = [asdict(r) for r in results]
    summary["horizon_s"] = 60 * args.horizon
    return summary


def _factors(text: str) -> list[float]:
    try:
        factors = [float(part) for part in text.split(",") if part.strip()]
    except ValueError as error:
        raise argparse.ArgumentTypeError(f"not a list of factors: {text!r}") from error
    if not factors or any(f <= 1.0 for f in factors):
        raise argparse.ArgumentTypeError("every factor must be above 1")
    return factors


def _arguments(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--factors", type=_factors, default=list(FACTORS))
    parser.add_argument("--jobs-per-factor", type=int, default=25)
    parser.add_argument("--healthy-jobs", type=int, default=25)
    parser.add_argument("--ranks-per-job", type=int, default=16)
    parser.add_argument("--step-seconds", type=float, default=1.0)
    parser.add_argument("--warmup", type=float, default=120.0, help="seconds before slowdowns")
    parser.add_argument("--horizon", type=float, default=20.0, help="minutes watched after")
    parser.add_argument(
        "--noise",
        default="default,neighbour_node={neighbour}",
        help="each job's noise model; {neighbour} is the job's second node",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--scrape-interval", help="default: deploy/prometheus.yml's")
    parser.add_argument("--eval-interval", help="default: deploy/prometheus.yml's")
    parser.add_argument("--out", type=Path, default=Path("build/fleet-sensitivity"))
    parser.add_argument("--workdir", type=Path, default=None)
    parser.add_argument("--keep", action="store_true")
    parser.add_argument(
        "--merge",
        type=Path,
        nargs="+",
        metavar="JSON",
        help="run nothing: pool earlier runs' sensitivity.json into one table and plot in --out",
    )
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = _arguments(argv)
    if args.merge:
        try:
            summary = merge([json.loads(path.read_text()) for path in args.merge])
        except (OSError, ValueError, KeyError, TypeError) as error:
            print(f"fleet_sensitivity: cannot merge {args.merge}: {error}", file=sys.stderr)
            return 2
        return _write(args.out, summary)
    if args.ranks_per_job < 3 or args.jobs_per_factor < 1 or args.horizon <= 0:
        print("--ranks-per-job >= 3, --jobs-per-factor >= 1, --horizon > 0", file=sys.stderr)
        return 2
    children, stop = Children(), threading.Event()
    try:
        with stopping(children, stop):
            summary = run(args, children, stop)
    except RunError as error:
        print(f"fleet_sensitivity: {error}", file=sys.stderr)
        return 1
    return _write(args.out, summary)


def _write(out: Path, summary: dict[str, Any]) -> int:
    out.mkdir(parents=True, exist_ok=True)
    (out / "sensitivity.json").write_text(json.dumps(summary, indent=1))
    plot(summary, summary["horizon_s"], out / "sensitivity.png")
    for line in lines(summary):
        print(line, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
