"""Alert rules of the ``rank_failure`` failure: a rank's process died or stopped answering."""

from __future__ import annotations

from trainguard.alerts.promql import RANK, RANK_UP, J, R, on_scheduler_of_job
from trainguard.alerts.rule import WHO, AlertRule
from trainguard.contract import Alert, Failure, Severity
from trainguard.thresholds import Thresholds

FAILURES = (Failure.RANK_FAILURE,)


def _rank_down(t: Thresholds) -> AlertRule:
    """A rank's endpoint down (up 0) or gone (target vanished) while its job still runs."""
    rank_down = (
        f"(\n  (max by ({RANK}) ({RANK_UP}) == 0)\n"
        f"  unless on ({J}, {R}) ({RANK_UP} == 1)\n"
        f"or\n  group by ({RANK}) (max_over_time({RANK_UP}[{t.rank_absent_window}]))\n"
        f"  unless on ({J}, {R}) {RANK_UP}\n)\n"
        f"and on ({J}) (max by ({J}) ({RANK_UP}) == 1)"
    )
    return AlertRule(
        alert=Alert.TRAINING_RANK_DOWN,
        severity=Severity.CRITICAL,
        expr=on_scheduler_of_job(rank_down),
        for_=t.rank_down_for,
        summary="Rank {{ $labels.rank }} of job {{ $labels.job_id }} is down",
        description=f"The metrics endpoint of {WHO} is down or gone while other ranks of the "
        "job still run; the survivors will block at their next collective.",
    )


def rules(t: Thresholds) -> list[AlertRule]:
    return [_rank_down(t)]
