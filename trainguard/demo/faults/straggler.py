"""Faults that make one rank a straggler: its compute, its data loading or its gradient sync
slower by a factor, on the rank and node it fired on, for as long as it runs there."""

from __future__ import annotations

from trainguard.contract import Alert, Failure
from trainguard.demo.faults import FAULT_KINDS, FaultKind, Knobs


def _slow_compute(knobs: Knobs, factor: float) -> None:
    knobs.work_seconds = knobs.base_work_seconds * factor


def _slow_data(knobs: Knobs, factor: float) -> None:
    # Adds (factor - 1) x a step's compute to each batch's wait.
    knobs.data_seconds = knobs.base_data_seconds + (factor - 1.0) * knobs.base_work_seconds


def _slow_comm(knobs: Knobs, factor: float) -> None:
    # The rank enters each gradient sync (factor - 1) x a step's compute late.
    knobs.comm_delay_seconds = (factor - 1.0) * knobs.base_work_seconds


STRAGGLER = FaultKind(
    Failure.STRAGGLER.value,
    Failure.STRAGGLER,
    "the rank's compute takes factor x as long",
    (Alert.TRAINING_STRAGGLER,),
    sustain=_slow_compute,
    matrix=(1.2, 1.5, 2.0),
)
DATA_SLOW = FaultKind(
    "data_slow",
    Failure.STRAGGLER,
    "the rank's data loading adds (factor - 1) x a step's compute",
    (Alert.TRAINING_STRAGGLER,),
    sustain=_slow_data,
    matrix=(1.5,),
    also_explains=(Alert.TRAINING_DATALOADER_BOUND,),
)
COMM_SLOW = FaultKind(
    "comm_slow",
    Failure.STRAGGLER,
    "the rank enters each gradient sync (factor - 1) x a step's compute late",
    (Alert.TRAINING_STRAGGLER,),
    sustain=_slow_comm,
    matrix=(1.5,),
)

FAULT_KINDS.register(Failure.STRAGGLER)((STRAGGLER, DATA_SLOW, COMM_SLOW))
