"""Pure parts of the hook, on fixtures: reducer stats, Flight Recorder state, memory, batches,
trace ids, file_sd, the scheduler a job runs on."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from trainguard import contract
from trainguard.instrumentation import flight_recorder, memory, oom, reducer, server, tracing
from trainguard.instrumentation.config import InstrumentationConfig, Placement, detect_placement

# Shaped like torch 2.13's ddp._get_ddp_logging_data() on gloo (values from a real run).
LOGGING_DATA = {
    "iteration": 3,
    "bucket_sizes": "125952000",
    "rebuilt_bucket_sizes": "4198400, 29388800, 29388800, 4198400",
    "has_rebuilt_buckets": 1,
    "forward_compute_time": 33640214,
    "forward_compute_time_start": 1796210908284451745,
    "backward_compute_time": 180088225,
    "backward_compute_time_start": 1796210908318091959,
    "backward_compute_time_end": 1796210908498180184,
    "backward_comm_time": 208152681,
    "backward_comm_time_start": 1796210908322918248,
    "backward_comm_time_end": 1796210908531070929,
    "backward_compute_comm_overlap_time": 175261936,
}


def test_reducer_stats_split_sync_into_overlap_and_wait() -> None:
    stats = reducer.parse_logging_data(LOGGING_DATA)
    assert stats is not None
    assert stats.iteration == 3
    assert (stats.forward_compute_ns, stats.backward_compute_ns) == (33640214, 180088225)
    assert stats.sync_wait_ns == 208152681 - 175261936
    assert stats.bucket_bytes == (4198400, 29388800, 29388800, 4198400)


def test_the_c_plus_plus_loggers_record_parses_like_ddps_dict() -> None:
    # What the training thread reads (the C++ logger's record, maps still unconverted).
    strs = {k: v for k, v in LOGGING_DATA.items() if isinstance(v, str)}
    ints = {k: v for k, v in LOGGING_DATA.items() if not isinstance(v, str)}
    record = SimpleNamespace(strs_map=strs, ints_map=ints)
    assert reducer.parse_logging_data(record) == reducer.parse_logging_data(LOGGING_DATA)


def test_reducer_stats_before_buckets_are_rebuilt_use_construction_sizes() -> None:
    stats = reducer.parse_logging_data({**LOGGING_DATA, "has_rebuilt_buckets": 0})
    assert stats is not None and stats.bucket_bytes == (125952000,)


@pytest.mark.parametrize("missing", ["backward_comm_time", "forward_compute_time_start"])
def test_reducer_stats_missing_or_unsampled_are_none(missing: str) -> None:
    data = dict(LOGGING_DATA)
    del data[missing]
    assert reducer.parse_logging_data(data) is None
    assert reducer.parse_logging_data({**LOGGING_DATA, "backward_comm_time_end": 0}) is None


def test_overlap_larger_than_comm_never_gives_negative_wait() -> None:
    data = {**LOGGING_DATA, "backward_compute_comm_overlap_time": 10**12}
    stats = reducer.parse_logging_data(data)
    assert stats is not None and stats.sync_wait_ns == 0


# Shaped like _dump_fr_trace_json(True, True) on gloo while a peer is late.
NOW = 1796211257210539345 + 5_000_000_000
FR_STATE = {
    "pg_status": {
        "0": {
            "last_enqueued_collective": "22",
            "last_started_collective": "-1",
            "last_completed_collective": "18",
        },
        "1": {
            "last_enqueued_collective": 4,
            "last_started_collective": -1,
            "last_completed_collective": 4,
        },
    },
    "entries": [
        {
            "collective_seq_id": 18,
            "state": "scheduled",
            "retired": True,
            "time_created_ns": 1796211257000000000,
            "profiling_name": "gloo:all_reduce",
            "timeout_ms": 1800000,
        },
        {
            "collective_seq_id": 19,
            "state": "scheduled",
            "retired": False,
            "time_created_ns": 1796211257210539345,
            "profiling_name": "gloo:all_reduce",
            "timeout_ms": 1800000,
        },
        {
            "collective_seq_id": 20,
            "state": "started",
            "retired": False,
            "time_created_ns": 1796211258210539345,
            "profiling_name": "gloo:all_reduce",
            "timeout_ms": 1800000,
        },
        {
            "collective_seq_id": 3,
            "state": "scheduled",
            "retired": False,
            "is_p2p": True,
            "time_created_ns": 1796211200000000000,
            "profiling_name": "gloo:send",
        },
    ],
}


def test_pending_collectives_count_the_unretired_and_age_the_oldest() -> None:
    pending = flight_recorder.pending_collectives(FR_STATE, NOW)
    assert pending.count == 2, "retired and point-to-point entries are not collectives in flight"
    assert pending.oldest_seq == 19
    assert pending.oldest_age_seconds == pytest.approx(5.0)
    assert pending.oldest_name == "gloo:all_reduce"
    assert pending.oldest_timeout_seconds == 1800.0


def test_nothing_pending_on_an_empty_recorder() -> None:
    assert flight_recorder.pending_collectives({}, NOW) == flight_recorder.NOTHING_PENDING


def test_collective_progress_sums_process_groups() -> None:
    assert flight_recorder.collective_progress(FR_STATE) == (26, 22)
    assert flight_recorder.collective_progress({"pg_status": {}}) is None


def test_gloo_dump_gets_its_process_group_named() -> None:
    dump = {
        "pg_config": {"": {"name": "", "desc": "", "ranks": "[0, 1, 2]"}},
        "entries": [{"process_group": ("0", "default_pg")}] * 3,
    }
    repaired = flight_recorder.repair_pg_config(dump)
    assert repaired["pg_config"] == {"0": {"name": "0", "desc": "default_pg", "ranks": "[0, 1, 2]"}}
    ambiguous = {**dump, "entries": [{"process_group": ("0", "a")}, {"process_group": ("1", "b")}]}
    assert flight_recorder.repair_pg_config(ambiguous) is ambiguous


@pytest.mark.parametrize(
    ("text", "limit"),
    [("max\n", None), ("8589934592\n", 8589934592), ("9223372036854771712", None), ("", None)],
)
def test_cgroup_limits(text: str, limit: int | None) -> None:
    assert memory.parse_cgroup_limit(text) == limit


def test_a_cpu_rank_capacity_can_be_set_for_ranks_sharing_a_host(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    cpu = torch.device("cpu")
    assert memory.MemorySampler(cpu).sample().capacity_bytes == memory.host_memory_limit()
    assert memory.MemorySampler(cpu, 1 << 30).sample().capacity_bytes == 1 << 30
    monkeypatch.setenv(contract.ENV_MEMORY_CAPACITY, str(3 << 30))
    assert InstrumentationConfig().resolved_memory_capacity() == 3 << 30
    assert InstrumentationConfig(memory_capacity_bytes=5).resolved_memory_capacity() == 5
    monkeypatch.delenv(contract.ENV_MEMORY_CAPACITY)
    assert InstrumentationConfig().resolved_memory_capacity() is None


def test_fragmentation_is_the_unallocated_share_of_reserved() -> None:
    sample = memory.MemorySample(
        allocated_bytes=6, reserved_bytes=8, capacity_bytes=10, alloc_retries=0, ooms=0
    )
    assert sample.fragmentation_ratio == pytest.approx(0.25)
    assert memory.MemorySample(0, 0, 10, 0, 0).fragmentation_ratio == 0.0


def test_split_batch_keeps_structure_and_every_sample() -> None:
    batch: dict[str, Any] = {"x": torch.arange(10).reshape(5, 2), "y": (torch.arange(5), "tag")}
    parts = oom.split_batch(batch, 2)
    assert len(parts) == 2
    assert torch.equal(torch.cat([p["x"] for p in parts]), batch["x"])
    assert torch.equal(torch.cat([p["y"][0] for p in parts]), torch.arange(5))
    assert all(p["y"][1] == "tag" for p in parts)
    assert [oom.batch_size(p) for p in parts] == [3, 2]
    assert len(oom.split_batch(torch.zeros(3, 1), 8)) == 3, "never more parts than samples"
    with pytest.raises(ValueError, match="batch dim"):
        oom.split_batch({"x": "no tensors"}, 2)


def test_trace_ids_are_derived_from_job_and_step() -> None:
    assert tracing.trace_id_for("job", 7) == tracing.trace_id_for("job", 7)
    assert tracing.trace_id_for("job", 7) != tracing.trace_id_for("job", 8)
    assert tracing.trace_id_for("job", 7) != tracing.trace_id_for("other", 7)
    assert 0 < tracing.trace_id_for("job", 7) < 2**128
    assert 0 < tracing.root_span_id_for("job", 7) < 2**64
    assert len(tracing.format_trace_id(tracing.trace_id_for("job", 7))) == 32


def test_file_sd_target_file(tmp_path: Path) -> None:
    labels = {"job_id": "j", "rank": "1", "local_rank": "1", "node": "n1"}
    path = server.write_file_sd(tmp_path / "sd", "j-rank1", "n1:9401", labels)
    assert json.loads(path.read_text()) == [{"targets": ["n1:9401"], "labels": labels}]
    assert [p.name for p in (tmp_path / "sd").iterdir()] == ["j-rank1.json"], "no temp file left"


# -- where the job runs ------------------------------------------------------------------------

NO_NAMESPACE_FILE = Path("/nonexistent/serviceaccount/namespace")


@pytest.mark.parametrize(
    ("env", "placement"),
    [
        ({"TORCHELASTIC_RUN_ID": "r1"}, Placement("local")),
        ({"SLURM_JOB_ID": "4242", "SLURM_PROCID": "3"}, Placement("slurm", slurm_job_id="4242")),
        (
            {"KUBERNETES_SERVICE_HOST": "10.0.0.1", "POD_NAMESPACE": "ml"},
            Placement("kubernetes", namespace="ml"),
        ),
        # The override wins over detection, and names no handle of another scheduler.
        (
            {"TRAINGUARD_SCHEDULER": "local", "SLURM_JOB_ID": "4242"},
            Placement("local"),
        ),
        ({"KUBERNETES_SERVICE_HOST": "10.0.0.1"}, Placement("kubernetes")),
        # Slurm run inside Kubernetes pods: the job is Slurm's to requeue.
        (
            {"KUBERNETES_SERVICE_HOST": "10.0.0.1", "SLURM_JOB_ID": "5", "POD_NAMESPACE": "ml"},
            Placement("slurm", slurm_job_id="5"),
        ),
    ],
)
def test_the_scheduler_is_detected_from_its_environment(
    env: dict[str, str], placement: Placement
) -> None:
    assert detect_placement(env, namespace_file=NO_NAMESPACE_FILE) == placement


def test_a_pod_without_pod_namespace_reads_its_service_account_mount(tmp_path: Path) -> None:
    namespace_file = tmp_path / "namespace"
    namespace_file.write_text("research\n")
    env = {"KUBERNETES_SERVICE_HOST": "10.0.0.1"}
    assert detect_placement(env, namespace_file=namespace_file) == Placement(
        "kubernetes", namespace="research"
    )


def test_the_argument_overrides_the_environment() -> None:
    env = {"TRAINGUARD_SCHEDULER": "slurm", "SLURM_JOB_ID": "7"}
    placement = detect_placement(env, "kubernetes", namespace_file=NO_NAMESPACE_FILE)
    assert placement == Placement("kubernetes")


@pytest.mark.parametrize("given", [("nomad", {}), (None, {"TRAINGUARD_SCHEDULER": "pbs"})])
def test_an_unknown_scheduler_is_refused_with_the_choices(
    given: tuple[str | None, dict[str, str]],
) -> None:
    scheduler, env = given
    with pytest.raises(ValueError, match="is not one of local, kubernetes, slurm"):
        detect_placement(env, scheduler, namespace_file=NO_NAMESPACE_FILE)


class _SampledDDP:
    """DDP's runtime-stats sampling as its reducer and logger do it: iteration ``k`` (counted
    over forwards that sync gradients) is timed when ``k <= 10`` or ``k % rate == 0``, and
    published at the start of forward ``k + 1``."""

    def __init__(self, rate: int, iterations: int = 0) -> None:
        self.rate = rate
        self.iterations = iterations
        self.require_backward_grad_sync = True
        self.published = 0

    def forward(self) -> None:
        if not self.require_backward_grad_sync:
            return
        k = self.iterations
        if k > 0 and (k <= reducer.ALWAYS_SAMPLED_ITERATIONS or k % self.rate == 0):
            self.published = k
        self.iterations += 1

    def record(self) -> Any:
        return SimpleNamespace(ints_map={"iteration": self.published}, strs_map={})


def _run(ddp: _SampledDDP, reads: reducer.TimerReads, forwards: int) -> list[int | None]:
    """The iterations the training thread read, one per read."""
    seen: list[int | None] = []
    for _ in range(forwards):
        publishes = reads.before_forward()
        ddp.forward()
        if publishes:
            seen.append(reducer.published_iteration(reads.read()))
    return seen


def test_timer_reads_take_every_sampled_iteration_and_nothing_else() -> None:
    ddp = _SampledDDP(rate=4)
    reads = reducer.TimerReads(ddp, ddp.record, 4)
    seen = _run(ddp, reads, 40)
    assert seen == [0, *range(1, 11), 12, 16, 20, 24, 28, 32, 36]
    assert reads.locked


def test_timer_reads_find_ddp_s_count_when_instrumented_mid_training() -> None:
    ddp = _SampledDDP(rate=8, iterations=1003)
    ddp.published = 1000  # what the previous sample rate left
    reads = reducer.TimerReads(ddp, ddp.record, 8)
    seen = _run(ddp, reads, 40)
    # Searching reads every forward until a publish (1008, at forward 1009) gives the count.
    assert seen[:6] == [1000] * 5 + [1008]
    assert seen[6:] == [1016, 1024, 1032, 1040]


def test_timer_reads_skip_no_sync_forwards_and_recover_from_a_missed_count() -> None:
    ddp = _SampledDDP(rate=4, iterations=20)
    reads = reducer.TimerReads(ddp, ddp.record, 4)
    _run(ddp, reads, 8)
    assert reads.locked
    ddp.require_backward_grad_sync = False  # gradient accumulation: not counted by DDP
    assert _run(ddp, reads, 3) == []
    ddp.require_backward_grad_sync = True
    ddp.forward()  # a forward the hook never saw: its count is one behind DDP's now
    seen = _run(ddp, reads, 24)
    # Each read comes one forward late, before the next sampled iteration overwrites the
    # record (a count behind by ``rate`` or more, or ahead, reads the wrong iteration and
    # searches again): none is missed, and reads stay one in ``rate``.
    assert seen == [28, 32, 36, 40, 44, 48]
    assert _run(ddp, reads, 1) == [52]


def test_timer_reads_ahead_of_ddp_search_again() -> None:
    ddp = _SampledDDP(rate=4, iterations=20)
    reads = reducer.TimerReads(ddp, ddp.record, 4)
    _run(ddp, reads, 8)
    reads.before_forward()  # counted, but DDP's forward fails before it counts
    seen = _run(ddp, reads, 16)
    assert seen[1:] == [32, 36, 40] and ddp.published == 40
    assert reads.locked
