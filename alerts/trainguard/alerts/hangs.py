"""Alert rules of the ``hang`` and ``nccl_timeout`` failures: a collective that never
completes, a job that completes no step, a collective the NCCL watchdog aborted."""

from __future__ import annotations

from trainguard import contract as c
from trainguard.alerts.promql import J, R, num, on_scheduler_of_job, with_labels
from trainguard.alerts.rule import WHO, AlertRule
from trainguard.contract import Alert, Failure, Severity
from trainguard.thresholds import Thresholds

FAILURES = (Failure.HANG, Failure.NCCL_TIMEOUT)

# Labels naming the rank an alert suspects: the laggard of a hang, the stalest rank of a stall.
SUSPECT = f"{R}, {c.LABEL_LOCAL_RANK}, {c.LABEL_NODE}"


def _collective_stalled(t: Thresholds) -> AlertRule:
    """The job's oldest collective past its threshold, labelled with the suspect rank."""
    inflight = c.REC_JOB_OLDEST_INFLIGHT
    stalled = f"{inflight}\n> on ({J})\n{c.REC_JOB_STALL_THRESHOLD}"
    return AlertRule(
        alert=Alert.TRAINING_COLLECTIVE_STALLED,
        severity=Severity.CRITICAL,
        expr=on_scheduler_of_job(
            with_labels(stalled, J, SUSPECT, c.REC_JOB_COLLECTIVE_LAGGARD, inflight),
            inflight,
        ),
        for_=t.collective_stall_for,
        summary="Collective stalled in job {{ $labels.job_id }}"
        "{{ with $labels.rank }}; suspect rank {{ . }}{{ end }}",
        description="The oldest in-flight collective of job {{ $labels.job_id }} has waited "
        "{{ $value | humanizeDuration }}, past its threshold of {{ with query (printf `"
        + c.REC_JOB_STALL_THRESHOLD
        + '{job_id="%s"}` $labels.job_id) }}{{ . | first | value | humanizeDuration }}'
        "{{ end }}. Suspect: rank {{ or $labels.rank `unknown` }} on node "
        "{{ or $labels.node `unknown` }}, which launched the fewest collectives or has "
        "none in flight. Read its Flight Recorder dump before NCCL's timeout kills the job.",
    )


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


def _stalled(t: Thresholds) -> AlertRule:
    """No rank completes a step, labelled with the rank whose last step is oldest."""
    # Both read per-job recorded series: no pass over every rank's last step here.
    last = c.REC_JOB_LAST_STEP
    stalled = f"time() - {last} > {num(t.stalled_seconds)}"
    stalest = c.REC_JOB_STALEST_RANK
    return AlertRule(
        alert=Alert.TRAINING_STALLED,
        severity=Severity.CRITICAL,
        expr=on_scheduler_of_job(with_labels(stalled, J, SUSPECT, stalest, last), last),
        for_=t.stalled_for,
        summary="Training job {{ $labels.job_id }} makes no progress",
        description="No rank of job {{ $labels.job_id }} has completed a step for "
        "{{ $value | humanizeDuration }}; the rank whose last step is oldest is rank "
        "{{ or $labels.rank `unknown` }} on node {{ or $labels.node `unknown` }}.",
    )


def rules(t: Thresholds) -> list[AlertRule]:
    return [_collective_stalled(t), _nccl_timeout(t), _stalled(t)]
