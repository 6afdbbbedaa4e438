"""The training thread's share of the hook: the wrappers around ``forward`` and the optimizer's
``step`` that mark when each step's phases begin and end.

What runs here is kept to clock reads, attribute stores and a count of the elements ``forward`` is
given (:func:`input_elements`: a batch's size, when batches vary). At a step's end one tuple of its
times (:data:`.records.RawStep`) goes to the worker thread, which does everything else; the
collective timeline (:mod:`.timeline`) records the step's collectives as they are issued. On
DDP the forward that publishes a sampled iteration's reducer timers also copies them (see
:class:`.reducer.TimerReads`), so the worker never has to be woken to read them in time.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any, TypeVar

import torch

from trainguard.instrumentation.comm_hook import BucketTimer
from trainguard.instrumentation.errors import ErrorBudget
from trainguard.instrumentation.records import RawStep
from trainguard.instrumentation.reducer import RawLoggingData, TimerReads
from trainguard.instrumentation.timeline import INTERCEPTOR, Timeline
from trainguard.instrumentation.watchdog import StepClock
from trainguard.instrumentation.worker import StepWorker

T = TypeVar("T")


def input_elements(args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> int:
    """Elements of the tensors a ``forward`` call was given: its arguments, and the values of a
    mapping or the items of a list or tuple among them (a batch passed as a dict or a pair), one
    level deep. What a step's compute follows where batches vary in size (variable sequence
    lengths, padded per batch); constant where they do not."""
    total = 0
    for value in (*args, *kwargs.values()):
        if isinstance(value, torch.Tensor):
            total += value.numel()
        elif isinstance(value, Mapping | list | tuple):
            items = value.values() if isinstance(value, Mapping) else value
            total += sum(item.numel() for item in items if isinstance(item, torch.Tensor))
    return total


class StepRecorder:
    """Times each step of the training loop and hands it to the worker (training thread)."""

    def __init__(
        self,
        clock: StepClock,
        errors: ErrorBudget,
        on_oom: Callable[[str, BaseException | None], None],
        count_inputs: bool = True,
    ) -> None:
        self.clock = clock
        self.errors = errors
        self._on_oom = on_oom
        self._count_inputs = count_inputs
        self.active = False
        # Set at installation; the worker is None until it runs, the rest where they apply.
        self.worker: StepWorker | None = None
        self.timeline: Timeline | None = None
        self.bucket_timer: BucketTimer | None = None
        # When to read DDP's logging data: after the forwards that publish sampled timers
        # (None: not read).
        self.timer_reads: TimerReads | None = None
        self._has_optimizer = False
        self._reducer_data: RawLoggingData = None  # read in this step, for its record
        self._wrapped_forward: Callable[..., Any] | None = None
        self._wrapped_step: Callable[..., Any] | None = None
        # The step in progress (perf_counter_ns; 0 = none).
        self._forward_start = 0
        self._forward_end = 0
        self._forward_ns = 0
        self._data_ns = 0
        self._input_elements = 0
        self._previous_end = 0

    # --- wrapping ------------------------------------------------------------------------------
    def wrap(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer | None) -> None:
        """Wrap ``model.forward`` and, when given, ``optimizer.step`` (instance attributes, so
        :meth:`unwrap` restores the class's own)."""
        self._wrap_forward(model)
        if optimizer is not None:
            self._has_optimizer = True
            self._wrap_step(optimizer)

    def unwrap(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer | None) -> None:
        """Remove the wrappers this recorder set, and no one else's."""
        if model.__dict__.get("forward") is self._wrapped_forward:
            del model.__dict__["forward"]
        if optimizer is not None and optimizer.__dict__.get("step") is self._wrapped_step:
            del optimizer.__dict__["step"]

    def wrap_dataloader(self, loader: Iterable[T]) -> Iterator[T]:
        """Iterate ``loader``, timing each fetch as the step's data wait."""
        iterator = iter(loader)
        while True:
            start = time.perf_counter_ns()
            try:
                item = next(iterator)
            except StopIteration:
                return
            self._data_ns += time.perf_counter_ns() - start
            yield item

    def hand_over_timers(self) -> None:
        """DDP timers read at the forward of a step that has not ended are the last finished
        step's: the worker needs them now, not when (if ever) that step ends."""
        data, self._reducer_data = self._reducer_data, None
        if data is not None and self.worker is not None:
            self.worker.submit_timers(data)

    def _wrap_forward(self, model: torch.nn.Module) -> None:
        original = model.forward

        def forward(*args: Any, **kwargs: Any) -> Any:
            if not self.active or not torch.is_grad_enabled():
                return original(*args, **kwargs)
            start = time.perf_counter_ns()
            if self._forward_start == 0 or not self._has_optimizer:
                self._begin_step(start)
            if self._count_inputs:
                self._input_elements += input_elements(args, kwargs)
            reads = self.timer_reads
            # Asked before DDP's forward, which counts its iteration as it starts.
            publishes = reads is not None and reads.before_forward()
            try:
                output = original(*args, **kwargs)
            except torch.OutOfMemoryError as error:
                self._on_oom("forward", error)
                raise
            end = time.perf_counter_ns()
            self._forward_ns += end - start
            self._forward_end = end
            if publishes:
                self._read_timers()
            return output

        self._wrapped_forward = forward
        model.__dict__["forward"] = forward

    def _wrap_step(self, optimizer: torch.optim.Optimizer) -> None:
        original = optimizer.step

        def step(*args: Any, **kwargs: Any) -> Any:
            if not self.active or self._forward_start == 0:
                return original(*args, **kwargs)
            start = time.perf_counter_ns()
            try:
                result = original(*args, **kwargs)
            except torch.OutOfMemoryError as error:
                self._on_oom("optimizer", error)
                raise
            self._end_step(start, time.perf_counter_ns())
            return result

        self._wrapped_step = step
        optimizer.__dict__["step"] = step

    # --- the step's times ----------------------------------------------------------------------
    def _read_timers(self) -> None:
        """DDP has just published a sampled iteration's timers (at this forward's start, see
        :class:`.reducer.TimerReads`): take them for the worker, in this step's record. A copy
        of the C++ logger's record, cheaper than waking the worker to read them in time."""
        reads = self.timer_reads
        if reads is None:
            return
        try:
            data = reads.read()
        except Exception as error:
            self.errors.record("reducer_stats", error)
            return
        if self._reducer_data is not None:  # a second read in one step: keep both
            self.hand_over_timers()
        self._reducer_data = data

    def _begin_step(self, now: int) -> None:
        if not self._has_optimizer and self._forward_end:
            # Without an optimizer to mark the end, a step ends where the next one begins.
            self._end_step(now, now)
        self._forward_start = now
        if self.timeline is not None:
            INTERCEPTOR.current = self.timeline
        if not self._previous_end:
            self._previous_end = now - self._data_ns
        self.clock.started_ns = self._previous_end

    def _end_step(self, optimizer_start: int, end: int) -> None:
        previous_end, forward_start = self._previous_end, self._forward_start
        data_wait = self._data_ns or max(0, forward_start - previous_end)
        collectives, overflow = self.timeline.take() if self.timeline is not None else ([], 0)
        # A tuple of StepRecord's fields, not a StepRecord: the worker builds that (a tenth of
        # the cost here, see .records).
        record: RawStep = (
            self.clock.step,
            previous_end,
            forward_start,
            self._forward_end,
            self._forward_ns,
            optimizer_start,
            end,
            data_wait,
            self.bucket_timer.take() if self.bucket_timer is not None else [],
            collectives,
            overflow,
            self._reducer_data,
            self._input_elements,
        )
        self._reducer_data = None
        self.clock.recent.append((end - previous_end) / 1e9)
        # The watchdog keeps watching between steps: a collective outside the step (a metric
        # all-reduce, a checkpoint barrier) can hang as well.
        self.clock.started_ns = end
        self.clock.step += 1
        self._previous_end = end
        self._forward_start = self._forward_end = self._forward_ns = self._data_ns = 0
        self._input_elements = 0
        if self.worker is not None:
            try:
                self.worker.submit(record)
            except Exception as error:
                self.errors.record("worker", error)
