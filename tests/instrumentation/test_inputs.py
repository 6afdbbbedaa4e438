"""What the hook reads a step's batch size from: the elements of the tensors ``forward`` gets."""

from __future__ import annotations

from typing import Any, cast

import torch
from prometheus_client import CollectorRegistry

from trainguard.instrumentation.config import Identity
from trainguard.instrumentation.errors import ErrorBudget
from trainguard.instrumentation.metrics import RankMetrics
from trainguard.instrumentation.records import RawStep, StepRecord
from trainguard.instrumentation.steps import StepRecorder, input_elements
from trainguard.instrumentation.watchdog import StepClock
from trainguard.instrumentation.worker import StepWorker


def test_it_counts_the_tensors_of_the_arguments_and_of_a_batch_passed_whole() -> None:
    tokens, mask = torch.zeros(4, 7, dtype=torch.long), torch.ones(4, 7)
    assert input_elements((tokens,), {}) == 28
    assert input_elements((), {"input_ids": tokens, "attention_mask": mask}) == 56
    assert input_elements(({"input_ids": tokens, "labels": tokens},), {}) == 56
    assert input_elements(((tokens, mask), 3, "x"), {"return_dict": True}) == 56
    # One level deep only: nothing deeper is walked on the training thread.
    assert input_elements(([[tokens]],), {}) == 0


class _Captured:
    """Stands in for the worker: keeps what the training thread hands over."""

    def __init__(self) -> None:
        self.steps: list[StepRecord] = []

    def submit(self, record: RawStep) -> None:
        self.steps.append(StepRecord.from_raw(record))


def _recorder(count_inputs: bool) -> tuple[StepRecorder, _Captured, torch.nn.Module, Any]:
    labels = Identity(job_id="job-t", rank=0, local_rank=0, world_size=1, node="n").labels()
    metrics = RankMetrics(CollectorRegistry(), labels)
    errors = ErrorBudget(metrics.instrumentation_errors, labels)
    recorder = StepRecorder(StepClock(), errors, lambda _where, _error: None, count_inputs)
    captured = _Captured()
    recorder.worker = cast(StepWorker, captured)
    model = torch.nn.Linear(8, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    recorder.wrap(model, optimizer)
    recorder.active = True
    return recorder, captured, model, optimizer


def test_a_steps_record_carries_the_elements_of_all_its_forwards() -> None:
    """Two micro-batches of one step add up; the next step starts from nothing; a forward
    without gradients (an evaluation) is not the step's."""
    _, captured, model, optimizer = _recorder(count_inputs=True)
    for rows in ([3, 5], [2]):
        for count in rows:
            model(torch.ones(count, 8)).sum().backward()
        with torch.no_grad():
            model(torch.ones(100, 8))
        optimizer.step()
    assert [record.input_elements for record in captured.steps] == [64, 16]


def test_counting_can_be_turned_off() -> None:
    _, captured, model, optimizer = _recorder(count_inputs=False)
    model(torch.ones(3, 8)).sum().backward()
    optimizer.step()
    assert [record.input_elements for record in captured.steps] == [0]
