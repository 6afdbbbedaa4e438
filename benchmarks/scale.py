"""Scale: a job of thousands of simulated ranks on one real Prometheus with trainguard's rules.

For each size (``--sizes``, default 256, 1,024 and 4,096 ranks) this starts the simulated fleet
(``benchmarks/fleet.py``: one process serving every rank, each its own target, built from a real
rank's exposition captured at its start) and the Debian ``prometheus`` binary on a fresh TSDB in
a temporary folder, configured from the shipped ``deploy/prometheus.yml``: its global scrape and
evaluation intervals (15 s), its ``trainguard-ranks`` scrape job as it is (10 s, honor_labels)
pointed at the fleet's file_sd file, a self-scrape job, and its ``rule_files``, loaded as they
are except that every alert's ``for`` is capped at ``--for-cap`` (default 2m: the straggler's
shipped 10m would make one size take 13 minutes; ``--for-cap none`` keeps the shipped values).
``--scrape-interval`` / ``--eval-interval`` override the intervals (the quick test uses 2 s).

Once every target is up, the job warms up (``--warmup`` seconds, and at least the rules'
``warmup_steps`` steps), then both faults start at once, on a whole evaluation interval of unix
time: one rank's compute slows by the fleet's ``--slow-factor`` and another rank hangs. Every
size loads the same rule files, written once, so Prometheus gives each run's groups the same
offsets in the interval; with the faults on the same phase of it, an alert that waits on a chain
of groups (the straggler: per-rank means, then the job's median, then the alert) lags the fault
the same at every size, and the alert times compare. It then polls ``/api/v1/alerts`` every
second and records, from the fault start, when ``TrainingStraggler`` fires for the slowed rank and
``TrainingCollectiveStalled`` for the hung rank; any other alert firing at any time of the run
(another alert, or one of these on another rank) is a false alert. After both fired, and
``--settle`` more seconds of watching, it reads: head series (``prometheus_tsdb_head_series``),
Prometheus' RSS (psutil, last and peak), scrape duration over the ranks' targets (p50 and max),
each rule group's ``prometheus_rule_group_last_duration_seconds`` (the most over the run since
the faults, from the self-scrape) and missed iterations, the slowest rules
(``/api/v1/rules`` evaluationTime), and the fleet's CPU.

A 4-rank job runs as the reference for the alert times, beside the first size (4 targets add
nothing that shows). One line per size on stdout, exactly (one line, wrapped here)::

    ranks=<n> head_series=<s> series_per_rank=<r> max_rule_eval_s=<e>
    straggler_alert_s=<a> stall_alert_s=<b> false_alerts=<k>

``series_per_rank`` is (head series - the self-scrape's series) / ranks: what a rank costs the
head, its exposition plus its target's ``up``/``scrape_*`` series and the recording rules' per-rank
series. An alert that did not fire within ``--for-cap`` + ``--alert-margin`` is ``none``. Details
and progress go to stderr; ``--json PATH`` writes every figure. Every child runs in its own
process group and is stopped on exit, Ctrl-C or SIGTERM included. Bounded: Prometheus' RSS
above ``--max-rss-gb`` (16) ends a size, and so does the ``--time-budget`` (30 minutes for the
whole benchmark; the default sizes take about 18 here), which a size that runs past fails.

    .venv/bin/python -m benchmarks.scale [--sizes 256,1024,4096] [--for-cap 2m] [--json out.json]

Targets (issue 19): at 4,096 ranks every rule group evaluates in under 1 s, both alerts fire
within the 4-rank reference's time plus one evaluation interval, and no other rank alerts.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, TypeVar

import httpx
import psutil
import yaml

from benchmarks.harness.processes import Children, RunError, free_port, read_json, wait_for
from benchmarks.harness.prometheus import Api
from benchmarks.scale_config import (
    ROOT,
    SELF_JOB,
    STALL,
    STRAGGLER,
    Settings,
    eval_interval_s,
    prometheus_config,
    write_rules,
)
from trainguard import contract
from trainguard.thresholds import duration_seconds, load_default

SIZES = (256, 1024, 4096)
REFERENCE_RANKS = 4
POLL_SECONDS = 1.0
T = TypeVar("T")


def log(message: str) -> None:
    # One write per message: the reference's thread logs too.
    sys.stderr.write(f"[scale {time.strftime('%H:%M:%S')}] {message}\n")
    sys.stderr.flush()


# --- children -------------------------------------------------------------------------------------


# --- configuration --------------------------------------------------------------------------------


# --- Prometheus -----------------------------------------------------------------------------------


# --- one size -------------------------------------------------------------------------------------


@dataclass
class Result:
    ranks: int
    head_series: int = 0
    series_per_rank: float = 0.0
    max_rule_eval_s: float = 0.0
    straggler_alert_s: float | None = None
    stall_alert_s: float | None = None
    false_alerts: int = 0
    prometheus_rss_bytes: int = 0
    prometheus_peak_rss_bytes: int = 0
    exposition_samples_per_rank: float = 0.0
    scrape_duration_p50_s: float = 0.0
    scrape_duration_max_s: float = 0.0
    rule_group_max_s: dict[str, float] = field(default_factory=dict)
    rule_group_median_s: dict[str, float] = field(default_factory=dict)
    rule_group_last_s: dict[str, float] = field(default_factory=dict)
    rule_group_missed: dict[str, float] = field(default_factory=dict)
    # Every rule's last evaluation time, slowest first: (group, rule, seconds).
    rule_eval_s: list[tuple[str, str, float]] = field(default_factory=list)
    fleet_cpu_share: float = 0.0
    # Cores Prometheus used over the same window (scrapes, ingestion and every rule group), and
    # the machine's 1-minute load average at the end: with 2 cores, a load well above what
    # Prometheus and the fleet account for means other work shared them and slowed the rules.
    prometheus_cpu_cores: float = 0.0
    load_average: float = 0.0
    slow_rank: int = -1
    hung_rank: int = -1
    alerts: list[dict[str, Any]] = field(default_factory=list)
    pending_unexpected: list[str] = field(default_factory=list)
    intervals: dict[str, str] = field(default_factory=dict)
    alert_for_s: dict[str, float] = field(default_factory=dict)

    def line(self) -> str:
        def seconds(value: float | None) -> str:
            return "none" if value is None else f"{value:.1f}"

        return (
            f"ranks={self.ranks} head_series={self.head_series} "
            f"series_per_rank={self.series_per_rank:.1f} "
            f"max_rule_eval_s={self.max_rule_eval_s:.3f} "
            f"straggler_alert_s={seconds(self.straggler_alert_s)} "
            f"stall_alert_s={seconds(self.stall_alert_s)} false_alerts={self.false_alerts}"
        )

    def details(self) -> str:
        groups = " ".join(
            f"{g}={s:.3f} (median {self.rule_group_median_s.get(g, 0.0):.3f})"
            for g, s in self.rule_group_max_s.items()
        )
        missed = " ".join(f"{g}={int(n)}" for g, n in self.rule_group_missed.items())
        slowest: dict[str, list[str]] = {}
        for group, rule, seconds in self.rule_eval_s:
            if len(slowest.setdefault(group, [])) < 3:
                slowest[group].append(f"{rule} {seconds:.3f}")
        rules = "; ".join(f"{group}: {', '.join(top)}" for group, top in slowest.items())
        return (
            f"ranks={self.ranks} prometheus_rss_mb={self.prometheus_rss_bytes / 2**20:.0f} "
            f"(peak {self.prometheus_peak_rss_bytes / 2**20:.0f}) "
            f"exposition_samples_per_rank={self.exposition_samples_per_rank:.0f} "
            f"scrape_duration_p50_s={self.scrape_duration_p50_s:.4f} "
            f"scrape_duration_max_s={self.scrape_duration_max_s:.4f} "
            f"fleet_cpu_share={self.fleet_cpu_share:.2f} "
            f"prometheus_cpu_cores={self.prometheus_cpu_cores:.2f} "
            f"load_average={self.load_average:.1f}\n"
            f"  rule groups (most since the faults): {groups}; missed iterations: {missed}\n"
            f"  slowest rules by group (last evaluation, s): {rules}"
            + (
                f"\n  pending, not expected: {' '.join(self.pending_unexpected)}"
                if self.pending_unexpected
                else ""
            )
        )


class Run:
    """One size: fleet and Prometheus up, warm-up, faults, alerts watched, figures read."""

    def __init__(
        self, ranks: int, settings: Settings, children: Children, stop: threading.Event
    ) -> None:
        self.ranks = ranks
        self.settings = settings
        self.children = children
        self.stop = stop
        self.result = Result(ranks)
        self.peak_rss = 0
        self.prometheus: subprocess.Popen[bytes] | None = None

    def say(self, message: str) -> None:
        log(f"ranks={self.ranks}: {message}")

    def sleep(self, seconds: float) -> None:
        if self.stop.wait(seconds):
            raise RunError("stopped")
        if time.monotonic() > self.settings.ends_at:
            raise RunError("past --time-budget")

    def within_budget(self, seconds: float) -> float:
        """``seconds``, or what is left of the time budget if less."""
        return max(0.0, min(seconds, self.settings.ends_at - time.monotonic()))

    def rss(self) -> int:
        assert self.prometheus is not None
        try:
            rss = int(psutil.Process(self.prometheus.pid).memory_info().rss)
        except psutil.NoSuchProcess:
            raise RunError("prometheus exited") from None
        self.peak_rss = max(self.peak_rss, rss)
        if rss > self.settings.max_rss_bytes:
            raise RunError(f"prometheus RSS {rss / 2**30:.1f} GiB is over --max-rss-gb")
        return rss

    def execute(self) -> Result:
        work = Path(tempfile.mkdtemp(prefix=f"scale-{self.ranks}-", dir=self.settings.workdir))
        procs: list[subprocess.Popen[bytes]] = []
        try:
            return self._measure(work, procs)
        finally:
            self.children.stop(*procs)
            if self.settings.keep:
                self.say(f"kept {work}")
            else:
                shutil.rmtree(work, ignore_errors=True)

    def _measure(self, work: Path, procs: list[subprocess.Popen[bytes]]) -> Result:
        s, r = self.settings, self.result
        prometheus_bin = shutil.which("prometheus")
        if prometheus_bin is None:
            raise RunError("prometheus is not installed (Debian: apt-get install prometheus)")
        rules, fors = list(s.rule_files), dict(s.alert_for_s)
        r.alert_for_s = {a: fors[a] for a in (STRAGGLER, STALL)}
        targets, ready_file = work / "targets.json", work / "fleet.json"
        fleet = self.children.start(
            [sys.executable, "-m", "benchmarks.fleet", "serve", "--ranks", str(self.ranks),
             "--job-id", f"scale-{self.ranks}", "--file-sd", str(targets),
             "--ready-file", str(ready_file), "--step-seconds", str(s.step_seconds),
             "--slow-factor", str(s.slow_factor),
             *(["--noise", s.noise] if s.noise else [])],
            work / "fleet.log",
            cwd=ROOT,
        )  # fmt: skip
        procs.append(fleet)
        ready = wait_for("the fleet", lambda: read_json(ready_file), self.within_budget(300), fleet)
        r.slow_rank, r.hung_rank = ready["slow_rank"], ready["hung_rank"]
        fleet_url = f"http://{ready['address']}"
        address = f"127.0.0.1:{free_port()}"
        config = prometheus_config(s.scrape_interval, s.eval_interval, targets, rules, address)
        r.intervals = {
            "scrape_ranks": config["scrape_configs"][0].get(
                "scrape_interval", config["global"]["scrape_interval"]
            ),
            "evaluation": config["global"]["evaluation_interval"],
        }
        (work / "prometheus.yml").write_text(yaml.safe_dump(config, sort_keys=False))
        self.prometheus = self.children.start(
            [prometheus_bin, f"--config.file={work / 'prometheus.yml'}",
             f"--storage.tsdb.path={work / 'data'}", f"--web.listen-address={address}",
             "--enable-feature=exemplar-storage"],
            work / "prometheus.log",
        )  # fmt: skip
        procs.append(self.prometheus)
        with Api(address) as api:
            return self._observe(api, fleet, fleet_url)

    def _observe(self, api: Api, fleet: subprocess.Popen[bytes], fleet_url: str) -> Result:
        s, r = self.settings, self.result
        assert self.prometheus is not None
        wait_for("prometheus ready", api.ready, self.within_budget(120), self.prometheus)
        up = f'count(up{{job="{contract.SCRAPE_JOB_RANKS}"}} == 1)'

        def all_up() -> bool:
            self.rss()
            return (api.scalar(up) or 0) >= self.ranks

        started = time.monotonic()
        wait_for(
            f"all {self.ranks} targets up", all_up, self.within_budget(300), fleet, self.prometheus
        )
        self.say(f"all targets up after {time.monotonic() - started:.0f} s; warming up")
        alerts: dict[tuple[str, str], float] = {}
        pending: set[str] = set()
        warmup_steps = load_default().warmup_steps
        deadline = time.monotonic() + s.warmup_s
        while time.monotonic() < deadline or _fleet_steps(fleet_url) < warmup_steps + 10:
            self._watch(api, alerts, pending, since=None)
            self.rss()
            self.sleep(POLL_SECONDS)
        # Faults start on the evaluation grid (unix time, whole intervals), in every run at the
        # same phase of every group's interval, so the alerts' times compare across sizes.
        interval = eval_interval_s(s)
        self.sleep(interval - time.time() % interval)
        cpu_before = _cpu_seconds(fleet)
        prometheus_cpu_before = _cpu_seconds(self.prometheus)
        faults_at = float(httpx.post(f"{fleet_url}/faults", timeout=60).json()["faults_at"])
        started = time.monotonic()
        self.say(f"faults started: rank {r.slow_rank} slowed, rank {r.hung_rank} hung")
        expected = {(STRAGGLER, str(r.slow_rank)), (STALL, str(r.hung_rank))}
        deadline = started + self.within_budget(max(r.alert_for_s.values()) + s.alert_margin_s)
        settle_until: float | None = None
        while time.monotonic() < deadline:
            self._watch(api, alerts, pending, since=faults_at)
            self.rss()
            if settle_until is None and expected <= alerts.keys():
                self.say("both alerts fired; settling")
                settle_until = time.monotonic() + s.settle_s
            if settle_until is not None and time.monotonic() >= settle_until:
                break
            self.sleep(POLL_SECONDS)
        elapsed = time.monotonic() - started
        r.fleet_cpu_share = (_cpu_seconds(fleet) - cpu_before) / elapsed
        r.prometheus_cpu_cores = (_cpu_seconds(self.prometheus) - prometheus_cpu_before) / elapsed
        r.load_average = os.getloadavg()[0]
        r.straggler_alert_s = alerts.get((STRAGGLER, str(r.slow_rank)))
        r.stall_alert_s = alerts.get((STALL, str(r.hung_rank)))
        r.alerts = [{"alertname": a, "rank": k, "seconds": t} for (a, k), t in alerts.items()]
        r.false_alerts = len(alerts.keys() - expected)
        r.pending_unexpected = sorted(pending)
        self._read_figures(api, window=max(elapsed, 60.0))
        return r

    def _watch(
        self,
        api: Api,
        seen: dict[tuple[str, str], float],
        pending: set[str],
        since: float | None,
    ) -> None:
        """Record each alert's first firing (seconds since ``since``, negative before the
        faults) and unexpected pending alerts."""
        now = time.time()
        for alert in api.alerts():
            labels = alert["labels"]
            key = (labels.get("alertname", ""), labels.get(contract.LABEL_RANK, ""))
            if alert["state"] == "firing" and key not in seen:
                seen[key] = now - since if since is not None else -1.0
                self.say(f"{key[0]} fired for rank {key[1] or '-'} at {seen[key]:.1f} s")
            elif alert["state"] == "pending":
                pending.add(f"{key[0]}/{key[1] or '-'}")
        pending.difference_update(
            {f"{STRAGGLER}/{self.result.slow_rank}", f"{STALL}/{self.result.hung_rank}"}
        )

    def _read_figures(self, api: Api, window: float) -> None:
        r = self.result
        ranks_job = f'job="{contract.SCRAPE_JOB_RANKS}"'
        own = api.own_metrics()
        r.head_series = int(own["prometheus_tsdb_head_series"][""])
        self_series = api.scalar(f'count({{job="{SELF_JOB}"}})') or 0.0
        r.series_per_rank = (r.head_series - self_series) / self.ranks
        r.exposition_samples_per_rank = (
            api.scalar(f"quantile(0.5, scrape_samples_scraped{{{ranks_job}}})") or 0.0
        )
        over = f"[{window:.0f}s]"
        durations = f"scrape_duration_seconds{{{ranks_job}}}{over}"
        r.scrape_duration_p50_s = api.scalar(f"quantile(0.5, avg_over_time({durations}))") or 0.0
        r.scrape_duration_max_s = api.scalar(f"max(max_over_time({durations}))") or 0.0
        groups = f'prometheus_rule_group_last_duration_seconds{{job="{SELF_JOB}"}}{over}'
        r.rule_group_max_s = api.by_group(f"max by (rule_group) (max_over_time({groups}))")
        r.rule_group_median_s = api.by_group(
            f"max by (rule_group) (quantile_over_time(0.5, {groups}))"
        )
        r.rule_group_last_s = own.get("prometheus_rule_group_last_duration_seconds", {})
        r.rule_group_missed = own.get("prometheus_rule_group_iterations_missed_total", {})
        r.max_rule_eval_s = max([*r.rule_group_max_s.values(), *r.rule_group_last_s.values()])
        rules = [
            (group["name"], rule["name"], float(rule.get("evaluationTime", 0.0)))
            for group in api.rules()
            for rule in group["rules"]
        ]
        r.rule_eval_s = sorted(rules, key=lambda rule: -rule[2])
        r.prometheus_rss_bytes = self.rss()
        r.prometheus_peak_rss_bytes = self.peak_rss


def _fleet_steps(url: str) -> int:
    steps: int = httpx.get(f"{url}/status", timeout=60).json()["steps"]
    return steps


def _cpu_seconds(proc: subprocess.Popen[bytes]) -> float:
    times = psutil.Process(proc.pid).cpu_times()
    return float(times.user + times.system)


# --- the whole run --------------------------------------------------------------------------------


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


@contextmanager
def stopping(children: Children, stop: threading.Event) -> Iterator[None]:
    """SIGINT and SIGTERM as Ctrl-C (SIGINT too: a shell's background job starts with it
    ignored); on the way out, whatever the reason, every child is stopped."""
    previous = {sig: signal.signal(sig, _interrupt) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        stop.set()
        children.stop()
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def verdicts(results: list[Result], reference: Result | None, interval: float) -> list[str]:
    """Each size against the targets: groups under 1 s, alerts within the reference's time
    plus one evaluation interval, no false alerts."""
    lines = []
    for r in results:
        checks = [f"rule groups < 1 s: {'met' if r.max_rule_eval_s < 1.0 else 'missed'}"]
        for name, mine, ref in (
            ("straggler", r.straggler_alert_s, reference.straggler_alert_s if reference else None),
            ("stall", r.stall_alert_s, reference.stall_alert_s if reference else None),
        ):
            if mine is None or ref is None:
                checks.append(f"{name} alert: not measured")
            else:
                met = mine <= ref + interval
                checks.append(
                    f"{name} alert <= {ref:.1f} + {interval:g} s: {'met' if met else 'missed'}"
                )
        checks.append(f"no false alerts: {'met' if r.false_alerts == 0 else 'missed'}")
        lines.append(f"ranks={r.ranks}: " + "; ".join(checks))
    return lines


def main(argv: list[str] | None = None) -> int:
    args = _arguments(argv)
    settings = Settings(
        scrape_interval=args.scrape_interval,
        eval_interval=args.eval_interval,
        for_cap=None if args.for_cap == "none" else args.for_cap,
        warmup_s=args.warmup,
        alert_margin_s=args.alert_margin,
        settle_s=args.settle,
        step_seconds=args.step_seconds,
        slow_factor=args.slow_factor,
        noise=args.noise,
        max_rss_bytes=args.max_rss_gb * 2**30,
        ends_at=time.monotonic() + 60 * args.time_budget,
        workdir=args.workdir,
        keep=args.keep,
    )
    rules_dir = Path(tempfile.mkdtemp(prefix="scale-rules-", dir=settings.workdir))
    try:
        rule_files, fors = write_rules(rules_dir, settings.for_cap)
    except RunError as error:
        shutil.rmtree(rules_dir, ignore_errors=True)
        log(f"failed: {error}")
        return 1
    settings = replace(
        settings, rule_files=tuple(rule_files), alert_for_s=tuple(sorted(fors.items()))
    )
    try:
        return _run_sizes(args, settings)
    finally:
        shutil.rmtree(rules_dir, ignore_errors=True)


def _run_sizes(args: argparse.Namespace, settings: Settings) -> int:
    children, stop = Children(), threading.Event()
    results: list[Result] = []
    reference: list[Result] = []
    failures: list[str] = []
    began = time.monotonic()

    def measure(ranks: int, into: list[Result]) -> None:
        if stop.is_set():
            return
        try:
            result = Run(ranks, settings, children, stop).execute()
        except (RunError, httpx.HTTPError, OSError) as error:
            failures.append(f"ranks={ranks}: {error}")
            log(f"ranks={ranks} failed: {error}")
            return
        into.append(result)
        sys.stdout.write(result.line() + "\n")
        sys.stdout.flush()
        log(result.details())

    side = threading.Thread(target=measure, args=(REFERENCE_RANKS, reference), daemon=True)
    try:
        with stopping(children, stop):
            if not args.no_reference:
                side.start()
            for ranks in args.sizes:
                measure(ranks, results)
            while side.is_alive():
                side.join(timeout=1.0)
    except KeyboardInterrupt:
        # The reference's run removes its folder once its children are gone.
        if side.is_alive():
            side.join(timeout=60)
        log("interrupted; every child stopped")
        return 130
    interval = eval_interval_s(settings)
    for line in verdicts(results, reference[0] if reference else None, interval):
        log(line)
    log(f"done in {(time.monotonic() - began) / 60:.1f} min")
    if args.json is not None:
        args.json.write_text(
            json.dumps(
                {
                    "settings": {k: str(v) for k, v in asdict(settings).items()},
                    "reference": [asdict(r) for r in reference],
                    "results": [asdict(r) for r in results],
                    "failures": failures,
                },
                indent=2,
            )
        )
    return 1 if failures else 0


def _sizes(text: str) -> list[int]:
    sizes = [int(part) for part in text.split(",") if part.strip()]
    if not sizes or min(sizes) < 3:
        raise argparse.ArgumentTypeError("sizes are rank counts of at least 3, comma-separated")
    return sizes


def _arguments(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", type=_sizes, default=list(SIZES))
    parser.add_argument("--no-reference", action="store_true", help="skip the 4-rank reference")
    parser.add_argument("--scrape-interval", help="default: deploy/prometheus.yml's")
    parser.add_argument("--eval-interval", help="default: deploy/prometheus.yml's")
    parser.add_argument("--for-cap", default="2m", help="cap on every alert's for, or 'none'")
    parser.add_argument("--warmup", type=float, default=90.0, help="seconds before the faults")
    parser.add_argument(
        "--alert-margin", type=float, default=300.0, help="seconds past the longest for to wait"
    )
    parser.add_argument(
        "--settle", type=float, default=30.0, help="seconds of watching after both alerts fired"
    )
    parser.add_argument("--step-seconds", type=float, default=1.0)
    parser.add_argument("--slow-factor", type=float, default=1.8)
    parser.add_argument(
        "--noise",
        default=None,
        help="drive the fleet with the healthy noise model (benchmarks.fleet --noise)",
    )
    parser.add_argument("--max-rss-gb", type=float, default=16.0)
    parser.add_argument("--workdir", type=Path, default=None, help="parent of the temp folders")
    parser.add_argument("--keep", action="store_true", help="keep each size's folder (logs)")
    parser.add_argument(
        "--time-budget", type=float, default=30.0, help="minutes after which every run stops"
    )
    parser.add_argument("--json", type=Path, default=None, help="write every figure here")
    args = parser.parse_args(argv)
    if args.for_cap != "none" and duration_seconds(args.for_cap) <= 0:
        parser.error("--for-cap is a Prometheus duration (2m, 30s) or 'none'")
    return args


if __name__ == "__main__":
    sys.exit(main())
