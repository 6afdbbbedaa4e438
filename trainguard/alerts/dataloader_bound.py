"""Alert and recording rules of the ``dataloader_bound`` failure: a rank waiting for its input
for a large share of each step."""

from __future__ import annotations

from trainguard import contract as c
from trainguard.alerts.promql import PHASE, RANK, J, R, num, on_scheduler_of_job, warmed_up
from trainguard.alerts.rule import (
    ALERT_RULES,
    RECORDING_RULES,
    WHO_START,
    AlertRule,
    Recorded,
    RecordingGroup,
)
from trainguard.contract import Alert, Failure, Severity
from trainguard.thresholds import Thresholds


def _dataloader_bound(t: Thresholds) -> AlertRule:
    return AlertRule(
        alert=Alert.TRAINING_DATALOADER_BOUND,
        severity=Severity.WARNING,
        expr=on_scheduler_of_job(
            f"{c.REC_RANK_DATA_WAIT_RATIO} > {num(t.dataloader_wait_ratio)}\n"
            f"and on ({J}, {R}) ({warmed_up(t)})",
            c.REC_RANK_DATA_WAIT_RATIO,
        ),
        for_=t.dataloader_for,
        summary="Data loading bounds rank {{ $labels.rank }} of job {{ $labels.job_id }}",
        description=f"{WHO_START} spends "
        "{{ $value | humanizePercentage }} of each step waiting for data "
        f"(threshold {num(t.dataloader_wait_ratio * 100)}%).",
    )


@ALERT_RULES.register(Failure.DATALOADER_BOUND)
def rules(t: Thresholds) -> list[AlertRule]:
    return [_dataloader_bound(t)]


@RECORDING_RULES.register(Failure.DATALOADER_BOUND)
def recording(t: Thresholds) -> list[Recorded]:
    """Each rank's share of the step spent waiting for data."""
    data = f'{c.REC_RANK_PHASE_MEAN}{{{PHASE}="{c.Phase.DATA.value}"}}'
    return [
        Recorded(
            RecordingGroup.JOBS_PHASES,
            c.REC_RANK_DATA_WAIT_RATIO,
            f"{data}\n/ on ({RANK})\n{c.REC_RANK_STEP_DURATION_MEAN}",
        )
    ]
