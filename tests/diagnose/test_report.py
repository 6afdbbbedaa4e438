"""The incident report on a real Prometheus: one job per injected fault (see synthetic.py)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from PIL import Image

from tests.diagnose import synthetic
from tests.diagnose.conftest import HangRun, History
from trainguard.cli import main
from trainguard.contract import Cause
from trainguard.diagnose import Failure, Report, ScopeLevel, diagnose
from trainguard.diagnose.charts import COLLECTIVE_AGE, HEATMAP, MEMORY, PHASES
from trainguard.diagnose.render import markdown


def run(history: History, job_id: str, out: Path, **kwargs: Any) -> Report:
    return diagnose(
        history.url,
        job_id,
        until=history.now,
        thresholds=synthetic.SHIPPED,
        charts_dir=out / "charts",
        **kwargs,
    )


def chart(report: Report, name: str) -> dict[str, Any]:
    """The data behind a chart, after checking its PNG decodes to a real image."""
    (found,) = [c for c in report.charts if c.name == name]
    with Image.open(found.path) as image:
        image.load()
        assert image.format == "PNG"
        assert image.width > 300 and image.height > 200
    return found.data


def causes(report: Report) -> list[str]:
    return [c.cause for c in report.candidates]


def test_one_slow_rank_is_scoped_to_that_rank(history: History, tmp_path: Path) -> None:
    report = run(history, synthetic.STRAGGLER_RANK, tmp_path)
    assert report.failure is Failure.STRAGGLER
    assert report.scope.level is ScopeLevel.RANK
    assert report.scope.ranks == [5]
    assert report.scope.nodes == ["sr-b"]
    top = report.candidates[0]
    assert top.cause == "slow_gpu_or_process"
    assert top.facts["slow_phase"] == "forward"
    assert top.facts["ratio"] == pytest.approx(0.43 / 0.31, rel=0.03)
    assert "gpu_throttling" not in causes(report)
    # Charts: every rank in the heatmap, rank 5 slower than the others after the onset.
    heat = chart(report, HEATMAP)
    assert heat["ranks"] == list(range(8))
    last = [row[-1] for row in heat["values"]]
    assert last[5] == pytest.approx(0.43, rel=0.02)
    assert all(v == pytest.approx(0.31, rel=0.02) for i, v in enumerate(last) if i != 5)
    phases = chart(report, PHASES)
    assert phases["worst_rank"] == 5
    forward = phases["phases"].index("forward")
    assert phases["worst"][forward] == pytest.approx(0.22, rel=0.05)
    assert phases["median"][forward] == pytest.approx(0.1, rel=0.05)
    backward = phases["phases"].index("backward")
    assert phases["worst"][backward] == pytest.approx(phases["median"][backward], rel=0.05)


def test_every_rank_of_one_node_slow_is_scoped_to_the_node(
    history: History, tmp_path: Path
) -> None:
    report = run(history, synthetic.STRAGGLER_NODE, tmp_path)
    assert report.failure is Failure.STRAGGLER
    assert report.scope.level is ScopeLevel.NODE
    assert report.scope.nodes == ["sn-b"]
    assert report.scope.ranks == [4, 5, 6, 7]
    top = report.candidates[0]
    assert top.cause == "node_degraded"
    assert top.facts["slow_phase"] == "backward"
    assert any("Exclude node sn-b" in advice for advice in top.do_now)


def test_thermal_throttling_on_one_node_is_the_top_cause(history: History, tmp_path: Path) -> None:
    report = run(history, synthetic.THERMAL, tmp_path)
    assert report.failure is Failure.STRAGGLER
    assert (report.scope.level, report.scope.nodes) == (ScopeLevel.NODE, ["th-b"])
    top = report.candidates[0]
    assert top.cause == "gpu_throttling"
    assert top.facts["node"] == "th-b"
    assert top.facts["gpus"] == ["0", "1", "2", "3"]
    assert top.facts["reasons"] == ["hw_thermal_slowdown"]
    assert any("91 C" in line for line in top.evidence)
    assert any("Exclude node th-b" in advice for advice in top.do_now)
    assert any("cooling" in advice for advice in top.prevention)
    # The healthy nodes' GPUs are not blamed.
    assert "th-a" not in markdown(report).split("## 3.")[1].split("## 7.")[0]


def test_oom_with_fragmentation_advises_expandable_segments(
    history: History, tmp_path: Path
) -> None:
    log = tmp_path / "rank1.log"
    log.write_text("step 4100 loss 2.31\n" + synthetic.OOM_LOG)
    report = run(history, synthetic.OOM_FRAG, tmp_path, logs=[str(log)])
    assert report.failure is Failure.OOM
    assert (report.scope.level, report.scope.ranks) == (ScopeLevel.RANK, [1])
    top = report.candidates[0]
    assert top.cause == "memory_fragmentation"
    assert top.confidence >= 0.85
    assert top.facts["fragmentation_ratio"] == pytest.approx(0.49, abs=0.03)
    assert top.facts["alloc_retries_before_oom"] > 0
    assert any("expandable_segments:True" in advice for advice in top.do_now)
    assert any(line.startswith("log: CUDA out of memory") for line in top.evidence)
    assert "does_not_fit" not in causes(report)
    memory = chart(report, MEMORY)
    assert memory["rank"] == 1
    assert set(memory["series"]) == {"allocated", "reserved", "capacity"}
    (oom_time,) = memory["oom_times"]
    assert oom_time == pytest.approx(history.now - 3600 + 200 * synthetic.INTERVAL, abs=20)
    reserved_before = [v for t, v in memory["series"]["reserved"] if t < oom_time][-1]
    assert reserved_before > 0.95 * 80 * synthetic.GIB


def test_data_wait_on_every_rank_is_a_job_wide_data_loader_bound(
    history: History, tmp_path: Path
) -> None:
    report = run(history, synthetic.DATA_BOUND, tmp_path)
    assert [s.failure for s in report.symptoms] == [Failure.DATALOADER_BOUND]
    assert report.scope.level is ScopeLevel.JOB
    assert report.scope.ranks == [0, 1]
    assert "every rank waits for data" in report.scope.explanation
    (top,) = report.candidates
    assert top.cause == "data_loading"
    assert top.facts["ranks"] == [0, 1]
    assert any("num_workers" in a and "pin_memory=True" in a for a in top.do_now)
    # Charts: both ranks compute 0.3 s data + 0.1 s forward + 0.2 s backward per step.
    heat = chart(report, HEATMAP)
    assert heat["ranks"] == [0, 1]
    assert all(row[-1] == pytest.approx(0.6, rel=0.02) for row in heat["values"])
    phases = chart(report, PHASES)
    data = phases["phases"].index("data")
    assert phases["worst"][data] == pytest.approx(0.3, rel=0.02)
    assert phases["median"][data] == pytest.approx(0.3, rel=0.02)


def test_every_rank_slowing_together_is_a_job_wide_slowdown(
    history: History, tmp_path: Path
) -> None:
    report = run(history, synthetic.JOB_SLOW, tmp_path)
    assert [s.failure for s in report.symptoms] == [Failure.JOB_SLOWDOWN]
    assert report.scope.level is ScopeLevel.JOB
    assert report.scope.ranks == [0, 1]
    assert report.scope.explanation == "all ranks at once: data, storage, network or the code"
    onset = history.now - 3600 + synthetic.JOB_SLOW_FROM * synthetic.INTERVAL
    # The 5-minute means cross 1.3x the earlier median within the first minutes of the onset.
    since = report.symptoms[0].since
    assert since is not None and onset <= since <= onset + 300
    (top,) = report.candidates
    assert top.cause == "shared_dependency"
    assert top.facts["before"] == pytest.approx(0.31, rel=0.02)
    assert top.facts["after"] == pytest.approx(0.51, rel=0.02)
    assert any("shared file system and network" in a for a in top.do_now)
    assert "job:trainguard_steps:rate5m" in top.prevention[0]
    heat = chart(report, HEATMAP)
    assert heat["ranks"] == [0, 1]
    # The query grid can fall on the onset itself, within the float and millisecond rounding
    # of the sample times, and that point holds the first slowed sample: "before" ends half an
    # interval earlier.
    clean_until = onset - synthetic.INTERVAL / 2
    for row in heat["values"]:
        before = [
            v for t, v in zip(heat["times"], row, strict=True) if v is not None and t < clean_until
        ]
        assert before[-1] == pytest.approx(0.31, rel=0.02)
        assert row[-1] == pytest.approx(0.51, rel=0.02)


def test_oom_after_steady_growth_blames_the_growing_rank(history: History, tmp_path: Path) -> None:
    report = run(history, synthetic.OOM_GROWTH, tmp_path)
    assert report.failure is Failure.OOM
    assert (report.scope.level, report.scope.ranks, report.scope.nodes) == (
        ScopeLevel.RANK,
        [1],
        ["og-a"],
    )
    assert causes(report) == ["memory_growth"]
    top = report.candidates[0]
    assert top.facts["rank"] == 1
    # Allocated climbs 0.15 GiB per point: about 59.7 GiB just before the OOM at point 200,
    # 42 GiB half an hour earlier.
    assert top.facts["allocated_bytes"] == pytest.approx(59.7 * synthetic.GIB, rel=0.01)
    assert any("allocated grew 1.4" in line for line in top.evidence)
    assert any("tensors kept across steps" in advice for advice in top.do_now)
    assert any("TrainingOOMRisk" in advice for advice in top.prevention)
    memory = chart(report, MEMORY)
    assert memory["rank"] == 1
    (oom_time,) = memory["oom_times"]
    assert oom_time == pytest.approx(history.now - 3600 + 200 * synthetic.INTERVAL, abs=20)
    allocated = [v for t, v in memory["series"]["allocated"] if v is not None and t < oom_time]
    assert allocated == sorted(allocated)
    assert allocated[0] == pytest.approx(30 * synthetic.GIB, rel=0.01)
    assert allocated[-1] == pytest.approx(59.7 * synthetic.GIB, rel=0.01)


def test_oom_near_capacity_on_every_rank_does_not_fit(history: History, tmp_path: Path) -> None:
    report = run(history, synthetic.OOM_NO_FIT, tmp_path)
    assert report.failure is Failure.OOM
    assert (report.scope.level, report.scope.ranks) == (ScopeLevel.JOB, [0, 1])
    assert "do not fit this GPU" in report.scope.explanation
    assert causes(report) == ["does_not_fit"]
    top = report.candidates[0]
    assert top.facts["rank"] == 1  # the first rank to fail
    assert top.facts["allocated_bytes"] == pytest.approx(74 * synthetic.GIB)
    assert top.facts["capacity_bytes"] == pytest.approx(80 * synthetic.GIB)
    assert any("allocated 74.0 GiB, reserved 76.0 GiB of 80.0 GiB" in e for e in top.evidence)
    assert any("gradient accumulation" in advice for advice in top.do_now)
    assert any("activation checkpointing" in advice for advice in top.prevention)
    memory = chart(report, MEMORY)
    assert memory["rank"] == 1
    (oom_time,) = memory["oom_times"]
    assert oom_time == pytest.approx(history.now - 3600 + 60 * synthetic.INTERVAL, abs=20)
    assert {v for _, v in memory["series"]["allocated"] if v is not None} == {74 * synthetic.GIB}


def test_oom_the_memory_series_do_not_explain_says_so(history: History, tmp_path: Path) -> None:
    report = run(history, synthetic.OOM_UNEXPLAINED, tmp_path)
    assert report.failure is Failure.OOM
    assert (report.scope.level, report.scope.ranks) == (ScopeLevel.RANK, [0])
    (top,) = report.candidates
    assert top.cause == "oom_unexplained"
    assert top.facts["allocated_bytes"] == pytest.approx(40 * synthetic.GIB)
    assert any("smaller micro-batch" in advice for advice in top.do_now)
    assert any("_record_memory_history" in advice for advice in top.prevention)
    assert chart(report, MEMORY)["rank"] == 0


def test_a_mild_straggler_is_named_by_its_compute_share(history: History, tmp_path: Path) -> None:
    # 1.19x in step compute, under straggler_factor (1.2): the means alone find no straggler,
    # but its share of the step stays 1.19x its job's, where TrainingStraggler's fast rule fires.
    report = run(history, synthetic.STRAGGLER_MILD, tmp_path)
    assert report.failure is Failure.STRAGGLER
    assert report.scope.ranks == [2]
    straggler = next(x for x in report.symptoms if x.failure is Failure.STRAGGLER)
    assert straggler.ranks == [2]
    onset = history.now - 3600 + 80 * synthetic.INTERVAL
    assert straggler.since is not None
    # (times are reported to the millisecond)
    assert onset - 0.001 <= straggler.since <= onset + 2 * synthetic.INTERVAL
    assert report.candidates[0].facts["ratio"] == pytest.approx(1.19, rel=0.02)


def test_uncorrectable_ecc_errors_drain_that_gpu_s_node(history: History, tmp_path: Path) -> None:
    report = run(history, synthetic.ECC, tmp_path)
    # Corrected errors on ec-a are not a fault.
    assert [s.failure for s in report.symptoms] == [Failure.GPU_FAULT]
    assert report.symptoms[0].summary == "2 uncorrectable ECC error(s) on GPU 0 of node ec-b"
    onset = history.now - 3600 + 150 * synthetic.INTERVAL
    assert report.symptoms[0].since == pytest.approx(onset, abs=20)
    assert report.scope.level is ScopeLevel.NODE
    assert (report.scope.nodes, report.scope.gpus, report.scope.ranks) == (["ec-b"], ["0"], [1])
    (top,) = report.candidates
    assert top.cause == "gpu_ecc_uncorrectable"
    assert top.facts == {"node": "ec-b", "gpu": "0"}
    assert any("Drain node ec-b" in advice for advice in top.do_now)
    assert any("dcgmi diag -r 3" in advice for advice in top.prevention)
    assert chart(report, HEATMAP)["ranks"] == [0, 1]


def test_xid_79_drains_the_node_of_the_dead_rank(history: History, tmp_path: Path) -> None:
    report = run(history, synthetic.XID, tmp_path)
    assert report.failure is Failure.GPU_FAULT
    assert report.scope.level is ScopeLevel.NODE
    assert (report.scope.nodes, report.scope.gpus, report.scope.ranks) == (["xi-b"], ["2"], [6])
    top = report.candidates[0]
    assert top.cause is Cause.GPU_XID and top.facts["xid"] == 79
    assert top.facts["drain"] == "now"
    assert any("Drain node xi-b now" in advice for advice in top.do_now)
    # The hang that follows is reported too, as a consequence waiting for rank 6.
    assert Failure.HANG in [s.failure for s in report.symptoms]
    stall = next(c for c in report.candidates if c.cause == "rank_never_joined")
    assert stall.facts["suspect_ranks"] == [6]
    assert stall.confidence < top.confidence
    died = history.now - 3600 + 150 * synthetic.INTERVAL
    assert any("rank 6 (GPU 2) stopped reporting" in line for line in top.evidence)
    assert chart(report, COLLECTIVE_AGE)["suspect_ranks"] == [6]
    assert report.symptoms[0].since == pytest.approx(died, abs=20)


def test_hang_names_the_rank_and_collective_from_flight_recorder_dumps(
    history: History, hang: HangRun, tmp_path: Path
) -> None:
    report = run(history, synthetic.HANG, tmp_path, dumps=hang.dumps, logs=[str(hang.logs)])
    assert report.failure is Failure.HANG
    assert (report.scope.level, report.scope.ranks) == (ScopeLevel.RANK, [2])
    top = report.candidates[0]
    assert top.cause == "rank_never_joined"
    assert top.confidence >= 0.85
    assert top.facts["suspect_ranks"] == [2]
    assert "all_reduce" in top.facts["collective"]
    assert top.summary.startswith(
        f"Rank 2 never joined collective #{top.facts['collective_seq_id']}"
    )
    analyzer = [e for e in top.evidence if e.startswith("torch's Flight Recorder analyzer")]
    assert analyzer and "never joined by rank 2" in analyzer[0]
    stack = next(e for e in top.evidence if e.startswith("main-thread stack of rank 2"))
    assert "sleep" in stack
    assert any(e.startswith("event collective_stalled") for e in top.evidence)
    # The recommended timeout comes from the observed gradient-sync tail (p99.9 about 9 s).
    assert top.facts["recommended_timeout_seconds"] == 90
    (prevent,) = [p for p in report.prevention if p.cause == "rank_never_joined"]
    timeout = next(s for s in prevent.settings if s.name == "init_process_group(timeout=...)")
    assert timeout.value == "timedelta(seconds=90)"
    age = chart(report, COLLECTIVE_AGE)
    assert set(age["ranks"]) == {"0", "1", "2"}
    assert age["threshold_seconds"] == synthetic.SHIPPED.collective_stall_floor_seconds == 40
    assert max(v for _, v in age["ranks"]["0"] if v is not None) > 500
    assert all(not v for _, v in age["ranks"]["2"])


def test_history_held_only_by_the_recording_rules_is_read(history: History, tmp_path: Path) -> None:
    report = run(history, synthetic.RECORDED, tmp_path)
    assert report.failure is Failure.STRAGGLER
    assert report.scope.ranks == [2]
    assert report.candidates[0].facts["ratio"] == pytest.approx(1.5, rel=0.01)
    assert "chart phase_breakdown: no data in the window" in report.notes


def test_logs_alone_reveal_an_nccl_timeout_and_xids_of_the_job_s_nodes(
    history: History, tmp_path: Path
) -> None:
    fixtures = Path(__file__).parents[1] / "triage" / "fixtures"
    report = run(
        history,
        synthetic.HEALTHY,
        tmp_path,
        logs=[str(fixtures / "nccl_timeout"), str(fixtures / "kern.log")],
    )
    assert Failure.NCCL_TIMEOUT in [s.failure for s in report.symptoms]
    stall = next(c for c in report.candidates if c.cause == "rank_never_joined")
    # triage's parser: rank 3 enqueued fewer collectives than the ranks that timed out.
    assert stall.facts["suspect_ranks"] == [3]
    assert any(e.startswith("log: NCCL ALLREDUCE (SeqNum=4821) timed out") for e in stall.evidence)
    # Xids logged by hosts that are not this job's nodes are set aside, with a note.
    assert "xid_79" not in causes(report)
    assert any("gpu-node-07" in note and note.startswith("ignored") for note in report.notes)


def test_a_healthy_job_reports_nothing(history: History, tmp_path: Path) -> None:
    report = run(history, synthetic.HEALTHY, tmp_path)
    assert report.symptoms == [] and report.candidates == []
    assert report.scope.level is ScopeLevel.UNKNOWN
    assert "No failure found" in markdown(report)


def test_a_rank_slow_only_while_warming_up_is_no_straggler(
    history: History, tmp_path: Path
) -> None:
    # Its compute share reads 1.2x its job's for its first 44 steps (150 s), past the fast
    # rule's hold; the rule waits for the warm-up (warmup_steps), and so does diagnose.
    report = run(history, synthetic.WARM_UP, tmp_path)
    assert report.symptoms == [], [x.summary for x in report.symptoms]


def test_the_command_writes_markdown_charts_and_json(
    history: History, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "report"
    code = main(
        [
            "diagnose",
            "--prometheus",
            history.url,
            "--job-id",
            synthetic.THERMAL,
            "--since",
            "2h",
            "--until",
            str(history.now),
            "--out",
            str(out),
            "--json",
        ]
    )
    assert code == 1
    assert "scope: node" in capsys.readouterr().out
    text = (out / "report.md").read_text()
    headings = [text.index(h) for h in ("## 1. Symptom", "## 2. Scope", "## 3. Root-cause",
                                        "## 4. What to do now", "## 5. Validate",
                                        "## 6. Prevent", "## 7. Charts")]  # fmt: skip
    assert headings == sorted(headings)
    for name in (HEATMAP, PHASES, MEMORY):
        assert f"(charts/{name}.png)" in text
        assert (out / "charts" / f"{name}.png").is_file()
    data = json.loads((out / "report.json").read_text())
    assert data["failure"] == "straggler"
    assert data["scope"]["level"] == "node"
    assert data["candidates"][0]["cause"] == "gpu_throttling"
    assert {c["name"] for c in data["charts"]} == {HEATMAP, PHASES, MEMORY}
    assert data["charts"][0]["data"]["ranks"] == list(range(12))


def test_an_unknown_job_is_a_clear_error(
    history: History, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(["diagnose", "--prometheus", history.url, "--job-id", "no-such-job", "--no-charts"])
    assert code == 2
    err = capsys.readouterr().err
    assert "no trainguard series for job_id='no-such-job'" in err


def test_a_gpu_fallen_off_the_bus_without_an_xid_drains_its_node(
    history: History, tmp_path: Path
) -> None:
    kern = tmp_path / "kern.log"
    kern.write_text(
        "Jun 02 13:13:04 ok-a kernel: NVRM: GPU 0000:29:00.0: GPU has fallen off the bus.\n"
    )
    report = run(history, synthetic.HEALTHY, tmp_path, logs=[str(kern)])
    (fault,) = [c for c in report.candidates if c.cause is Cause.GPU_DRIVER_EVENT]
    assert fault.facts["node"] == "ok-a" and fault.facts["event"] == "fallen_off_bus"
    assert fault.facts["drain"] == "now"  # like Xid 79, what it amounts to
    assert fault.do_now[0].startswith("Drain node ok-a now")
    assert Failure.GPU_FAULT in [s.failure for s in report.symptoms]
