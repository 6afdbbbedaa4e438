"""The collective timeline: the wraps of torch.distributed's functions, what they record, and
the pure functions the worker computes the straggler split from."""

from __future__ import annotations

import datetime
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
from prometheus_client import CollectorRegistry

from trainguard import contract
from trainguard.instrumentation import flight_recorder, timeline
from trainguard.instrumentation.config import Identity
from trainguard.instrumentation.errors import ErrorBudget
from trainguard.instrumentation.metrics import RankMetrics
from trainguard.instrumentation.records import RawStep, StepRecord
from trainguard.instrumentation.timeline import INTERCEPTOR, Collective, Role, Roles, Timeline
from trainguard.instrumentation.worker import StepWorker


def entry(start: int, end: int, *, blocking: bool = True, op: str = "all_gather") -> Collective:
    return Collective(op, None, 64, start, end, blocking)


def test_blocked_time_is_the_union_of_blocking_collectives_within_the_window() -> None:
    entries = [
        entry(10, 20),
        entry(15, 30),  # overlaps the first: counted once
        entry(40, 50, blocking=False),  # async: the thread did not wait in the call
        entry(90, 120),  # runs past the window's end: clipped
        entry(0, 5),  # before the window
    ]
    assert timeline.blocked_ns(entries, 8, 100) == (30 - 10) + (100 - 90)
    assert timeline.blocked_ns([], 0, 100) == 0


class FakeGroup:
    def __init__(self, name: str, desc: str) -> None:
        self.group_name = name
        self.group_desc = desc


def test_roles_follow_the_model_s_shard_and_replicate_groups() -> None:
    shard, replicate, tp = (
        FakeGroup("3", "mesh_shard"),
        FakeGroup("1", "mesh_rep"),
        FakeGroup("5", "tp"),
    )
    roles = Roles(frozenset({"3"}), frozenset({"1"}))

    def role(op: str, group: Any) -> Role:
        return roles.of(Collective(op, group, 0, 0, 0, True))

    assert role("reduce_scatter", shard) is Role.GRAD_SYNC
    assert role("all_reduce", replicate) is Role.GRAD_SYNC  # HSDP across replicas
    assert role("all_gather", shard) is Role.PARAM_GATHER
    assert role("all_reduce", tp) is Role.OTHER
    assert role("all_gather", tp) is Role.OTHER
    assert role("broadcast", shard) is Role.OTHER


def test_group_names_are_readable_and_bounded() -> None:
    names = timeline.GroupNames()
    assert names(FakeGroup("7", "tp")) == "tp"
    assert names(FakeGroup("8", "undefined")) == "pg8"
    for index in range(100, 100 + timeline.MAX_GROUP_NAMES):
        names(FakeGroup(str(index), f"dynamic{index}"))
    assert names(FakeGroup("999", "one-too-many")) == timeline.OTHER_GROUP
    assert names(FakeGroup("7", "tp")) == "tp", "groups already named keep their name"


def test_flight_recorder_entries_name_their_group_the_same_way() -> None:
    assert flight_recorder.group_label(["0", "default_pg"]) == "default_pg"
    assert flight_recorder.group_label(["4", "undefined"]) == "pg4"
    assert flight_recorder.group_label(None) is None
    state = {
        "entries": [
            {
                "collective_seq_id": 3,
                "process_group": ["2", "mesh_dp_shard"],
                "time_created_ns": 1,
                "profiling_name": "gloo:all_reduce",
            }
        ]
    }
    assert flight_recorder.pending_collectives(state, 10).oldest_group == "mesh_dp_shard"


@pytest.fixture
def world_of_one(tmp_path: Path) -> Iterator[None]:
    dist.init_process_group(
        "gloo",
        init_method=f"file://{tmp_path / 'store'}",
        rank=0,
        world_size=1,
        timeout=datetime.timedelta(seconds=30),
    )
    try:
        yield
    finally:
        dist.destroy_process_group()


def rank_metrics() -> tuple[CollectorRegistry, RankMetrics, dict[str, str]]:
    registry = CollectorRegistry()
    identity = Identity(job_id="job-t", rank=0, local_rank=0, world_size=1, node="n")
    return registry, RankMetrics(registry, identity.labels()), identity.labels()


def budget() -> tuple[ErrorBudget, CollectorRegistry, dict[str, str]]:
    registry, metrics, labels = rank_metrics()
    return ErrorBudget(metrics.instrumentation_errors, labels), registry, labels


@pytest.mark.usefixtures("world_of_one")
def test_wrapped_collectives_are_recorded_while_the_timeline_is_current() -> None:
    original = dist.all_reduce
    errors, _, _ = budget()
    recorded = Timeline(errors)
    assert INTERCEPTOR.attach(recorded)
    try:
        assert dist.all_reduce is not original
        tensor = torch.ones(8)
        dist.all_reduce(tensor)  # not current yet: passes straight through
        assert recorded.entries == []
        INTERCEPTOR.current = recorded
        dist.all_reduce(tensor)
        work = dist.all_reduce(tensor, async_op=True)
        assert work is not None
        work.wait()
        dist.barrier()
        gathered = torch.empty(8)
        dist.all_gather_single(gathered, tensor)
        raw, overflow = recorded.take()
    finally:
        INTERCEPTOR.detach(recorded)
    entries = timeline.resolve(raw)
    assert dist.all_reduce is original, "detaching the last timeline restores torch's function"
    assert overflow == 0
    assert [(e.op, e.blocking, e.nbytes) for e in entries] == [
        ("all_reduce", True, 32),
        ("all_reduce", False, 32),
        ("barrier", True, 0),
        ("all_gather", True, 32),
    ]
    assert all(e.end_ns >= e.start_ns > 0 for e in entries), "async ends come from the future"
    assert recorded.take() == ([], 0)


@pytest.mark.usefixtures("world_of_one")
def test_a_failure_while_recording_is_counted_and_the_collective_still_runs() -> None:
    errors, registry, labels = budget()
    recorded = Timeline(errors)

    class Broken(list[Any]):
        def append(self, _entry: Any) -> None:
            raise RuntimeError("recording broke")

    recorded.entries = Broken()
    assert INTERCEPTOR.attach(recorded)
    INTERCEPTOR.current = recorded
    try:
        tensor = torch.ones(4)
        dist.all_reduce(tensor)
    finally:
        INTERCEPTOR.detach(recorded)
    assert torch.equal(tensor, torch.ones(4))
    component = {**labels, "component": "timeline"}
    assert registry.get_sample_value("trainguard_instrumentation_errors_total", component) == 1


@pytest.mark.usefixtures("world_of_one")
def test_the_wraps_stay_until_the_last_timeline_detaches() -> None:
    original = dist.reduce_scatter_tensor
    errors, _, _ = budget()
    first, second = Timeline(errors), Timeline(errors)
    assert INTERCEPTOR.attach(first) and INTERCEPTOR.attach(second)
    INTERCEPTOR.detach(first)
    assert dist.reduce_scatter_tensor is not original
    INTERCEPTOR.detach(first)  # twice: harmless
    INTERCEPTOR.detach(second)
    assert dist.reduce_scatter_tensor is original
    assert INTERCEPTOR.current is None


def test_a_step_that_issues_too_many_collectives_keeps_the_first_and_counts_the_rest() -> None:
    errors, _, _ = budget()
    recorded = Timeline(errors)
    signature = timeline._signature("all_reduce", "all_reduce", "tensor")
    assert signature is not None
    wrapped = INTERCEPTOR._wrapper("all_reduce", signature, lambda *_args, **_kwargs: None)
    tensor = torch.ones(2)
    saved, INTERCEPTOR.current = INTERCEPTOR.current, recorded
    try:
        for _ in range(timeline.MAX_COLLECTIVES_PER_STEP + 3):
            wrapped(tensor)
    finally:
        INTERCEPTOR.current = saved
    entries, overflow = recorded.take()
    assert (len(entries), overflow) == (timeline.MAX_COLLECTIVES_PER_STEP, 3)
    assert timeline.resolve(entries[:1])[0].nbytes == 8


MS = 1_000_000


def _sharded_worker(metrics: RankMetrics, labels: dict[str, str]) -> StepWorker:
    """A worker of rank 0 of 2 whose sharding group is "3" (no DDP timers, no spans)."""
    return StepWorker(
        identity=Identity(job_id="job-t", rank=0, local_rank=0, world_size=2, node="n"),
        metrics=metrics,
        errors=ErrorBudget(metrics.instrumentation_errors, labels),
        memory=None,
        ddp_timers=False,
        tracer_provider=None,
        ids=None,
        backend="gloo",
        on_allocator_oom=lambda _count: None,
        roles=Roles(frozenset({"3"})),
    )


@pytest.mark.parametrize("handed_over", ["record", "raw"])
def test_the_worker_splits_a_step_into_compute_and_time_blocked_on_peers(handed_over: str) -> None:
    """The root's all-gather before the first forward falls in the (unmeasured) data wait; the
    reduce-scatter inside backward; both are waiting on peers, not this rank's work. The hook
    hands a step over as a plain tuple whose collectives are the timeline's raw entries: the
    worker makes the same of it as of the record."""
    registry, metrics, labels = rank_metrics()
    shard = FakeGroup("3", "mesh_shard")
    worker = _sharded_worker(metrics, labels)

    def handed(at_ms: int) -> StepRecord | RawStep:
        record = StepRecord(
            step=0,
            start_ns=(at_ms + 1000) * MS,
            forward_start_ns=(at_ms + 1100) * MS,
            forward_end_ns=(at_ms + 1200) * MS,
            forward_ns=100 * MS,
            optimizer_start_ns=(at_ms + 1400) * MS,
            end_ns=(at_ms + 1450) * MS,
            data_wait_ns=100 * MS,  # the gap since the last step: not measured by wrap_dataloader
            collectives=[
                Collective(
                    "all_gather", shard, 4096, (at_ms + 1060) * MS, (at_ms + 1090) * MS, True
                ),
                Collective(
                    "reduce_scatter", shard, 4096, (at_ms + 1300) * MS, (at_ms + 1350) * MS, True
                ),
            ],
        )
        if handed_over == "record":
            return record
        return (
            record.step,
            record.start_ns,
            record.forward_start_ns,
            record.forward_end_ns,
            record.forward_ns,
            record.optimizer_start_ns,
            record.end_ns,
            record.data_wait_ns,
            [],
            [(c.op, c.group, c.nbytes, c.start_ns, c.end_ns) for c in record.collectives],
            0,
            None,
            0,
        )

    def total(name: str) -> float:
        return registry.get_sample_value(name, labels) or 0.0

    worker.start()
    try:
        worker.submit(handed(0))
        assert worker.flush()
        assert total("trainguard_step_compute_duration_seconds_sum") == pytest.approx(0.320)
        assert total("trainguard_sync_wait_duration_seconds_sum") == pytest.approx(0.080)
        assert total("trainguard_grad_sync_duration_seconds_sum") == pytest.approx(0.050)
        assert total("trainguard_param_gather_duration_seconds_sum") == pytest.approx(0.030)
        assert total("trainguard_grad_sync_bytes_total") == 4096
        # No share from one step: the rank's window has not filled.
        assert total(contract.STEP_COMPUTE_SHARE.name) == 0.0
        worker.submit(handed(round(1000 * contract.RECENT_COMPUTE_SECONDS)))
        assert worker.flush()
    finally:
        worker.stop()
    # Its share of local work: 0.32 s of the 0.40 s it did not spend on other work.
    assert total(contract.STEP_COMPUTE_SHARE.name) == pytest.approx(0.8)


def _step_every_two_seconds(
    index: int,
    blocked_from_ns: int,
    blocked_to_ns: int,
    input_elements: int = 0,
    busy_ns: int = 200 * MS,
) -> StepRecord:
    """Step ``index`` of a rank that steps every 2 s, ``busy_ns`` (200 ms) from its forward to
    its optimizer, blocked in a reduce-scatter over the given part of those."""
    start = (1000 + 2000 * index) * MS
    return StepRecord(
        step=index,
        start_ns=start,
        forward_start_ns=start,
        forward_end_ns=start + 10 * MS,
        forward_ns=10 * MS,
        optimizer_start_ns=start + busy_ns,
        end_ns=start + busy_ns + 10 * MS,
        data_wait_ns=0,
        collectives=[
            Collective(
                "reduce_scatter",
                FakeGroup("3", "mesh_shard"),
                4096,
                start + blocked_from_ns,
                start + blocked_to_ns,
                True,
            )
        ],
        input_elements=input_elements,
    )


def test_the_recent_share_is_the_median_of_the_latest_seconds_past_an_outlier_and_a_burst() -> None:
    """Each step computes 200 ms less the time blocked in its reduce-scatter; one ends every
    2 s, so the share's 50 s hold some 25 of them."""
    registry, metrics, labels = rank_metrics()
    worker = _sharded_worker(metrics, labels)

    def step(index: int, blocked_ms: int) -> StepRecord:
        return _step_every_two_seconds(index, 60 * MS, (60 + blocked_ms) * MS)

    def share() -> float:
        assert worker.flush()
        return registry.get_sample_value(contract.STEP_COMPUTE_SHARE.name, labels) or 0.0

    half = round(contract.RECENT_COMPUTE_SECONDS / 2 / 2)  # steps that fill half the window
    steps = iter(range(1000))
    worker.start()
    try:
        for _ in range(3 * half):
            worker.submit(step(next(steps), 100))  # half its step waiting on a slower peer
        worker.submit(step(next(steps), 10))  # one step it hardly waits: an outlier
        assert share() == pytest.approx(0.5)
        for _ in range(half - 2):  # a neighbour's burst, 20 s of steps it waits least
            worker.submit(step(next(steps), 20))
        assert share() == pytest.approx(0.5)
        for _ in range(3 * half):
            worker.submit(step(next(steps), 100))
        for _ in range(half + 2):  # it has become the slow one: it waits least, for longer
            worker.submit(step(next(steps), 20))
        assert share() == pytest.approx(0.9)
    finally:
        worker.stop()


def test_the_recent_share_follows_the_ranks_speed_not_its_batch_sizes() -> None:
    """Batches of seven sizes in turn, each step's compute in proportion to its batch and the
    rest of its 200 ms blocked on a peer: the share is the rank's compute at its usual batch.
    Once a slowdown of 1.2x fills just over half the window, the share reads it whole; a median
    of the raw compute, mixing old small batches with new large ones, would not yet."""
    registry, metrics, labels = rank_metrics()
    worker = _sharded_worker(metrics, labels)
    sizes = [400, 1600, 1000, 1250, 750, 1100, 900]

    def step(index: int, ms_per_thousand: float) -> StepRecord:
        size = sizes[index % len(sizes)]
        compute = round(ms_per_thousand * size / 1000 * MS)
        return _step_every_two_seconds(index, compute, 200 * MS, input_elements=size * 4096)

    def share() -> float:
        assert worker.flush()
        return registry.get_sample_value(contract.STEP_COMPUTE_SHARE.name, labels) or 0.0

    held = round(contract.RECENT_COMPUTE_SECONDS / 2) + 1  # one every 2 s, both ends held
    steps = iter(range(1000))
    worker.start()
    try:
        for _ in range(2 * held):
            worker.submit(step(next(steps), 100.0))
        assert share() == pytest.approx(0.5)  # 100 ms of 200 at its usual batch
        for _ in range(held // 2 + 1):
            worker.submit(step(next(steps), 120.0))
        assert share() == pytest.approx(0.6)
    finally:
        worker.stop()


def test_the_recent_share_holds_while_other_ranks_outlier_steps_come_and_go() -> None:
    """A rank of a large job: it computes 100 ms a step and waits for the slowest rank, which
    in most steps is an ordinary one (200 ms from forward to optimizer) and in others some
    rank's outlier step (500 ms). The share is over the rank's usual step, the mean of many:
    when outlier steps go from a third of the last 50 s to two thirds, it hardly moves (a
    median over the window would jump from 0.5 to 0.2, on every rank at this step, read by
    Prometheus at different moments)."""
    registry, metrics, labels = rank_metrics()
    worker = _sharded_worker(metrics, labels)

    def step(index: int, outlier: bool) -> StepRecord:
        busy = (500 if outlier else 200) * MS
        return _step_every_two_seconds(index, 100 * MS, busy, busy_ns=busy)

    def share() -> float:
        assert worker.flush()
        return registry.get_sample_value(contract.STEP_COMPUTE_SHARE.name, labels) or 0.0

    steps = iter(range(1000))
    worker.start()
    try:
        for _ in range(100):
            for outlier in (True, False, False):
                worker.submit(step(next(steps), outlier))
        before = share()
        assert before == pytest.approx(0.1 / 0.3)  # 100 ms over the mean step, 300 ms
        for _ in range(10):
            for outlier in (True, True, False):
                worker.submit(step(next(steps), outlier))
        assert share() == pytest.approx(before, rel=0.05)
    finally:
        worker.stop()
