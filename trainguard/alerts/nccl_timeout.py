"""Alert and recording rules of the ``nccl_timeout`` failure: a collective that NCCL's watchdog
aborted when it ran past its process group's timeout."""

from __future__ import annotations

from trainguard import contract as c
from trainguard.alerts.promql import increased, on_scheduler_of_job
from trainguard.alerts.rule import (
    ALERT_RULES,
    RECORDING_RULES,
    WHO,
    AlertRule,
    Recorded,
    RecordingGroup,
)
from trainguard.contract import Alert, Failure, Severity
from trainguard.thresholds import Thresholds


def _nccl_timeout(t: Thresholds) -> AlertRule:
    # Recorded where non-zero: each rank's timeouts in the window.
    timeouts = c.REC_RANK_COLLECTIVE_TIMEOUTS
    return AlertRule(
        alert=Alert.TRAINING_NCCL_TIMEOUT,
        severity=Severity.CRITICAL,
        expr=on_scheduler_of_job(timeouts, timeouts),
        summary="NCCL collective timeout on rank {{ $labels.rank }} of job {{ $labels.job_id }}",
        description=f"A collective on {WHO} ran past its process group's timeout in the last "
        f"{t.nccl_timeout_window}; the NCCL watchdog aborts the job.",
    )


@ALERT_RULES.register(Failure.NCCL_TIMEOUT)
def rules(t: Thresholds) -> list[AlertRule]:
    return [_nccl_timeout(t)]


@RECORDING_RULES.register(Failure.NCCL_TIMEOUT)
def recording(t: Thresholds) -> list[Recorded]:
    """Each rank's collective timeouts in the alert's window, kept where non-zero."""
    return [
        Recorded(
            RecordingGroup.RANKS_ALERT_INPUTS,
            c.REC_RANK_COLLECTIVE_TIMEOUTS,
            increased(c.COLLECTIVE_TIMEOUTS, t.nccl_timeout_window),
        )
    ]
