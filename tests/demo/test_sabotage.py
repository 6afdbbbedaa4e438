"""The fault catalogue of the demo trainer: every kind parses, names the failure it causes,
and the sabotage each one does (data delay, late or failed gradient sync, leaked memory)."""

from __future__ import annotations

import time

import pytest
import torch
import torch.distributed as dist

from trainguard.contract import Failure
from trainguard.demo.faults import Fault, FaultKind, parse_plan
from trainguard.demo.sabotage import Sabotage


def _batch(step: int, rank: int) -> torch.Tensor:
    return torch.full((2, 2), float(step * 10 + rank))


@pytest.mark.parametrize("kind", list(FaultKind))
def test_every_kind_parses_and_names_a_failure(kind: FaultKind) -> None:
    (fault,) = parse_plan(f"{kind.value}:rank=1,at=3s,factor=1.2")
    assert fault == Fault(kind, 1, 3.0, 1.2)
    assert isinstance(kind.failure, Failure)


def test_the_kinds_cause_the_failures_the_matrix_scores() -> None:
    assert FaultKind.COMM_SLOW.failure is Failure.STRAGGLER
    assert FaultKind.BARRIER_HANG.failure is Failure.HANG
    assert FaultKind.KILL.failure is Failure.RANK_FAILURE
    assert FaultKind.MEMORY_CREEP.failure is Failure.OOM


def test_the_data_loader_yields_each_step_in_order_and_waits_when_slowed() -> None:
    sabotage = Sabotage(_batch)
    batches = sabotage.batches(5, rank=1)
    assert next(batches)[0, 0].item() == 51 and next(batches)[0, 0].item() == 61
    sabotage.data_seconds = 0.2
    started = time.perf_counter()
    next(batches)
    assert time.perf_counter() - started >= 0.2


def test_a_failed_process_group_fails_the_gradient_sync() -> None:
    sabotage = Sabotage(_batch, comm_error=True)
    future = sabotage.comm_hook(None, bucket=None)  # type: ignore[arg-type]
    with pytest.raises(dist.DistBackendError, match="process group failed"):
        future.wait()


def test_a_creeping_rank_holds_more_memory_every_step() -> None:
    sabotage = Sabotage(_batch)
    sabotage.leak()
    assert sabotage.leaked == []
    sabotage.leak_bytes_per_step = 1 << 20
    sabotage.leak()
    sabotage.leak()
    assert sum(t.numel() * t.element_size() for t in sabotage.leaked) == 2 << 20
