"""The OOM guard: count and report an out-of-memory step; optionally retry it split up.

Reporting is passive (the hook wraps ``forward`` and ``optimizer.step``; on CUDA the
allocator's own ``num_ooms`` also catches OOMs in ``backward``). Recovery needs control of the
step, so it is offered through :meth:`Instrumentation.guarded_step`: the step's batch is split
into N micro-batches along the first dimension, all but the last with gradient sync off
(DDP's and FSDP1's ``no_sync``, FSDP2's ``set_requires_gradient_sync(False)``: gradients
accumulate locally) and the last one synchronises, which gives the gradients of the unsplit step
when the loss is a mean over the batch (each micro-batch's loss is weighted by its share of the
batch). :mod:`.parallel` undoes what a failed attempt left in the wrapper.

Lockstep: every rank must run the same collectives in the same order, even when only one rank
ran out of memory. Each attempt therefore ends in one small agreement all-reduce (MAX of "I ran
out of memory") placed after the last micro-batch's forward and before its backward — the only
backward that communicates on DDP. If any rank failed, every rank drops the attempt and
retries with twice as many micro-batches. An OOM inside that last, synchronising backward cannot
be undone in lockstep (peers are already inside the gradient all-reduce); it is reported and
re-raised. On FSDP every forward and backward also gathers parameters, so an OOM on one rank
only leaves its peers in an all-gather it never joins (the watchdog reports the stall); an OOM
that every rank hits on the same micro-batch, the usual case with equal shapes, is recovered.

:class:`OomGuard` holds the guard's state (the split in force, the OOMs reported) for the hook.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
import torch.distributed as dist

from trainguard import contract
from trainguard.events import log_event
from trainguard.instrumentation import parallel, tracing
from trainguard.instrumentation.config import Identity
from trainguard.instrumentation.errors import ErrorBudget
from trainguard.instrumentation.metrics import RankMetrics
from trainguard.instrumentation.watchdog import StepClock

logger = logging.getLogger("trainguard.instrumentation")


def batch_size(batch: Any) -> int:
    """The size of the first dimension of the first tensor in ``batch``."""
    if isinstance(batch, torch.Tensor):
        return int(batch.shape[0]) if batch.dim() else 1
    if isinstance(batch, Mapping):
        for value in batch.values():
            size = batch_size(value)
            if size:
                return size
        return 0
    if isinstance(batch, Sequence) and not isinstance(batch, str | bytes):
        for value in batch:
            size = batch_size(value)
            if size:
                return size
    return 0


def split_batch(batch: Any, parts: int) -> list[Any]:
    """Split every tensor of ``batch`` into ``parts`` pieces along dim 0; other leaves repeat.

    Tuples and lists keep their type, mappings become dicts; ``parts`` larger than the batch
    gives as many micro-batches as there are samples.
    """
    size = batch_size(batch)
    if size == 0:
        raise ValueError("guarded_step needs a batch with at least one tensor with a batch dim")
    parts = max(1, min(parts, size))

    def split(value: Any) -> list[Any]:
        if isinstance(value, torch.Tensor) and value.dim() and value.shape[0] == size:
            return list(torch.tensor_split(value, parts, dim=0))
        if isinstance(value, Mapping):
            columns = {key: split(item) for key, item in value.items()}
            return [{k: c[i] for k, c in columns.items()} for i in range(parts)]
        if isinstance(value, tuple | list):
            items = [split(item) for item in value]
            return [type(value)(item[i] for item in items) for i in range(parts)]
        return [value] * parts

    return split(batch)


def memory_summary(device: torch.device) -> dict[str, Any]:
    """What was held when the OOM happened, for the event."""
    if device.type != "cuda":
        return {}
    stats = torch.cuda.memory_stats(device)
    free, total = torch.cuda.mem_get_info(device)
    return {
        "allocated_bytes": int(stats.get("allocated_bytes.all.current", 0)),
        "reserved_bytes": int(stats.get("reserved_bytes.all.current", 0)),
        "free_bytes": int(free),
        "total_bytes": int(total),
        "num_alloc_retries": int(stats.get("num_alloc_retries", 0)),
    }


def log_oom(
    identity: Identity,
    step: int,
    where: str,
    summary: dict[str, Any],
    error: BaseException | None,
) -> None:
    log_event(
        f"rank {identity.rank} ran out of memory in {where} at step {step}",
        contract.EventKind.OOM,
        **identity.event_fields(),
        step=step,
        trace_id=tracing.format_trace_id(tracing.trace_id_for(identity.job_id, step)),
        outcome=contract.EventOutcome.FAILURE,
        details={"where": where, "error": str(error)[:2000] if error else None, **summary},
    )


class OomGuard:
    """Reports each out-of-memory error of a step; with ``recover``, runs a step split into
    micro-batches and splits it further, in lockstep with the peers, until it fits."""

    def __init__(
        self,
        model: torch.nn.Module,
        parallelism: contract.Parallelism,
        device: torch.device,
        *,
        recover: bool,
        split_max: int,
        distributed: bool,
        identity: Identity,
        metrics: RankMetrics,
        errors: ErrorBudget,
        clock: StepClock,
    ) -> None:
        self._model = model
        self._parallelism = parallelism
        self._device = device
        self._recover = recover
        self._split_max = split_max
        self._distributed = distributed
        self._identity = identity
        self._metrics = metrics
        self._errors = errors
        self._clock = clock
        self.split = 1  # micro-batches per step now; later steps keep a split that worked
        self._reported = 0

    def split_more(self, factor: int) -> None:
        """Split every later step ``factor`` times more (the remediation service's directive;
        every rank gets the same one, and the agreement keeps them in lockstep if one applies
        it a step later)."""
        self.split = max(1, min(self._split_max, self.split * factor))

    def run_step(
        self, batch: Any, loss_fn: Callable[[Any], torch.Tensor], *, loss_is_mean: bool
    ) -> torch.Tensor:
        """Forward and backward of one step (see :meth:`.hook.Instrumentation.guarded_step`)."""
        total = batch_size(batch)
        if total == 0:
            raise ValueError("guarded_step needs a batch with a tensor that has a batch dim")
        retried = False
        while True:
            micro_batches = split_batch(batch, self.split)
            failed: BaseException | None = None
            loss_sum = torch.zeros((), device=self._device)
            ready: torch.Tensor | None = None
            for index, micro in enumerate(micro_batches):
                last = index == len(micro_batches) - 1
                sync = (
                    contextlib.nullcontext()
                    if last
                    else parallel.gradient_sync_off(self._model, self._parallelism)
                )
                with sync:
                    try:
                        weight = batch_size(micro) / total if loss_is_mean else 1.0
                        loss = loss_fn(micro) * weight
                        if not last:
                            loss.backward()
                            loss_sum += loss.detach()
                            del loss
                        else:
                            ready = loss
                    except torch.OutOfMemoryError as error:
                        failed = error
                        break
            if not self._recover:
                if failed is not None:
                    raise failed
                assert ready is not None
                ready.backward()
                return loss_sum + ready.detach()
            if self._any_rank_failed(failed is not None):
                ready = None
                self._abandon_attempt()
                if self.split >= self._split_max:
                    raise failed or torch.OutOfMemoryError(
                        f"a peer ran out of memory with {self.split} micro-batches"
                    )
                self.split = min(self._split_max, self.split * 2)
                logger.warning("trainguard: retrying the step in %d micro-batches", self.split)
                retried = True
                continue
            assert ready is not None
            ready.backward()
            if retried:
                self._recovered()
            return loss_sum + ready.detach()

    def on_oom(self, where: str, error: BaseException | None) -> None:
        """A wrapper saw an out-of-memory error in ``where``: count and log it."""
        with self._errors.guard("oom_guard"):
            self._reported += 1
            self._metrics.oom_events.inc()
            step = self._clock.step
            log_oom(self._identity, step, where, memory_summary(self._device), error)

    def on_allocator_oom(self, count: int) -> None:
        """The CUDA allocator saw ``count`` new OOMs; report those no wrapper reported."""
        unreported = count - self._reported
        self._reported = max(0, self._reported - count)
        for _ in range(max(0, unreported)):
            self.on_oom("backward", None)

    def _recovered(self) -> None:
        step = self._clock.step
        self._metrics.oom_recoveries.inc()
        log_event(
            f"step {step} recovered from an out-of-memory error in {self.split} micro-batches "
            "(later steps keep that split)",
            contract.EventKind.OOM_RECOVERED,
            level=logging.INFO,
            **self._identity.event_fields(),
            step=step,
            trace_id=tracing.format_trace_id(tracing.trace_id_for(self._identity.job_id, step)),
            outcome=contract.EventOutcome.SUCCESS,
            details={"micro_batches": self.split},
        )

    def _abandon_attempt(self) -> None:
        """Forget a failed attempt on every rank: its gradients and what the wrapper expected
        of the backward that never ran (see :func:`parallel.reset_after_failed_attempt`)."""
        self._model.zero_grad(set_to_none=True)
        parallel.reset_after_failed_attempt(self._model, self._parallelism)

    def _any_rank_failed(self, failed: bool) -> bool:
        if not self._distributed or self._identity.world_size <= 1:
            return failed
        # Through torch.distributed, so the timeline counts waiting here for a slower peer
        # as sync wait, not as this rank's compute.
        flag = torch.tensor([1.0 if failed else 0.0], device=self._device)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        return bool(flag.item() > 0)
