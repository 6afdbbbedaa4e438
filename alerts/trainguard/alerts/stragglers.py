"""Alert rules of the ``straggler`` and ``dataloader_bound`` failures: one rank slower than its
job's median, or waiting for its input."""

from __future__ import annotations

from trainguard import contract as c
from trainguard.alerts.promql import PHASE, J, R, num, on_scheduler_of_job, warmed_up, with_labels
from trainguard.alerts.rule import WHO_START, AlertRule
from trainguard.contract import Alert, Failure, Severity
from trainguard.thresholds import Thresholds

FAILURES = (Failure.STRAGGLER, Failure.DATALOADER_BOUND)


def _straggler(t: Thresholds) -> AlertRule:
    """Compute time (not step time) against the job median; the label names the slowest phase."""
    straggler = (
        f"{c.REC_RANK_COMPUTE_RATIO} >= {num(t.straggler_factor)}\n"
        f"and on ({J}) ({c.REC_JOB_RANKS_REPORTING} >= {t.straggler_min_ranks})\n"
        f"and on ({J}, {R}) ({warmed_up(t)})"
    )
    return AlertRule(
        alert=Alert.TRAINING_STRAGGLER,
        severity=Severity.WARNING,
        expr=on_scheduler_of_job(
            with_labels(
                straggler, f"{J}, {R}", PHASE, c.REC_RANK_SLOWEST_PHASE, c.REC_RANK_COMPUTE_RATIO
            ),
            c.REC_JOB_RANKS_REPORTING,
        ),
        for_=t.straggler_for,
        summary="Straggler: rank {{ $labels.rank }} of job {{ $labels.job_id }} on node "
        "{{ $labels.node }}",
        description=f"{WHO_START} needs "
        "{{ $value | printf `%.2f` }}x the job's median step compute time "
        f"(threshold {num(t.straggler_factor)}x) for {t.straggler_for}; every other "
        "rank waits for it at each gradient sync. Slowest phase: "
        "{{ or $labels.phase `unknown` }}.",
    )


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


def rules(t: Thresholds) -> list[AlertRule]:
    return [_straggler(t), _dataloader_bound(t)]
