"""Alert and recording rules of the ``hang`` failure: a collective that never completes, a job
that completes no step."""

from __future__ import annotations

from trainguard import contract as c
from trainguard.alerts.promql import RANK, J, R, job_quantile, num, on_scheduler_of_job, with_labels
from trainguard.alerts.rule import (
    ALERT_RULES,
    RECORDING_RULES,
    AlertRule,
    Recorded,
    RecordingGroup,
)
from trainguard.contract import Alert, Failure, Severity
from trainguard.thresholds import Thresholds

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


@ALERT_RULES.register(Failure.HANG)
def rules(t: Thresholds) -> list[AlertRule]:
    return [_collective_stalled(t), _stalled(t)]


@RECORDING_RULES.register(Failure.HANG)
def recording(t: Thresholds) -> list[Recorded]:
    """Per job, from the ranks' raw series: the oldest collective in flight, the rank a hang
    waits for, the newest last step and the rank whose last step is oldest; then the job's
    stall threshold, which scales with its own step time."""
    health, jobs = RecordingGroup.RANKS_HEALTH, RecordingGroup.JOBS
    last_step = f"max by ({RANK}) ({c.LAST_STEP_TIMESTAMP.name} > 0)"
    return [
        Recorded(
            health,
            c.REC_JOB_OLDEST_INFLIGHT,
            f"max by ({J}) ({c.COLLECTIVE_OLDEST_INFLIGHT.name})",
        ),
        # The rank a hang waits for: fewest collectives launched, and among equals the one with
        # no collective in flight (+0.5 for having one keeps launched counts dominant).
        Recorded(
            health,
            c.REC_JOB_COLLECTIVE_LAGGARD,
            f"bottomk by ({J}) (\n  1,\n  sum by ({RANK}) ({c.COLLECTIVES_LAUNCHED.name})\n"
            f"  + on ({RANK})\n  0.5 * clamp_max(sum by ({RANK}) "
            f"({c.COLLECTIVE_INFLIGHT.name}), 1)\n)",
        ),
        Recorded(health, c.REC_JOB_LAST_STEP, f"max by ({J}) ({c.LAST_STEP_TIMESTAMP.name} > 0)"),
        Recorded(health, c.REC_JOB_STALEST_RANK, f"bottomk by ({J}) (1, {last_step})"),
        # The hour's p99 from the job's recorded 5-minute bucket rates averaged over the hour
        # (a handful of series per job), not from an hour of every rank's buckets.
        Recorded(
            jobs,
            c.REC_JOB_STEP_DURATION_P99_1H,
            job_quantile(0.99, f"avg_over_time({c.REC_JOB_STEP_DURATION_BUCKET_RATE}[1h])"),
        ),
        # A hang's threshold scales with the job's own step time; jobs without step history
        # (or with NaN quantiles) fall back to the floor.
        Recorded(
            jobs,
            c.REC_JOB_STALL_THRESHOLD,
            f"clamp_min(\n  {num(t.collective_stall_step_multiplier)} * "
            f"{c.REC_JOB_STEP_DURATION_P99_1H} > 0,\n"
            f"  {num(t.collective_stall_floor_seconds)}\n)\n"
            f"or on ({J})\n(0 * {c.REC_JOB_OLDEST_INFLIGHT} + "
            f"{num(t.collective_stall_floor_seconds)})",
        ),
    ]
