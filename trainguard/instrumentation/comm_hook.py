"""Per-bucket gradient-sync timing: a DDP comm hook that wraps the user's own hook.

DDP accepts exactly one comm hook and cannot unregister it, so this wrapper composes with
the user's hook (``comm_hook=fp16_compress_hook``, say) instead of replacing it, and after
``uninstrument()`` it stays registered as a pass-through that only calls the user's hook (or
torch's ``allreduce_hook``, which is what DDP does without a hook). On CUDA the sync is timed
with CUDA events on the current stream, because the future's callback may run before the
kernels finish; on CPU with ``perf_counter_ns`` in the callback.

DDP inspects the hook's signature at registration (parameter ``bucket`` annotated
``dist.GradBucket``, return ``torch.futures.Future[torch.Tensor]``), so this module keeps
its annotations as real objects (no ``from __future__ import annotations``).
"""

import time
from collections.abc import Callable
from typing import Any

import torch
from torch._C._distributed_c10d import GradBucket
from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

from trainguard.instrumentation.errors import ErrorBudget
from trainguard.instrumentation.records import BucketTiming
from trainguard.instrumentation.timeline import INTERCEPTOR

CommHook = Callable[[Any, GradBucket], torch.futures.Future[torch.Tensor]]


class BucketTimer:
    """Times each bucket's sync; the current step's timings accumulate in :attr:`timings`."""

    def __init__(
        self,
        errors: ErrorBudget,
        user_hook: CommHook | None,
        user_state: Any,
        process_group: Any,
    ) -> None:
        self.active = True
        self.timings: list[BucketTiming] = []
        self._errors = errors
        self._hook: CommHook = user_hook if user_hook is not None else allreduce_hook
        self._state = user_state if user_hook is not None else process_group

    def take(self) -> list[BucketTiming]:
        """The timings recorded since the last call (DDP has finished every bucket by now)."""
        timings, self.timings = self.timings, []
        return timings

    def hook(self, _state: object, bucket: GradBucket) -> torch.futures.Future[torch.Tensor]:
        """The comm hook DDP calls once per bucket (registered as this bound method)."""
        if not self.active:
            return self._hook(self._state, bucket)
        buffer = bucket.buffer()
        use_cuda = buffer.is_cuda
        start_event = None
        start_ns = 0
        try:
            if use_cuda:
                start_event = torch.cuda.Event(enable_timing=True)
                start_event.record()
            else:
                start_ns = time.perf_counter_ns()
        except Exception as error:
            self._errors.record("bucket_timer", error)
            return self._hook(self._state, bucket)
        # The hook's own all-reduce is this bucket's gradient sync, timed here: the collective
        # timeline is paused so that it is not recorded a second time as another collective.
        timeline, INTERCEPTOR.current = INTERCEPTOR.current, None
        try:
            future = self._hook(self._state, bucket)
        finally:
            INTERCEPTOR.current = timeline
        index = bucket.index()
        nbytes = buffer.numel() * buffer.element_size()
        timings = self.timings

        def finished(fut: torch.futures.Future[torch.Tensor]) -> torch.Tensor:
            try:
                if use_cuda:
                    end_event = torch.cuda.Event(enable_timing=True)
                    end_event.record()
                    timings.append(BucketTiming(index, nbytes, 0, 0, (start_event, end_event)))
                else:
                    timings.append(BucketTiming(index, nbytes, start_ns, time.perf_counter_ns()))
            except Exception as error:
                self._errors.record("bucket_timer", error)
            return fut.value()

        return future.then(finished)
