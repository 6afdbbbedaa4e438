"""The hook on FSDP2 (``fully_shard``) and FSDP1 (``FullyShardedDataParallel``) gloo jobs.

The DDP counterparts are in ``test_distributed.py``. Most tests read one job per parallelism
(the module-scoped ``job`` fixture, see :func:`sharded.sharded_training`): spawning ranks is
most of the cost on this 2-core machine.
"""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from tests.instrumentation import scenarios, sharded
from tests.instrumentation.harness import run_ranks
from trainguard import contract
from trainguard.diagnose import flight_recorder as fr_analyzer
from trainguard.instrumentation import tracing

WORLD = 3
SLOW_RANK = 1
WARMUP, STEPS, BUCKET_STEPS = 3, 10, 3
# Each rank's forward sleeps FORWARD_S (spread over the blocks), the slow rank's SLOWDOWN times
# as long. More than the DDP test's 40 ms x 1.6: FSDP's per-step Python work (hooks, collectives
# per unit) is far more, and on a loaded machine, where ranks get unequal shares of the cores,
# its cost differs between ranks by tens of milliseconds per step.
FORWARD_S = 0.1
SLOWDOWN = 2.0
EXEMPLAR = re.compile(
    r"^trainguard_(grad_sync|param_gather)_duration_seconds_bucket\{.*\} \S+ "
    r"# \{trace_id=\"([0-9a-f]{32})\"\}",
    re.M,
)
PARALLELISMS = [sharded.FSDP2, sharded.FSDP1]
Job = tuple[str, list[dict[str, Any]]]  # the parallelism and every rank's result


@pytest.fixture(scope="module", params=PARALLELISMS)
def job(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Job:
    parallelism: str = request.param
    results = run_ranks(
        sharded.sharded_training,
        WORLD,
        tmp_path_factory.mktemp(parallelism),
        parallelism=parallelism,
        forward_s=FORWARD_S,
        slowdown=SLOWDOWN,
        slow_rank=SLOW_RANK,
        warmup=WARMUP,
        steps=STEPS,
        bucket_steps=BUCKET_STEPS,
    )
    return parallelism, results


def _by_name(spans: list[dict[str, Any]], name: str) -> list[dict[str, Any]]:
    return [s for s in spans if s["name"] == name]


def _step(span: dict[str, Any]) -> int:
    step: int = span["attributes"][contract.ATTR_STEP]
    return step


def test_rank_info_names_the_parallelism_and_the_timeline_as_timing_source(job: Job) -> None:
    parallelism, results = job
    for result in results:
        traced = result["traced"]
        assert traced["parallelism"] == parallelism
        assert traced["timing_source"] == contract.TimingSource.COLLECTIVE_TIMELINE.value
        info = traced["rank_info"]
        assert info[contract.LABEL_PARALLELISM] == parallelism
        assert info[contract.LABEL_TIMING_SOURCE] == "collective_timeline"
        assert info[contract.LABEL_BACKEND] == "gloo"


def test_a_slow_rank_is_found_by_compute_time_and_its_peers_wait_for_it(job: Job) -> None:
    _, results = job
    totals = [r["traced"]["straggler"] for r in results]
    assert all(t["trainguard_step_duration_seconds_count"] == STEPS for t in totals)
    assert all(t["trainguard_step_compute_duration_seconds_count"] == STEPS for t in totals)
    # Every step ends on every rank together, the slow rank has the most compute, and its peers
    # spend that time blocked in the all-gathers and reduce-scatters it joins late.
    scenarios.assert_slow_rank_singled_out(totals, SLOW_RANK, FORWARD_S * (SLOWDOWN - 1))


def test_every_rank_s_spans_of_a_step_share_one_trace(job: Job) -> None:
    parallelism, results = job
    job_id = f"job-{parallelism}"
    total = WARMUP + STEPS
    expected = {
        step: tracing.format_trace_id(tracing.trace_id_for(job_id, step)) for step in range(total)
    }
    # Rank 0 emits each step's root; every rank's per-step span hangs under it.
    roots = {s["span_id"]: s for s in _by_name(results[0]["traced"]["spans"], contract.SPAN_STEP)}
    assert sorted(_step(s) for s in roots.values()) == list(range(total))
    for rank, result in enumerate(results):
        spans = result["traced"]["spans"]
        assert rank == 0 or not _by_name(spans, contract.SPAN_STEP), "only rank 0 emits roots"
        assert all(s["trace_id"] == expected[_step(s)] for s in spans), f"rank {rank}"
        by_id = {s["span_id"]: s for s in spans}
        rank_steps = _by_name(spans, contract.SPAN_RANK_STEP)
        assert sorted(_step(s) for s in rank_steps) == list(range(total))
        for span in rank_steps:
            assert _step(roots[span["parent_id"]]) == _step(span)
            assert span["attributes"][contract.ATTR_RANK] == rank
        for name in (
            contract.SPAN_FORWARD,
            contract.SPAN_BACKWARD,
            contract.SPAN_OPTIMIZER,
            contract.SPAN_GRAD_SYNC,
            contract.SPAN_PARAM_GATHER,
        ):
            children = _by_name(spans, name)
            assert Counter(_step(s) for s in children) == {s: 1 for s in range(total)}, name
            for child in children:
                parent = by_id[child["parent_id"]]
                assert parent["name"] == contract.SPAN_RANK_STEP, name
                assert _step(parent) == _step(child)
        units = result["traced"]["units"]
        for span in _by_name(spans, contract.SPAN_GRAD_SYNC):
            attributes = span["attributes"]
            assert attributes[contract.ATTR_PROCESS_GROUP] == "default_pg"
            assert attributes[contract.ATTR_COLLECTIVE_OP] == "reduce_scatter"
            assert attributes[contract.ATTR_COLLECTIVE_COUNT] == units, "one per unit"
        for span in _by_name(spans, contract.SPAN_PARAM_GATHER):
            attributes = span["attributes"]
            assert attributes[contract.ATTR_PROCESS_GROUP] == "default_pg"
            assert attributes[contract.ATTR_COLLECTIVE_OP] == "all_gather"
            assert attributes[contract.ATTR_COLLECTIVE_COUNT] >= units, "each unit gathered"
        counts = result["traced"]["counts"]
        for histogram in (
            "step_compute_duration_seconds",
            "sync_wait_duration_seconds",
            "grad_sync_duration_seconds",
            "param_gather_duration_seconds",
        ):
            assert counts[histogram] == total, f"one {histogram} observation per step"


def test_exemplar_trace_ids_are_those_of_exported_spans(job: Job) -> None:
    _, results = job
    for result in results:
        traced = result["traced"]
        found = EXEMPLAR.findall(traced["exposition"])
        for kind, span_name in (
            ("grad_sync", contract.SPAN_GRAD_SYNC),
            ("param_gather", contract.SPAN_PARAM_GATHER),
        ):
            exemplars = {trace_id for k, trace_id in found if k == kind}
            assert exemplars, f"the OpenMetrics exposition carries {kind} exemplars"
            exported = {s["trace_id"] for s in _by_name(traced["spans"], span_name)}
            assert exemplars <= exported


def test_bucket_mode_gives_an_observation_and_a_span_per_unit_and_per_gather(job: Job) -> None:
    _, results = job
    for result in results:
        bucketed = result["bucketed"]
        units = result["traced"]["units"]
        assert units == sharded.BLOCKS + 1, "every block, and the root with its head"
        first = bucketed["first_step"]
        steps = range(first, first + BUCKET_STEPS)
        spans = bucketed["spans"]
        by_id = {s["span_id"]: s for s in spans}
        units_synced = _by_name(spans, contract.SPAN_GRAD_SYNC_BUCKET)
        assert Counter(_step(s) for s in units_synced) == {step: units for step in steps}
        for step in steps:
            indices = sorted(
                s["attributes"][contract.ATTR_BUCKET_INDEX]
                for s in units_synced
                if _step(s) == step
            )
            assert indices == list(range(units))
        assert all(by_id[s["parent_id"]]["name"] == contract.SPAN_GRAD_SYNC for s in units_synced)
        assert all(s["attributes"][contract.ATTR_COLLECTIVE_BYTES] > 0 for s in units_synced)
        counts = bucketed["counts"]
        assert counts["grad_sync_duration_seconds"] == units * BUCKET_STEPS == len(units_synced)
        # One observation per all-gather, as torch's Flight Recorder counted them.
        gathers = bucketed["fr_all_gathers"]
        assert gathers >= units * BUCKET_STEPS, "every unit is gathered at least once per step"
        gathered = _by_name(spans, contract.SPAN_PARAM_GATHER_UNIT)
        assert counts["param_gather_duration_seconds"] == gathers == len(gathered)
        assert all(by_id[s["parent_id"]]["name"] == contract.SPAN_PARAM_GATHER for s in gathered)
        # Other collectives get a span each in this mode.
        others = _by_name(spans, contract.SPAN_COLLECTIVE)
        assert Counter(_step(s) for s in others) == {step: 1 for step in steps}
        assert all(s["attributes"][contract.ATTR_COLLECTIVE_COUNT] == 1 for s in others)


def test_a_collective_on_another_process_group_is_not_gradient_sync(job: Job) -> None:
    _, results = job
    total = WARMUP + STEPS
    for result in results:
        traced = result["traced"]
        spans = traced["spans"]
        by_id = {s["span_id"]: s for s in spans}
        others = _by_name(spans, contract.SPAN_COLLECTIVE)
        # The loop's all-reduce over the "tp" group: one span per step, under the rank's step.
        assert Counter(_step(s) for s in others) == {step: 1 for step in range(total)}
        for span in others:
            attributes = span["attributes"]
            assert attributes[contract.ATTR_PROCESS_GROUP] == sharded.TP_GROUP
            assert attributes[contract.ATTR_COLLECTIVE_OP] == "all_reduce"
            assert attributes[contract.ATTR_COLLECTIVE_COUNT] == 1
            assert attributes[contract.ATTR_COLLECTIVE_BYTES] == 4, "the float32 loss"
            assert by_id[span["parent_id"]]["name"] == contract.SPAN_RANK_STEP
        # Gradient bytes are the reduce-scatters' alone.
        syncs = _by_name(spans, contract.SPAN_GRAD_SYNC)
        assert traced["grad_sync_bytes"] == sum(
            s["attributes"][contract.ATTR_COLLECTIVE_BYTES] for s in syncs
        )
        assert traced["grad_sync_bytes"] > 0


def test_oom_recovery_splits_the_step_and_keeps_the_gradients(job: Job) -> None:
    _, results = job
    for result in results:
        oom = result["oom"]
        assert "error" not in oom, oom.get("error")
        for name, step in oom.items():
            assert step["max_grad_difference"] < 1e-6, name
            assert step["loss"] == pytest.approx(step["reference_loss"], rel=1e-5), name
        first, split, backward = oom["forward_oom"], oom["split"], oom["backward_oom"]
        assert first["oom_events"] == 1, "every rank ran out of memory once in its forward"
        assert first["recoveries"] == 1
        assert first["micro_batches"] == split["micro_batches"] == 2
        assert split["recoveries"] == 1, "later steps keep the split"
        # An OOM in a micro-batch's backward, after other units accumulated their gradients:
        # those are dropped with the failed attempt, not added to the retry's.
        assert backward["micro_batches"] == 4
        assert backward["recoveries"] == 2


@pytest.mark.parametrize("parallelism", PARALLELISMS)
def test_a_rank_that_never_joins_a_reduce_scatter_is_named(
    tmp_path: Path, parallelism: str, capfd: pytest.CaptureFixture[str]
) -> None:
    sleeper = 2
    results = run_ranks(
        sharded.reduce_scatter_hang,
        WORLD,
        tmp_path,
        parallelism=parallelism,
        sleeper=sleeper,
        sleep_s=4.0,
    )
    # gloo runs a reduce-scatter as an all-reduce: the Flight Recorder (and so the event and
    # the analyzer) may call it all_reduce. This model issues no other all-reduce on the
    # default group, and all-gathers are named as such: either name is the gradient sync.
    gradient_sync = ("reduce_scatter", "all_reduce")
    for rank, result in enumerate(results):
        if rank == sleeper:
            assert result["events"] == [], "the sleeping rank has nothing in flight"
            continue
        assert result["stalls"] == 1, "one stall, reported once"
        (event,) = result["events"]
        details = event["details"]
        assert details["process_group"] == "default_pg"
        assert any(op in details["collective"] for op in gradient_sync), details
        assert details["age_seconds"] > 1.0
    folders = {Path(p).parent for r in results for p in r["dumps"]}
    assert len(folders) == 1, "every rank dumped into the same stall folder"
    (folder,) = folders
    assert sorted(p.name for p in folder.glob(f"{contract.FLIGHT_RECORDER_DUMP_PREFIX}*")) == [
        f"{contract.FLIGHT_RECORDER_DUMP_PREFIX}{r}" for r in range(WORLD)
    ]
    stacks = (folder / f"{contract.STACKS_DUMP_PREFIX}{sleeper}.txt").read_text()
    assert "time.sleep" in stacks or "sleep(" in stacks
    capfd.readouterr()
    mismatches = fr_analyzer.analyze(folder)
    assert mismatches, "torch's analyzer finds the collective a rank never joined"
    assert {sleeper} == set().union(*(m.missing_ranks for m in mismatches))
    for mismatch in mismatches:
        # The analyzer names a group "<name>:<description>".
        assert mismatch.process_group.rsplit(":", 1)[-1] == "default_pg", mismatch
        assert any(op in mismatch.name for op in gradient_sync), mismatch
