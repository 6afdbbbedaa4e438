"""The fault kinds of the demo trainer: every kind is registered by the module of the failure
it causes, parses, and does to its rank what it says (slower compute, data or gradient sync, a
failed sync, leaked memory, a batch that no longer fits), through the trainer's Sabotage."""

from __future__ import annotations

import time

import pytest
import torch
import torch.distributed as dist

from trainguard.contract import FAILURES, Failure
from trainguard.demo.faults import FAULT_KINDS, Fault, FaultKind, fault_kinds, parse_plan
from trainguard.demo.faults.hang import BARRIER_HANG
from trainguard.demo.faults.oom import MEMORY_CREEP, OOM
from trainguard.demo.faults.rank_failure import KILL, PG_ERROR
from trainguard.demo.faults.straggler import COMM_SLOW, DATA_SLOW, STRAGGLER
from trainguard.demo.sabotage import Sabotage

KINDS = fault_kinds()


def _batch(step: int, rank: int) -> torch.Tensor:
    return torch.full((2, 2), float(step * 10 + rank))


@pytest.mark.parametrize("kind", KINDS, ids=lambda k: k.name)
def test_every_kind_parses_and_names_a_failure(kind: FaultKind) -> None:
    (fault,) = parse_plan(f"{kind.name}:rank=1,at=3s,factor=1.2")
    assert fault == Fault(kind, 1, 3.0, 1.2)
    assert isinstance(kind.failure, Failure)
    assert set(kind.alerts) <= set(FAILURES[kind.failure].alerts)


def test_the_kinds_are_registered_by_the_module_of_the_failure_they_cause() -> None:
    names = [kind.name for kind in KINDS]
    assert len(names) == len(set(names))
    for spec, kinds in FAILURES.implementations(FAULT_KINDS):
        assert all(kind.failure is spec.failure for kind in kinds)
    assert COMM_SLOW.failure is Failure.STRAGGLER
    assert BARRIER_HANG.failure is Failure.HANG
    assert KILL.failure is Failure.RANK_FAILURE
    assert MEMORY_CREEP.failure is Failure.OOM


def _knobs(**overrides: object) -> Sabotage:
    knobs = Sabotage(_batch, base_work_seconds=0.1, base_data_seconds=0.01, batch_size=32)
    for name, value in overrides.items():
        setattr(knobs, name, value)
    return knobs


def test_each_slowdown_slows_its_part_by_its_factor_and_no_more() -> None:
    for kind, part, slowed in (
        (STRAGGLER, "work_seconds", 0.15),
        (DATA_SLOW, "data_seconds", 0.01 + 0.05),
        (COMM_SLOW, "comm_delay_seconds", 0.05),
    ):
        knobs = _knobs()
        assert kind.sustain is not None and kind.slows
        kind.sustain(knobs, 1.5)
        assert getattr(knobs, part) == pytest.approx(slowed), kind.name
        kind.sustain(knobs, 1.0)  # its rank moved away: healthy again
        healthy = {"work_seconds": 0.1, "data_seconds": 0.01, "comm_delay_seconds": 0.0}
        assert getattr(knobs, part) == pytest.approx(healthy[part]), kind.name


def test_the_one_shot_faults_turn_their_knob_when_they_fire() -> None:
    knobs = _knobs()
    for kind in (OOM, PG_ERROR, MEMORY_CREEP):
        assert kind.fire is not None and not kind.slows
        kind.fire(knobs)
    assert knobs.oom_above == 16 and knobs.comm_error and knobs.leak_bytes_per_step > 0


def test_the_matrix_runs_each_kind_at_its_factors() -> None:
    assert STRAGGLER.matrix_runs() == [
        ("straggler_1.2x", 1.2),
        ("straggler_1.5x", 1.5),
        ("straggler_2x", 2.0),
    ]
    assert DATA_SLOW.matrix_runs() == [("data_slow", 1.5)]
    assert KILL.matrix_runs() == [("kill", 1.0)]


def test_the_data_loader_yields_each_step_in_order_and_waits_when_slowed() -> None:
    sabotage = _knobs()
    batches = sabotage.batches(5, rank=1)
    assert next(batches)[0, 0].item() == 51 and next(batches)[0, 0].item() == 61
    sabotage.data_seconds = 0.2
    started = time.perf_counter()
    next(batches)
    assert time.perf_counter() - started >= 0.2


def test_a_failed_process_group_fails_the_gradient_sync() -> None:
    sabotage = _knobs(comm_error=True)
    future = sabotage.comm_hook(None, bucket=None)  # type: ignore[arg-type]
    with pytest.raises(dist.DistBackendError, match="process group failed"):
        future.wait()


def test_a_creeping_rank_holds_more_memory_every_step() -> None:
    sabotage = _knobs()
    sabotage.leak()
    assert sabotage.leaked == []
    sabotage.leak_bytes_per_step = 1 << 20
    sabotage.leak()
    sabotage.leak()
    assert sum(t.numel() * t.element_size() for t in sabotage.leaked) == 2 << 20
