"""What the fired faults do to a rank of the demo trainer: its compute, data, gradient sync and
memory. :class:`Sabotage` is the trainer's ``trainguard.demo.faults.Knobs``: the faults turn it,
the model, the data loader and the comm hook read it.

The comm hook is registered on the trainer's DDP model, and DDP inspects a hook's signature at
registration (``bucket`` annotated ``dist.GradBucket``, the return a ``Future``), so this module
keeps its annotations as real objects (no ``from __future__ import annotations``).
"""

import os
import signal
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import GradBucket
from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

# A stalled rank sleeps "forever": the job is restarted long before.
HANG_SECONDS = 900.0


@dataclass
class Sabotage:
    """What the fired faults do to this rank, read by its model, data loader, comm hook and
    loop. Healthy until a fault turns it."""

    make_batch: Callable[[int, int], torch.Tensor]
    base_work_seconds: float
    base_data_seconds: float
    batch_size: int
    work_seconds: float = 0.0
    data_seconds: float = 0.0
    comm_delay_seconds: float = 0.0
    comm_error: bool = False
    leak_bytes_per_step: int = 0
    oom_above: int | None = None
    leaked: list[torch.Tensor] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.work_seconds = self.base_work_seconds
        self.data_seconds = self.base_data_seconds

    def stall(self) -> None:
        time.sleep(HANG_SECONDS)

    def kill(self) -> None:
        os.kill(os.getpid(), signal.SIGKILL)

    def comm_hook(self, state: Any, bucket: GradBucket) -> torch.futures.Future[torch.Tensor]:
        """DDP's allreduce, entered late or failed as the faults say."""
        if self.comm_error:
            failed: torch.futures.Future[torch.Tensor] = torch.futures.Future()
            error = dist.DistBackendError("process group failed (injected by the fault plan)")
            # torch's stub types the argument as the future's value; it takes any exception.
            failed.set_exception(error)  # type: ignore[arg-type]
            return failed
        if self.comm_delay_seconds:
            time.sleep(self.comm_delay_seconds)
        return allreduce_hook(state, bucket)

    def batches(self, step: int, rank: int) -> Iterator[torch.Tensor]:
        while True:
            if self.data_seconds:
                time.sleep(self.data_seconds)
            yield self.make_batch(step, rank)
            step += 1

    def leak(self) -> None:
        if self.leak_bytes_per_step:
            self.leaked.append(torch.ones(self.leak_bytes_per_step // 4, dtype=torch.float32))
