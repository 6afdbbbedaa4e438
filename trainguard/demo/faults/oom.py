"""Faults that run a rank out of memory: a batch that no longer fits, or memory that creeps
towards the rank's capacity."""

from __future__ import annotations

from trainguard.contract import Alert, Cause, Failure
from trainguard.demo.faults import FAULT_KINDS, FaultKind, Knobs

# How much each step's memory grows on a rank whose memory creeps (about 40 MB/s at the
# demo's ten steps a second).
LEAK_BYTES_PER_STEP = 4 << 20


def _no_longer_fits(knobs: Knobs) -> None:
    # From now on only half a batch fits.
    knobs.oom_above = knobs.batch_size // 2


def _creep(knobs: Knobs) -> None:
    # The process that fired it leaks; a restarted one starts clean.
    knobs.leak_bytes_per_step = LEAK_BYTES_PER_STEP


OOM = FaultKind(
    Failure.OOM.value,
    Failure.OOM,
    "a whole batch no longer fits on the rank",
    (Alert.TRAINING_OOM,),
    fire=_no_longer_fits,
)
MEMORY_CREEP = FaultKind(
    Cause.MEMORY_CREEP.value,
    Failure.OOM,
    "the rank's memory grows towards its capacity",
    (Alert.TRAINING_OOM_RISK,),
    fire=_creep,
    # Writing 4 MiB of fresh memory a step slows its rank by some 10% (measured in the fault
    # matrix at the shipped defaults): a straggler, rightly, where the creep is.
    also_explains=(Alert.TRAINING_STRAGGLER,),
)

FAULT_KINDS.register(Failure.OOM)((OOM, MEMORY_CREEP))
