"""The hook on real multi-process gloo jobs (2-4 ranks on this machine's CPU)."""

from __future__ import annotations

import json
import logging
import re
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from tests.instrumentation import scenarios
from tests.instrumentation.harness import run_ranks
from trainguard import contract
from trainguard.diagnose import flight_recorder as fr_analyzer
from trainguard.instrumentation import tracing
from trainguard.instrumentation.worker import MAX_STEPS_WITHOUT_TIMERS

STEPS = 5
# scenarios.straggler: each rank's forward sleeps 40 ms, the slow rank's 1.6 times as long.
STRAGGLER_FORWARD_S = 0.04
STRAGGLER_SLOWDOWN = 1.6
EXEMPLAR = re.compile(
    r"^trainguard_grad_sync_duration_seconds_bucket\{.*\} \S+ # \{trace_id=\"([0-9a-f]{32})\"\}",
    re.M,
)


def _by_name(spans: list[dict[str, Any]], name: str) -> list[dict[str, Any]]:
    return [s for s in spans if s["name"] == name]


def test_every_rank_s_spans_of_a_step_share_one_trace(tmp_path: Path) -> None:
    results = run_ranks(scenarios.spans_and_metrics, 2, tmp_path, per_bucket=False, steps=STEPS)
    for rank, result in enumerate(results):
        syncs = _by_name(result["spans"], contract.SPAN_GRAD_SYNC)
        steps = Counter(s["attributes"][contract.ATTR_STEP] for s in syncs)
        assert steps == {step: 1 for step in range(STEPS)}, f"rank {rank}: one sync per step"
        for span in syncs:
            step = span["attributes"][contract.ATTR_STEP]
            assert span["trace_id"] == tracing.format_trace_id(
                tracing.trace_id_for("job-spans", step)
            )
            assert span["attributes"][contract.ATTR_RANK] == rank
            assert span["attributes"][contract.ATTR_WORLD_SIZE] == 2
            assert span["attributes"][contract.ATTR_BACKEND] == "gloo"
        assert result["grad_sync_count"] == STEPS
        assert result["compute_count"] == STEPS
    # Rank 0 emits each step's root; every rank's per-step span hangs under it.
    roots = {s["span_id"]: s for s in _by_name(results[0]["spans"], contract.SPAN_STEP)}
    assert len(roots) == STEPS
    assert not _by_name(results[1]["spans"], contract.SPAN_STEP)
    for result in results:
        rank_steps = _by_name(result["spans"], contract.SPAN_RANK_STEP)
        assert len(rank_steps) == STEPS
        for span in rank_steps:
            root = roots[span["parent_id"]]
            assert root["trace_id"] == span["trace_id"]
        by_id = {s["span_id"]: s for s in result["spans"]}
        for name in (contract.SPAN_FORWARD, contract.SPAN_BACKWARD, contract.SPAN_OPTIMIZER):
            children = _by_name(result["spans"], name)
            assert len(children) == STEPS
            assert all(by_id[c["parent_id"]]["name"] == contract.SPAN_RANK_STEP for c in children)


def test_bucket_mode_gives_a_span_and_an_observation_per_bucket(tmp_path: Path) -> None:
    results = run_ranks(scenarios.spans_and_metrics, 2, tmp_path, per_bucket=True, steps=STEPS)
    for result in results:
        buckets = result["buckets"]
        assert buckets >= 4
        bucket_spans = _by_name(result["spans"], contract.SPAN_GRAD_SYNC_BUCKET)
        per_step = Counter(s["attributes"][contract.ATTR_STEP] for s in bucket_spans)
        # DDP rebuilds its buckets after the first iteration (the first bucket starts large).
        assert all(per_step[step] == buckets for step in range(1, STEPS)), per_step
        assert 1 <= per_step[0] <= buckets
        assert result["grad_sync_count"] == len(bucket_spans) == buckets * (STEPS - 1) + per_step[0]
        later = [s for s in bucket_spans if s["attributes"][contract.ATTR_STEP] > 0]
        indices = Counter(s["attributes"][contract.ATTR_BUCKET_INDEX] for s in later)
        assert indices == {i: STEPS - 1 for i in range(buckets)}
        assert all(s["attributes"][contract.ATTR_BUCKET_BYTES] > 0 for s in bucket_spans)
        by_id = {s["span_id"]: s for s in result["spans"]}
        assert all(by_id[s["parent_id"]]["name"] == contract.SPAN_GRAD_SYNC for s in bucket_spans)


def test_exemplar_trace_ids_are_those_of_exported_spans(tmp_path: Path) -> None:
    results = run_ranks(scenarios.spans_and_metrics, 2, tmp_path, per_bucket=False, steps=STEPS)
    for result in results:
        exemplars = EXEMPLAR.findall(result["exposition"])
        assert exemplars, "the OpenMetrics exposition carries grad-sync exemplars"
        exported = {s["trace_id"] for s in _by_name(result["spans"], contract.SPAN_GRAD_SYNC)}
        assert set(exemplars) <= exported


def _timing(span: dict[str, Any]) -> str:
    return str(span["attributes"][contract.ATTR_GRAD_SYNC_TIMING])


def test_flush_exports_every_step_and_one_sync_span_per_step_at_the_defaults(
    tmp_path: Path,
) -> None:
    # DDP times iterations 1-10 and every 8th after (runtime_stats_every's default); step s is
    # its iteration s + 1. Its timers reach the hook at the next step's forward, so the last
    # steps are still awaited when flush() is called: they leave all the same, marked unread.
    steps = 30
    timed = {s for s in range(steps) if s + 1 <= 10 or (s + 1) % 8 == 0}
    for rank, result in enumerate(
        run_ranks(scenarios.ddp_defaults_spans, 2, tmp_path, steps=steps)
    ):
        spans = result["at_flush"]
        for name in (contract.SPAN_RANK_STEP, contract.SPAN_FORWARD, contract.SPAN_BACKWARD):
            exported = Counter(s["attributes"][contract.ATTR_STEP] for s in _by_name(spans, name))
            assert exported == {step: 1 for step in range(steps)}, (rank, name)
        syncs = {
            s["attributes"][contract.ATTR_STEP]: s for s in _by_name(spans, contract.SPAN_GRAD_SYNC)
        }
        assert len(_by_name(spans, contract.SPAN_GRAD_SYNC)) == len(syncs) == steps, rank
        reducer = {step for step, s in syncs.items() if _timing(s) == "ddp_reducer"}
        unread = {step for step, s in syncs.items() if _timing(s) == "unread"}
        untimed = {step for step, s in syncs.items() if _timing(s) == "untimed"}
        assert unread and max(syncs) in unread and unread <= set(range(steps - 4, steps))
        assert reducer == timed - unread, rank
        assert untimed == set(range(steps)) - timed - unread, rank
        assert result["grad_sync_count"] == len(timed - unread)
        # Every sync span hangs under its step's rank span and carries the sync's size.
        by_id = {s["span_id"]: s for s in spans}
        for step, sync in syncs.items():
            parent = by_id[sync["parent_id"]]
            assert parent["name"] == contract.SPAN_RANK_STEP
            assert parent["attributes"][contract.ATTR_STEP] == step
            assert sync["attributes"][contract.ATTR_COLLECTIVE_BYTES] > 0
        # uninstrument() sends nothing twice.
        after = result["after_uninstrument"]
        assert len(_by_name(after, contract.SPAN_GRAD_SYNC)) == steps
        assert len(_by_name(after, contract.SPAN_RANK_STEP)) == steps


def test_a_process_that_exits_without_flushing_exports_every_step(tmp_path: Path) -> None:
    steps = 30
    run_ranks(scenarios.exit_without_flush, 2, tmp_path, steps=steps)
    for rank in range(2):
        lines = (tmp_path / f"spans-rank{rank}.jsonl").read_text().splitlines()
        spans = [json.loads(line) for line in lines]
        for name in (contract.SPAN_RANK_STEP, contract.SPAN_GRAD_SYNC):
            exported = Counter(s["attributes"][contract.ATTR_STEP] for s in _by_name(spans, name))
            assert exported == {step: 1 for step in range(steps)}, (rank, name)


@pytest.mark.parametrize("guarded", [False, True], ids=["plain-loop", "guarded-step"])
def test_straggler_is_found_by_compute_time_not_step_time(tmp_path: Path, guarded: bool) -> None:
    steps, slow = 12, 2
    results = run_ranks(
        scenarios.straggler, 4, tmp_path, slow_rank=slow, steps=steps, guarded=guarded
    )
    assert all(r["trainguard_step_duration_seconds_count"] == steps for r in results)
    # The fast ranks wait for the slow one inside the gradient sync.
    injected = STRAGGLER_FORWARD_S * (STRAGGLER_SLOWDOWN - 1)  # extra seconds per step
    scenarios.assert_slow_rank_singled_out(results, slow, injected)


def test_sampled_reducer_timers_observe_every_sampled_step_and_count_every_sync(
    tmp_path: Path,
) -> None:
    steps, every = 40, 4
    # DDP times iterations 1-10 and every 4th after; step s is its iteration s + 1.
    sampled = [s for s in range(steps) if s + 1 <= 10 or (s + 1) % every == 0]
    for result in run_ranks(scenarios.sampled_timers, 2, tmp_path, steps=steps, every=every):
        assert result["timing_source"] == contract.TimingSource.DDP_REDUCER.value
        assert result["steps"] == steps
        assert result["compute_count"] == result["wait_count"] == len(sampled), result
        assert result["grad_sync_count"] == len(sampled), result
        # The first step syncs before DDP rebuilds its buckets (same total size).
        assert result["grad_sync_bytes"] == steps * result["bucket_bytes"], result


def test_a_sleeping_rank_is_caught_as_a_stall_and_named_by_the_dumps(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    sleeper = 2
    results = run_ranks(scenarios.hang, 3, tmp_path, sleeper=sleeper, sleep_s=5.0)
    for rank, result in enumerate(results):
        if rank == sleeper:
            continue
        ages = result["ages"]
        assert max(ages) > 1.5, "the oldest in-flight collective's age grew past the floor"
        peak = ages.index(max(ages))
        assert ages[peak] > ages[max(0, peak - 5)], "and kept growing while the peer slept"
        assert result["stalls"] == 1, "one stall, reported once"
        (event,) = result["events"]
        assert event["details"]["age_seconds"] > 1.5
    folders = {Path(p).parent for r in results for p in r["dumps"]}
    assert len(folders) == 1, "every rank dumped into the same stall folder"
    (folder,) = folders
    assert sorted(p.name for p in folder.glob(f"{contract.FLIGHT_RECORDER_DUMP_PREFIX}*")) == [
        f"{contract.FLIGHT_RECORDER_DUMP_PREFIX}{r}" for r in range(3)
    ]
    # Every rank's spans left when it dumped, the stalled step's too, before the step ended.
    for rank, result in enumerate(results):
        at_stall = result["at_stall"]
        (stall,) = _by_name(at_stall, contract.SPAN_STALL)
        assert stall["attributes"][contract.ATTR_STEP] == 4 and stall["status"] == "ERROR"
        done = Counter(
            s["attributes"][contract.ATTR_STEP] for s in _by_name(at_stall, contract.SPAN_RANK_STEP)
        )
        assert done == {step: 1 for step in range(4)}, rank
        synced = Counter(
            s["attributes"][contract.ATTR_STEP] for s in _by_name(at_stall, contract.SPAN_GRAD_SYNC)
        )
        assert synced == {step: 1 for step in range(4)}, rank
        # Once the step ended, its own span is the stall span's parent.
        by_id = {s["span_id"]: s for s in result["spans"]}
        parent = by_id[stall["parent_id"]]
        assert parent["name"] == contract.SPAN_RANK_STEP
        assert parent["attributes"][contract.ATTR_STEP] == 4
        if rank == sleeper:  # it dumped on a peer's report, with nothing of its own in flight
            assert stall["attributes"][contract.ATTR_COLLECTIVE_OP] == "reported by a peer"
    stacks = (folder / f"{contract.STACKS_DUMP_PREFIX}{sleeper}.txt").read_text()
    assert "time.sleep" in stacks or "sleep(" in stacks
    capfd.readouterr()
    mismatches = fr_analyzer.analyze(folder)
    assert mismatches, "torch's analyzer finds the collective a rank never joined"
    assert {sleeper} == set().union(*(m.missing_ranks for m in mismatches))
    assert "missing ranks" not in capfd.readouterr().err, "its findings come back as values only"
    assert not logging.getLogger(fr_analyzer.ANALYZER_LOGGER).disabled


def test_a_collective_hanging_between_steps_is_caught_too(tmp_path: Path) -> None:
    rank0, rank1 = run_ranks(scenarios.hang_between_steps, 2, tmp_path, sleep_s=4.0)
    (event,) = rank0["events"]
    assert event["details"]["age_seconds"] > 1.5
    assert "all_reduce" in event["details"]["collective"]
    assert rank1["events"] == [], "the sleeping rank has nothing in flight"


def test_lost_reducer_timers_are_counted_and_compute_falls_back_to_wall_clock(
    tmp_path: Path,
) -> None:
    steps = 100
    for result in run_ranks(scenarios.reducer_timers_lost, 2, tmp_path, steps=steps):
        assert result["errors"] == 1, "counted (and logged) once"
        assert result["compute_observed"] == steps - MAX_STEPS_WITHOUT_TIMERS


def test_without_torchrun_the_ranks_share_rank_0_s_job_id_and_differ_in_local_rank(
    tmp_path: Path,
) -> None:
    results = run_ranks(scenarios.without_launcher_env, 3, tmp_path)
    job_ids = {r["job_id"] for r in results}
    assert len(job_ids) == 1 and job_ids.pop().startswith("job-")
    assert [r["local_rank"] for r in results] == [0, 1, 2]


def test_per_bucket_mode_composes_the_user_s_comm_hook(tmp_path: Path) -> None:
    steps = 3
    for result in run_ranks(scenarios.composed_comm_hook, 2, tmp_path, steps=steps):
        assert result["same_gradients"], "fp16 compression applied exactly as without trainguard"
        assert result["buckets_timed"] >= steps
        assert "comm_hook=" in result["refused"], "a hook registered beforehand is refused"


def test_oom_recovery_splits_the_step_and_keeps_the_gradients(tmp_path: Path) -> None:
    results = run_ranks(scenarios.oom_recovery, 2, tmp_path, recovery=True)
    for rank, result in enumerate(results):
        assert result["max_grad_difference"] < 1e-6
        assert result["loss"] == pytest.approx(result["reference_loss"], rel=1e-5)
        assert result["recoveries"] == 1, "both ranks split in lockstep"
        assert result["oom_events"] == (1 if rank == 0 else 0)


@pytest.mark.parametrize("per_bucket", [False, True])
def test_uninstrument_restores_plain_ddp(tmp_path: Path, per_bucket: bool) -> None:
    results = run_ranks(scenarios.uninstrument_roundtrip, 2, tmp_path, per_bucket=per_bucket)
    for result in results:
        assert result["same_handle"], "instrumenting twice returns the same handle"
        assert result["max_param_difference"] == 0.0
        assert result["forward_restored"] and result["step_restored"]
        assert result["threads_left"] == []
        assert result["reinstrument_steps"] == 2
