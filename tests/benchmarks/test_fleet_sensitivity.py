"""The straggler operating-curve benchmark (``benchmarks/fleet_sensitivity.py``): its plan, its
verdicts and its lines on hand-made alerts. Its runs (many jobs through the real Prometheus for
twenty minutes) are the benchmark's own, recorded in docs/fault-matrix.md."""

from __future__ import annotations

import pytest

from benchmarks.fleet_sensitivity import JobPlan, judge, lines, plan_jobs, summarize
from trainguard.demo.noise import Noise

STRAGGLER = "TrainingStraggler"


def test_the_plan_is_seeded_and_never_slows_the_noise_s_skewed_rank() -> None:
    noise = Noise(skewed_rank=1)
    plans = plan_jobs([1.1, 1.5], per_factor=30, healthy=10, ranks=4, seed=5, noise=noise)
    assert plans == plan_jobs([1.1, 1.5], 30, 10, 4, 5, noise)
    assert plans != plan_jobs([1.1, 1.5], 30, 10, 4, 6, noise)
    assert [p.factor for p in plans].count(1.1) == 30 and [p.factor for p in plans].count(1.0) == 10
    assert {p.slow_rank for p in plans} == {0, 2, 3}
    assert all(0.0 <= p.start_after_s <= 60.0 for p in plans)
    assert len({p.job_id for p in plans}) == len(plans)


def _plan(job: str, factor: float, rank: int = 2) -> JobPlan:
    return JobPlan(job, factor, rank, 0.0, 0)


def test_a_slowdown_is_detected_by_its_own_rank_s_alert_after_it_started() -> None:
    plans = [_plan("a", 1.5), _plan("b", 1.5), _plan("c", 1.5), _plan("h", 1.0)]
    started = {"a": 100.0, "b": 100.0, "c": 100.0}
    fired = {
        (STRAGGLER, "a", "2"): 160.0,  # right: 60 s
        (STRAGGLER, "b", "0"): 150.0,  # a victim named: false, and b is missed
        (STRAGGLER, "c", "2"): 90.0,  # before its slowdown: noise, false
        ("TrainingStalled", "a", ""): 170.0,  # another alert in a slowed job: false
        (STRAGGLER, "h", "1"): 40.0,  # anything in a healthy job: false
    }
    results = {r.plan.job_id: r for r in judge(plans, started, fired)}
    assert results["a"].detect_s == 60.0 and results["a"].false_alerts == ["TrainingStalled rank -"]
    assert results["b"].detect_s is None and results["b"].false_alerts == [f"{STRAGGLER} rank 0"]
    assert results["c"].detect_s is None and results["c"].false_alerts == [f"{STRAGGLER} rank 2"]
    assert results["h"].false_alerts == [f"{STRAGGLER} rank 1"]

    summary = summarize(list(results.values()), [1.5], ranks=16, healthy_hours=0.5)
    (row,) = summary["rows"]
    assert (row["jobs"], row["detection"], row["p50_detect_s"]) == (3, pytest.approx(1 / 3), 60.0)
    # One healthy job of 16 ranks for half an hour: 8 rank-hours, one false alert.
    assert summary["healthy_rank_hours"] == 8.0
    assert summary["false_alerts_per_1000_rank_hours"] == 125.0
    assert lines(summary) == [
        "factor=1.5 jobs=3 detection=0.3333 p50_detect_s=60.0 p95_detect_s=60.0",
        "healthy_rank_hours=8.00 false_alerts=1 false_alerts_per_1000_rank_hours=125.00",
    ]
