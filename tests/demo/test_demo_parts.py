"""The demo's fault plan, its fault ledger and the configuration it renders."""

from __future__ import annotations

import os
import shutil
import subprocess
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest
import yaml

from trainguard.alerts.rules import render
from trainguard.contract import ENV_STALL_FLOOR, SCRAPE_JOB_RANKS
from trainguard.demo.config import DEMO_JOB_ID, DemoConfig
from trainguard.demo.faults import DEFAULT_PLAN, Fault, FaultLedger, FaultPlanError, parse_plan
from trainguard.demo.faults.hang import HANG
from trainguard.demo.faults.oom import OOM
from trainguard.demo.faults.straggler import STRAGGLER
from trainguard.demo.run import Reliability, incident_of
from trainguard.demo.stack import (
    DEMO_PACE,
    SCRAPE_SECONDS,
    SIMULATED_GPUS,
    Pace,
    Stack,
    TrainingJob,
    demo_thresholds,
    exporter_gpu_args,
    write_configs,
)
from trainguard.remediation.policy import load_policy
from trainguard.thresholds import Thresholds, default_path


def test_the_default_plan() -> None:
    assert parse_plan(DEFAULT_PLAN) == [
        Fault(STRAGGLER, 2, 20.0, 1.5),
        Fault(HANG, 1, 60.0),
        Fault(OOM, 0, 90.0),
    ]
    assert parse_plan("") == []
    assert parse_plan("oom:rank=3,at=1.5m; hang:rank=0,at=500ms") == [
        Fault(OOM, 3, 90.0),
        Fault(HANG, 0, 0.5),
    ]


@pytest.mark.parametrize(
    ("plan", "message"),
    [
        ("meltdown:rank=1,at=2s", "unknown fault 'meltdown'"),
        ("hang:rank=1", "needs rank= and at="),
        ("hang:rank=1,at=soon", "not a duration"),
        ("hang:rank=x,at=1s", "invalid literal"),
        ("straggler:rank=1,at=1s,factor=0.5", "factor >= 1"),
        ("hang:rank=1,at=1s,colour=red", "unknown option"),
        ("hang:rank1,at=1s", "not key=value"),
    ],
)
def test_bad_plans_say_what_is_wrong(plan: str, message: str) -> None:
    with pytest.raises(FaultPlanError, match=message):
        parse_plan(plan)


def test_the_ledger_keeps_the_job_start_and_fires_once(tmp_path: Path) -> None:
    ledger = FaultLedger(tmp_path)
    started = ledger.job_started_at()
    assert FaultLedger(tmp_path).job_started_at() == started, "a restart keeps the start"
    assert ledger.fired(HANG) is None
    fired = ledger.fire(Fault(HANG, 1, 5.0), "node-a")
    again = FaultLedger(tmp_path).fired(HANG)
    assert again == fired and again.node == "node-a" and again.rank == 1


def _require(binary: str) -> None:
    if shutil.which(binary) is None and os.environ.get("TRAINGUARD_REQUIRE_BINARIES") != "1":
        pytest.skip(f"needs {binary}")


def test_rendered_configs_pass_their_own_checkers(tmp_path: Path) -> None:
    cfg = DemoConfig(workdir=tmp_path)
    paths = write_configs(cfg)
    _require("promtool")
    _require("amtool")
    checked = subprocess.run(
        ["promtool", "check", "config", str(paths["prometheus"])], capture_output=True, text=True
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "SUCCESS" in checked.stdout and "rule" in checked.stdout
    checked = subprocess.run(
        ["amtool", "check-config", str(paths["alertmanager"])], capture_output=True, text=True
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
    policy = load_policy(paths["policy"])
    assert {rule.alert for rule in policy.rules} >= {"TrainingStraggler", "TrainingOOM"}
    assert all(
        any(m.label == "job_id" and m.value == DEMO_JOB_ID for m in rule.matchers)
        for rule in policy.rules
    ), "the demo's policy acts on the demo's own job only"
    assert cfg.token_file.stat().st_mode & 0o077 == 0, "the token file is private"


def test_a_pace_sets_the_intervals_thresholds_and_hook_floor(tmp_path: Path) -> None:
    shipped = Pace("shipped", scrape_seconds=15, rank_scrape_seconds=5, evaluation_seconds=5)
    cfg = DemoConfig(workdir=tmp_path)
    paths = write_configs(cfg, pace=shipped)
    prometheus = yaml.safe_load(paths["prometheus"].read_text())
    assert prometheus["global"] == {"scrape_interval": "15s", "evaluation_interval": "5s"}
    (ranks,) = [j for j in prometheus["scrape_configs"] if j["job_name"] == SCRAPE_JOB_RANKS]
    assert ranks["scrape_interval"] == "5s"
    # No threshold over the shipped ones: the rules are thresholds.yml's, byte for byte.
    assert paths["rules"].read_text() == render(demo_thresholds(pace=shipped))
    assert demo_thresholds(pace=shipped) == Thresholds.from_mapping(
        yaml.safe_load(default_path().read_text())
    )
    job = TrainingJob("j", tmp_path / "ckpt", "", 10, 0.1, 29500, 9500)
    assert ENV_STALL_FLOOR not in Stack(cfg, shipped).training_env(job, "node-a")
    assert Stack(cfg).training_env(job, "node-a")[ENV_STALL_FLOOR] == str(
        DEMO_PACE.hook_stall_floor_seconds
    )
    demo = yaml.safe_load(write_configs(cfg)["prometheus"].read_text())
    assert demo["global"]["evaluation_interval"] == f"{SCRAPE_SECONDS}s"


def test_the_exporter_simulates_gpus_only_where_nvml_sees_none() -> None:
    assert exporter_gpu_args(0) == ["--simulate-gpus", str(SIMULATED_GPUS)]
    assert exporter_gpu_args(8) == []


def _incident(
    failure: str, detected: str, outcome: str | None, recovered: str | None = None
) -> dict[str, Any]:
    return {
        "failure": failure,
        "state": "open" if outcome is None else "closed",
        "outcome": outcome,
        "detected_at": detected,
        "recovered_at": recovered,
    }


def test_reliability_counts_closed_incidents_and_averages_recovery() -> None:
    incidents = [
        _incident("hang", "2026-12-03T10:00:00Z", "recovered", "2026-12-03T10:00:30Z"),
        _incident("oom", "2026-12-03T10:01:00Z", "recovered", "2026-12-03T10:01:50Z"),
        _incident("straggler", "2026-12-03T10:02:00Z", "not_recovered"),
        _incident("straggler", "2026-12-03T10:03:00Z", None),
    ]
    reliability = Reliability.of(incidents)
    assert (reliability.closed, reliability.recovered, reliability.open) == (3, 2, 1)
    assert reliability.success_rate == pytest.approx(2 / 3)
    assert reliability.mttr_s == pytest.approx(40.0)
    assert "success rate 67%" in reliability.line() and "MTTR 40.0 s" in reliability.line()
    assert Reliability.of([]).success_rate is None


def test_a_fault_is_matched_to_the_first_incident_of_its_failure_after_it() -> None:
    injected = datetime(2026, 12, 3, 10, 0, 30, tzinfo=timezone.utc).timestamp()
    before = _incident("hang", "2026-12-03T10:00:00Z", "recovered")
    first = _incident("hang", "2026-12-03T10:00:40Z", "recovered")
    second = _incident("hang", "2026-12-03T10:02:00Z", "worse")
    other = _incident("oom", "2026-12-03T10:00:35Z", "recovered")
    found = incident_of(HANG, injected, [second, before, other, first])
    assert found is first
    assert incident_of(STRAGGLER, injected, [first, other]) is None
