"""Faults that hang the job: a rank that stops joining collectives, in its training loop, at the
barrier around a checkpoint, or in its data loader."""

from __future__ import annotations

from trainguard.contract import Alert, Failure
from trainguard.demo.faults import FAULT_KINDS, FaultKind, Knobs

# A stall is seen by whichever of the hang's alerts comes first: the collective's age, or no
# step completing.
STALL_ALERTS = (Alert.TRAINING_COLLECTIVE_STALLED, Alert.TRAINING_STALLED)


def _stall(knobs: Knobs) -> None:
    knobs.stall()


HANG = FaultKind(
    Failure.HANG.value,
    Failure.HANG,
    "the rank stops joining collectives",
    STALL_ALERTS,
    fire=_stall,
)
BARRIER_HANG = FaultKind(
    "barrier_hang",
    Failure.HANG,
    "the rank stops before the barrier around a checkpoint",
    STALL_ALERTS,
    fire=_stall,
    at_checkpoint=True,
)
DATA_STALL = FaultKind(
    "data_stall",
    Failure.HANG,
    "the rank's data loader blocks: its peers wait in the gradient sync",
    STALL_ALERTS,
    fire=_stall,
)

FAULT_KINDS.register(Failure.HANG)((HANG, BARRIER_HANG, DATA_STALL))
