"""Faults that take a rank down: its process killed, or its process group failing."""

from __future__ import annotations

from trainguard.contract import Alert, Failure
from trainguard.demo.faults import FAULT_KINDS, FaultKind, Knobs

# A dead rank's whole worker group restarts, so TrainingRankDown (the rest of the job up)
# cannot fire; the restart is what is seen.
RESTART_ALERTS = (Alert.TRAINING_RANK_RESTARTED,)


def _kill(knobs: Knobs) -> None:
    knobs.kill()


def _fail_process_group(knobs: Knobs) -> None:
    knobs.comm_error = True


KILL = FaultKind(
    "kill",
    Failure.RANK_FAILURE,
    "the rank's process is killed (SIGKILL)",
    RESTART_ALERTS,
    fire=_kill,
)
PG_ERROR = FaultKind(
    "pg_error",
    Failure.RANK_FAILURE,
    "the rank's process group fails its next gradient sync",
    RESTART_ALERTS,
    fire=_fail_process_group,
)

FAULT_KINDS.register(Failure.RANK_FAILURE)((KILL, PG_ERROR))
