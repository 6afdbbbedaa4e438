"""What kind of data parallelism a model uses, and the few things the hook does differently.

:func:`detect` tells DDP, FSDP2 (``fully_shard``), FSDP1 (``FullyShardedDataParallel``) and a
plain module apart; the rest of the hook is the same for all of them. The differences live
here: which process groups shard and replicate parameters (:func:`roles`, for the collective
timeline), how to accumulate gradients without synchronising them (:func:`gradient_sync_off`,
for ``guarded_step``'s micro-batches) and how to forget a failed attempt
(:func:`reset_after_failed_attempt`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
from torch.nn.parallel import DistributedDataParallel

from trainguard.contract import Parallelism
from trainguard.instrumentation import timeline

try:  # public since torch 2.6; older torches keep FSDP2 elsewhere and are taken as plain
    from torch.distributed.fsdp import FSDPModule
except ImportError:  # pragma: no cover - depends on the torch version
    FSDPModule = None  # type: ignore[assignment,misc]

try:
    from torch.distributed.fsdp import FullyShardedDataParallel
except ImportError:  # pragma: no cover - torch built without distributed
    FullyShardedDataParallel = None  # type: ignore[assignment,misc]


def device_of(model: torch.nn.Module) -> torch.device:
    """Where the model's first parameter lives (the CPU for a model without parameters)."""
    for parameter in model.parameters():
        return parameter.device
    return torch.device("cpu")


def detect(model: torch.nn.Module) -> Parallelism:
    if isinstance(model, DistributedDataParallel):
        return Parallelism.DDP
    if FSDPModule is not None and isinstance(model, FSDPModule):
        return Parallelism.FSDP2
    if FullyShardedDataParallel is not None and isinstance(model, FullyShardedDataParallel):
        return Parallelism.FSDP1
    return Parallelism.NONE


def fsdp2_modules(model: torch.nn.Module) -> list[Any]:
    """Every ``fully_shard`` module of ``model`` (the root and each unit)."""
    if FSDPModule is None:
        return []
    return [module for module in model.modules() if isinstance(module, FSDPModule)]


def roles(model: torch.nn.Module, parallelism: Parallelism) -> timeline.Roles:
    """The model's shard and replicate process groups (none known: a plain module, DDP)."""
    if parallelism is Parallelism.FSDP2:
        try:
            return timeline.roles_of_fsdp2(fsdp2_modules(model))
        except Exception:  # FSDP2's internals moved: reduce-scatters still count as syncs
            return timeline.Roles()
    if parallelism is Parallelism.FSDP1:
        return timeline.roles_of_fsdp1(model)
    return timeline.Roles()


@contextlib.contextmanager
def gradient_sync_off(model: torch.nn.Module, parallelism: Parallelism) -> Iterator[None]:
    """Accumulate gradients locally: DDP's and FSDP1's ``no_sync``, FSDP2's
    ``set_requires_gradient_sync(False)`` (turned back on when the block ends)."""
    if parallelism in (Parallelism.DDP, Parallelism.FSDP1):
        with model.no_sync():  # type: ignore[operator]
            yield
        return
    if parallelism is Parallelism.FSDP2:
        model.set_requires_gradient_sync(False)  # type: ignore[operator]
        try:
            yield
        finally:
            model.set_requires_gradient_sync(True)  # type: ignore[operator]
        return
    yield


def reset_after_failed_attempt(model: torch.nn.Module, parallelism: Parallelism) -> None:
    """Forget what the wrapper expected of a step that failed part-way (after the gradients
    were dropped), so that the next attempt starts clean on every rank."""
    if parallelism is Parallelism.DDP:
        # torch's own reset for "forward can run despite previous backward not succeeding";
        # it also makes every rank rebuild its buckets, in lockstep.
        model.reducer._reset_state()  # type: ignore[operator,union-attr]
    elif parallelism is Parallelism.FSDP2:
        _reset_fsdp2(model)
    elif parallelism is Parallelism.FSDP1:
        _reset_fsdp1(model)


def _reset_fsdp2(model: torch.nn.Module) -> None:
    """A forward that raised part-way leaves some units' parameters gathered. A backward that
    raised also leaves the root's end-of-backward callback marked as queued, so that the next
    backward never runs it (the root's gradients are then never reduce-scattered and its
    parameters stay unsharded), and, under ``set_requires_gradient_sync(False)``, the failed
    micro-batch's gradients on the unsharded parameters, where the retry would add to them.

    FSDP2's own ``reset_iter_state`` (torch 2.13+, on the root) undoes the first two (before
    it, resharding every unit undoes the forward's part); the unsharded gradients it leaves
    (torch 2.13), so they are dropped here, read defensively from FSDP2's parameter groups."""
    reset = getattr(model, "reset_iter_state", None)
    try:
        if not callable(reset):
            raise RuntimeError("this torch's FSDP2 has no reset_iter_state")
        reset()
    except RuntimeError:  # an older torch, or not the root: reshard every unit
        for module in fsdp2_modules(model):
            module.reshard()
    for module in fsdp2_modules(model):
        state = module._get_fsdp_state()
        for param_group in getattr(state, "_fsdp_param_groups", None) or []:
            for fsdp_param in getattr(param_group, "fsdp_params", []):
                if getattr(fsdp_param, "unsharded_accumulated_grad", None) is not None:
                    fsdp_param.unsharded_accumulated_grad = None
                unsharded = getattr(fsdp_param, "_unsharded_param", None)
                if unsharded is not None:
                    unsharded.grad = None


def _reset_fsdp1(model: torch.nn.Module) -> None:
    """FSDP1 has no public reset. A forward that raised part-way leaves the root in its
    ``FORWARD_BACKWARD`` state (``no_sync`` then refuses to start: "expected to be in states
    [IDLE]"), the units it gathered unsharded and their post-backward hooks registered; a
    backward that raised leaves its end-of-backward callback marked as queued, so that the next
    backward would never run it. torch's own end-of-backward callback undoes all of that:
    reshards, removes the hooks, puts every unit back to ``IDLE``."""
    if not getattr(model, "_is_root", False):  # never ran a forward: nothing to undo
        return
    try:
        from torch.distributed.fsdp._runtime_utils import _post_backward_final_callback
    except ImportError:  # pragma: no cover - depends on the torch version
        return
    for state in FullyShardedDataParallel.fsdp_modules(model):
        handle = getattr(state, "_handle", None)
        if handle is not None:
            # The units whose post-backward ran in a failed backward: without this the callback
            # asserts that their gradient shard was saved (it was not, under no_sync) or hands
            # the optimizer the stale shard (with sync).
            handle.flat_param._post_backward_called = False
    _post_backward_final_callback(model, model)
    model.zero_grad(set_to_none=True)
