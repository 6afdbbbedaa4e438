"""The fault matrix (``benchmarks/fault_matrix.py``): its plan, its scoring, and a quick run.

The plan and the scoring are pure functions, tested on hand-made runs. The quick run is the
matrix's ``--quick`` mode on the real binaries: every fault kind of the catalogue once, on a
seeded rank and time, and one healthy job, each a real torchrun job of the demo trainer against
one real Prometheus, Alertmanager and remediation service. It asserts what the design
guarantees for each kind (its failure's alert fired, ``trainguard diagnose`` named the failure
and the faulty rank, a repair the policy makes was verified) and that the healthy job raised
nothing; no timing is asserted (the matrix's own runs record those, docs/fault-matrix.md).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from typing import Any

import pytest

from benchmarks.fault_matrix_plan import (
    CATALOGUE,
    DRILL_KINDS,
    FAULT_AFTER,
    HEALTHY,
    QUICK_DRILL_RUNS,
    RunPlan,
    RunResult,
    plan_runs,
)
from benchmarks.fault_matrix_report import last_line, summarize, table
from tests.alerts.tools import REPO, binary

LINE = re.compile(
    r"runs=(\d+) detection=(\S+) root_cause=(\S+) recovery=(\S+) false_alerts=(\d+) "
    r"p95_detect_s=(\S+) escalations=(\d+) pages=(\d+)"
)


def test_the_plan_is_seeded_and_draws_every_kind() -> None:
    plans = plan_runs(7, repeats=2, healthy=24)
    assert plans == plan_runs(7, repeats=2, healthy=24), "the same seed, the same matrix"
    assert plans != plan_runs(8, repeats=2, healthy=24)
    kinds = [p.fault for p in plans]
    assert all(kinds.count(spec.name) == 2 for spec in CATALOGUE)
    assert kinds.count(HEALTHY) == 24 and len(plans) == 48
    assert {p.rank for p in plans} == {0, 1, 2, 3}
    assert all(FAULT_AFTER[0] <= p.at_s <= FAULT_AFTER[1] for p in plans)
    assert len({p.job_id for p in plans}) == len(plans)
    drilled = plan_runs(7, repeats=1, healthy=1, more={kind: 2 for kind in DRILL_KINDS})
    kinds = [p.fault for p in drilled]
    assert all(kinds.count(kind) == 3 for kind in DRILL_KINDS)
    assert len(drilled) == len(CATALOGUE) + 1 + 2 * len(DRILL_KINDS)


def _run(index: int, fault: str, rank: int = 1, **fields: Any) -> RunResult:
    return RunResult(RunPlan(index, fault, rank, 20.0, index), started=True, **fields)


def test_the_summary_scores_each_kind_and_the_healthy_hours() -> None:
    results = [
        _run(0, "hang", detected=True, detect_s=10.0, root_cause_right=True,
             action="restart_from_checkpoint", outcome="recovered", recover_s=30.0),
        _run(1, "hang", detected=True, detect_s=20.0, root_cause_right=False,
             action="restart_from_checkpoint", outcome="not_recovered", escalations=1,
             pages=1),
        _run(2, "oom", detected=False),
        _run(3, HEALTHY, trained_seconds=1800.0, false_alerts=["TrainingStraggler"]),
        _run(4, HEALTHY, trained_seconds=1800.0),
    ]  # fmt: skip
    rows, totals = summarize(results)
    hang = next(r for r in rows if r.kind == "hang")
    assert (hang.runs, hang.detection, hang.root_cause) == (2, 1.0, 0.5)
    assert (hang.p50_detect_s, hang.p95_detect_s) == (10.0, 20.0)
    assert (hang.acted, hang.recovery, hang.p95_recover_s) == (2, 0.5, 30.0)
    assert (hang.escalations, hang.pages) == (1, 1)
    oom = next(r for r in rows if r.kind == "oom")
    assert (oom.detection, oom.acted, oom.recovery) == (0.0, 0, None)
    assert totals["detection"] == pytest.approx(2 / 3)
    assert totals["false_alerts"] == 1 and totals["false_alerts_per_healthy_hour"] == 1.0
    assert "| hang | 2 | 100% | 10.0 / 20.0 |" in table(rows, totals)
    line = last_line(totals)
    assert LINE.fullmatch(line), line
    assert "runs=5 detection=0.6667 root_cause=0.3333 recovery=0.5000 false_alerts=1" in line
    assert line.endswith("escalations=1 pages=1")
    assert "| 30.0 / 30.0 | 1 | 1 | 0 |" in table(rows, totals)


@pytest.fixture(scope="module")
def quick(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    binary("prometheus")
    binary("prometheus-alertmanager")
    out = tmp_path_factory.mktemp("fault-matrix")
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.fault_matrix", "--quick", "--parallel", "4",
         "--out", str(out)],
        capture_output=True, text=True, timeout=1400, check=False, cwd=REPO,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-6000:]
    last = done.stdout.strip().splitlines()[-1]
    assert LINE.fullmatch(last), done.stdout[-3000:]
    runs: dict[str, Any] = json.loads((out / "runs.json").read_text())
    assert (out / "table.md").read_text().count("\n| ") == len(CATALOGUE)
    runs["log"] = done.stdout
    return runs


def _runs(quick: dict[str, Any], fault: str) -> list[dict[str, Any]]:
    runs = [r for r in quick["runs"] if r["plan"]["fault"] == fault]
    assert runs, fault
    for run in runs:
        assert run["started"] and run["error"] is None, (run, quick["log"][-3000:])
    return runs


# The first test to use the fixture waits for the whole quick matrix (some 8 minutes here).
@pytest.mark.e2e
@pytest.mark.timeout(1500)
@pytest.mark.parametrize("fault", [spec.name for spec in CATALOGUE])
def test_quick_matrix_detects_names_and_repairs(quick: dict[str, Any], fault: str) -> None:
    for run in _runs(quick, fault):
        assert run["detected"], run
        assert run["root_cause_right"], run
        assert not run["false_alerts"], run
        if run["action"] is not None:
            assert run["outcome"] == "recovered", run


@pytest.mark.e2e
@pytest.mark.timeout(1500)
@pytest.mark.parametrize("fault", DRILL_KINDS)
def test_quick_matrix_runs_the_drill_s_faults_again_without_a_false_page(
    quick: dict[str, Any], fault: str
) -> None:
    # Each repair of the drill's faults works: recovered on its first rung every time, never
    # followed by a climb of the ladder or a page.
    runs = _runs(quick, fault)
    assert len(runs) == QUICK_DRILL_RUNS
    for run in runs:
        assert (run["outcome"], run["escalations"], run["pages"]) == ("recovered", 0, 0), run


@pytest.mark.e2e
@pytest.mark.timeout(1500)
def test_quick_matrix_pages_nobody(quick: dict[str, Any]) -> None:
    assert quick["totals"]["pages"] == 0 and quick["totals"]["escalations"] == 0, [
        (r["plan"]["job_id"], r["escalations"], r["pages"]) for r in quick["runs"]
    ]


@pytest.mark.e2e
@pytest.mark.timeout(1500)
def test_quick_matrix_healthy_job_raises_nothing(quick: dict[str, Any]) -> None:
    (run,) = _runs(quick, HEALTHY)
    assert run["alerts"] == {} and run["action"] is None, run
    assert run["cause"] is None, run
