"""The healthy fleet's false-alert benchmark (``benchmarks/fleet_false_alerts.py``): its tally on
hand-made alert lists, and a short run of 8 ranks against the real Prometheus and the shipped
rules (2 s intervals). No rate is asserted: the benchmark's own hour-long run records it
(docs/fault-matrix.md)."""

from __future__ import annotations

import re
import subprocess
import sys

from benchmarks.fleet_false_alerts import FiredSeries, Tally, rate_line
from tests.alerts.tools import REPO, binary


def _alert(name: str, state: str, **labels: str) -> dict[str, object]:
    return {"state": state, "labels": {"alertname": name, **labels}}


def test_every_firing_series_counts_once_and_pending_ones_do_not() -> None:
    tally = Tally()
    first = [
        _alert("TrainingStraggler", "pending", rank="3", node="node-0000"),
        _alert("TrainingStraggler", "firing", rank="9", node="node-0001"),
        _alert("TrainingStalled", "firing"),
    ]
    new = tally.record(first, at=30.0)
    assert [str(series) for series in new] == [
        "TrainingStraggler rank 9 node-0001",
        "TrainingStalled",
    ]
    # Still firing at the next poll, and one more: only the new one is new.
    again = [*first, _alert("TrainingStraggler", "firing", rank="10", node="node-0001")]
    assert tally.record(again, at=35.0) == [FiredSeries("TrainingStraggler", "10", "node-0001")]
    assert len(tally.fired) == 3
    assert tally.fired[FiredSeries("TrainingStalled", "", "")] == 30.0
    assert rate_line(2048.0, 3) == (
        "fleet_rank_hours=2048.00 false_alerts_per_1000_rank_hours=1.46"
    )


def test_a_short_healthy_run_reports_its_rank_hours() -> None:
    binary("prometheus")
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.fleet_false_alerts", "--ranks", "8",
         "--minutes", "0.3", "--step-seconds", "0.5", "--scrape-interval", "2s",
         "--eval-interval", "2s"],
        capture_output=True, text=True, timeout=400, check=False, cwd=REPO,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    *_, named, last = done.stdout.strip().splitlines()
    # 8 ranks x 0.3 min = 0.04 rank-hours, and a healthy fleet sets nothing off.
    assert last == "fleet_rank_hours=0.04 false_alerts_per_1000_rank_hours=0.00", done.stdout
    assert named == "false_alerts=0 []", done.stderr[-3000:]
    assert re.search(r"all 8 targets up; watching for 0.3 min", done.stderr)
