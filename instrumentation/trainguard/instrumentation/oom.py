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
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch


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
