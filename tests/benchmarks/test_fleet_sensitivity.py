"""The straggler operating-curve benchmark (``benchmarks/fleet_sensitivity.py``): its plan, its
verdicts and its lines on hand-made alerts. Its runs (many jobs through the real Prometheus for
twenty minutes) are the benchmark's own, recorded in docs/fault-matrix.md."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from typing import Any

import pytest

from benchmarks.fleet_sensitivity import (
    JobPlan,
    JobResult,
    first_firing,
    judge,
    lines,
    main,
    merge,
    plan_jobs,
    summarize,
)
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

    summary = summarize(list(results.values()), [1.5], healthy_rank_hours=8.0)
    (row,) = summary["rows"]
    assert (row["jobs"], row["detection"], row["p50_detect_s"]) == (3, pytest.approx(1 / 3), 60.0)
    # One healthy job of 16 ranks for half an hour: 8 rank-hours, one false alert.
    assert summary["healthy_rank_hours"] == 8.0
    assert summary["false_alerts_per_1000_rank_hours"] == 125.0
    assert lines(summary) == [
        "factor=1.5 jobs=3 detection=0.3333 p50_detect_s=60.0 p95_detect_s=60.0",
        "healthy_rank_hours=8.00 false_alerts=1 false_alerts_per_1000_rank_hours=125.00",
    ]


def test_an_alert_is_timed_by_the_evaluation_that_first_wrote_it_firing() -> None:
    """Raw ``ALERTS`` samples: one rank's two straggler detectors (its slow and its recent
    rule) are one detection, at the earlier of their first evaluations."""

    def series(rank: str, detector: str, times: list[float]) -> dict[str, Any]:
        labels = {"alertname": STRAGGLER, "job_id": "a", "rank": rank, "detector": detector}
        return {"metric": labels, "values": [[t, "1"] for t in times]}

    fired = first_firing(
        [
            series("2", "recent", [165.0, 160.0, 170.0]),
            series("2", "slow", [175.0, 180.0]),
            {"metric": {"alertname": "TrainingStalled", "job_id": "a"}, "values": [[200.0, "1"]]},
        ]
    )
    assert fired == {(STRAGGLER, "a", "2"): 160.0, ("TrainingStalled", "a", ""): 200.0}


def _run(
    factor: float, detects: list[float | None], healthy_false: int, hours: float
) -> dict[str, Any]:
    """A run's sensitivity.json of one factor's jobs and one healthy job."""
    results = [
        JobResult(JobPlan(f"{factor}-{i}", factor, 2, 0.0, i), 0.0, detect)
        for i, detect in enumerate(detects)
    ]
    results.append(
        JobResult(JobPlan(f"h{factor}", 1.0, 2, 0.0, 9), None, None, ["x"] * healthy_false)
    )
    summary = summarize(results, [factor], hours)
    summary["results"] = [asdict(r) for r in results]
    summary["horizon_s"] = 300.0 if factor < 2 else 240.0
    decoded: dict[str, Any] = json.loads(json.dumps(summary))
    return decoded


def test_runs_of_a_few_factors_each_pool_into_one_table(tmp_path: Path) -> None:
    first = _run(1.15, [40.0, 50.0, None, 60.0], healthy_false=1, hours=10.0)
    second = _run(2.0, [30.0, 35.0, 40.0], healthy_false=0, hours=30.0)
    pooled = merge([second, first])
    assert [row["factor"] for row in pooled["rows"]] == [1.15, 2.0]
    assert pooled["rows"][0]["jobs"] == 4 and pooled["rows"][0]["detection"] == 0.75
    assert pooled["rows"][1]["p50_detect_s"] == 35.0
    assert pooled["healthy_rank_hours"] == 40.0 and pooled["false_alerts"] == 1
    assert pooled["horizon_s"] == 240.0 and len(pooled["results"]) == 9

    paths = []
    for i, summary in enumerate((first, second)):
        paths.append(tmp_path / f"{i}.json")
        paths[-1].write_text(json.dumps(summary))
    assert main(["--merge", *map(str, paths), "--out", str(tmp_path / "pooled")]) == 0
    written = json.loads((tmp_path / "pooled" / "sensitivity.json").read_text())
    assert written["rows"] == pooled["rows"]
    (tmp_path / "bad.json").write_text("{}")
    assert main(["--merge", str(tmp_path / "bad.json"), "--out", str(tmp_path / "x")]) == 2
