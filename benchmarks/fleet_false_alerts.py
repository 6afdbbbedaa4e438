"""False alerts of a healthy fleet: how often the shipped rules page a job that has nothing wrong.

Starts the simulated fleet (``benchmarks/fleet.py``) of ``--ranks`` ranks, one healthy job with
its compute driven by the healthy noise model (``trainguard.demo.noise``: heavy-tailed steps and
outliers, a persistently slower rank, batch-dependent cost, whole-job pauses, a noisy neighbour
on one node), and the Debian ``prometheus`` binary with the shipped ``deploy/prometheus.yml``
(its scrape and evaluation intervals, its ranks' scrape job pointed at the fleet) and the shipped
rules with their shipped ``for`` durations: the defaults, nothing lowered. Once every target is
up it watches ``/api/v1/alerts`` for ``--minutes`` and counts every alert series that fires, of
any name and labels: the job is healthy, so each is false. Progress goes to stderr once a minute;
the last line on stdout is::

    fleet_rank_hours=<h> false_alerts_per_1000_rank_hours=<r>

with the line before it naming each false alert (``false_alerts=<k> [name rank node, ...]``).
What the fleet's synthetic steps share with the demo trainer's, and what they do not, is in
docs/fault-matrix.md ("The fleet at the defaults").

    .venv/bin/python -m benchmarks.fleet_false_alerts --ranks 1024 --minutes 60
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.harness.processes import Children, RunError, read_json, wait_for
from benchmarks.harness.prometheus import Api
from benchmarks.scale import stopping
from benchmarks.scale_config import ROOT, start_watched_prometheus, wait_all_up
from trainguard import contract

# The noisy neighbour sits on the fleet's second node (ranks 8-15).
DEFAULT_NOISE = "default,neighbour_node=node-0001"
POLL_SECONDS = 5.0


@dataclass(frozen=True)
class FiredSeries:
    """An alert series as Prometheus reports it: its name and where it points."""

    name: str
    rank: str
    node: str

    def __str__(self) -> str:
        return " ".join(
            part for part in (self.name, self.rank and f"rank {self.rank}", self.node) if part
        )


@dataclass
class Tally:
    """Every alert series that fired, by when it first fired (seconds into the watch)."""

    fired: dict[FiredSeries, float] = field(default_factory=dict)

    def record(self, alerts: list[dict[str, Any]], at: float) -> list[FiredSeries]:
        """Note the firing alerts of one poll; returns the ones not seen before."""
        new = []
        for alert in alerts:
            if alert.get("state") != "firing":
                continue
            labels = alert.get("labels", {})
            series = FiredSeries(
                labels.get("alertname", ""),
                labels.get(contract.LABEL_RANK, ""),
                labels.get(contract.LABEL_NODE, ""),
            )
            if series not in self.fired:
                self.fired[series] = at
                new.append(series)
        return new


def log(message: str) -> None:
    print(
        f"[fleet-false-alerts {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True
    )


def rate_line(rank_hours: float, false_alerts: int) -> str:
    rate = 1000 * false_alerts / rank_hours if rank_hours else float("nan")
    return f"fleet_rank_hours={rank_hours:.2f} false_alerts_per_1000_rank_hours={rate:.2f}"


def run(args: argparse.Namespace, children: Children, stop: threading.Event) -> Tally:
    work = Path(tempfile.mkdtemp(prefix="fleet-false-alerts-", dir=args.workdir))
    try:
        return _watch(args, work, children, stop)
    finally:
        children.stop()
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)


def _watch(
    args: argparse.Namespace, work: Path, children: Children, stop: threading.Event
) -> Tally:
    targets, ready_file = work / "targets.json", work / "fleet.json"
    fleet = children.start(
        [sys.executable, "-m", "benchmarks.fleet", "serve", "--ranks", str(args.ranks),
         "--job-id", "healthy", "--file-sd", str(targets), "--ready-file", str(ready_file),
         "--step-seconds", str(args.step_seconds), "--noise", args.noise,
         "--seed", str(args.seed)],
        work / "fleet.log",
        cwd=ROOT,
    )  # fmt: skip
    wait_for("the fleet", lambda: read_json(ready_file), 300, fleet)
    prometheus, address = start_watched_prometheus(
        children, work, targets, args.scrape_interval, args.eval_interval
    )
    tally = Tally()
    with Api(address) as api:
        wait_for("prometheus ready", api.ready, 120, prometheus)
        wait_all_up(api, args.ranks, 300, fleet, prometheus)
        log(f"all {args.ranks} targets up; watching for {args.minutes:g} min")
        started = time.monotonic()
        next_report = started + 60.0
        while (elapsed := time.monotonic() - started) < 60 * args.minutes:
            for series in tally.record(api.alerts(), elapsed):
                log(f"{elapsed:6.0f} s: {series} fired")
            if time.monotonic() >= next_report:
                next_report += 60.0
                log(
                    f"{elapsed / 60:4.0f} of {args.minutes:g} min: "
                    f"{len(tally.fired)} alert(s) fired so far"
                )
            if stop.wait(POLL_SECONDS):
                raise RunError("stopped")
    return tally


def _arguments(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ranks", type=int, default=1024)
    parser.add_argument("--minutes", type=float, default=60.0, help="minutes watched")
    parser.add_argument("--step-seconds", type=float, default=1.0)
    parser.add_argument(
        "--noise", default=DEFAULT_NOISE, help=f"the noise model (default {DEFAULT_NOISE!r})"
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--scrape-interval", help="default: deploy/prometheus.yml's")
    parser.add_argument("--eval-interval", help="default: deploy/prometheus.yml's")
    parser.add_argument("--workdir", type=Path, default=None, help="parent of the temp folder")
    parser.add_argument("--keep", action="store_true", help="keep the run's folder (logs)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = _arguments(argv)
    if args.ranks < 3 or args.minutes <= 0:
        print("--ranks must be at least 3 and --minutes positive", file=sys.stderr)
        return 2
    children, stop = Children(), threading.Event()
    try:
        with stopping(children, stop):
            tally = run(args, children, stop)
    except RunError as error:
        print(f"fleet_false_alerts: {error}", file=sys.stderr)
        return 1
    rank_hours = args.ranks * args.minutes / 60
    named = ", ".join(str(series) for series in tally.fired)
    print(f"false_alerts={len(tally.fired)} [{named}]")
    print(rate_line(rank_hours, len(tally.fired)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
