"""Alert and recording rules of the ``oom`` failure: out-of-memory errors, memory close to
capacity, fragmentation of the caching allocator."""

from __future__ import annotations

from trainguard import contract as c
from trainguard.alerts.promql import RANK, increased, num, on_scheduler_of_job
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


def _oom(t: Thresholds) -> list[AlertRule]:
    """Critical when the OOM guard did not recover, warning when it did (by splitting)."""
    oom = c.REC_RANK_OOM_EVENTS
    # Counted OOMs not followed by a recovery; a hook without the recovery counter counts 0.
    unrecovered = f"{oom}\n- on ({RANK})\n({c.REC_RANK_OOM_RECOVERIES} or 0 * {oom})"
    return [
        AlertRule(
            alert=Alert.TRAINING_OOM,
            severity=Severity.CRITICAL,
            expr=on_scheduler_of_job(f"{unrecovered}\n> 0.5", oom),
            summary="CUDA out of memory on rank {{ $labels.rank }} of job {{ $labels.job_id }}",
            description="{{ $value | printf `%.0f` }} out-of-memory error(s) in the last "
            f"{t.oom_window} on {WHO} were not recovered by the OOM guard; the step failed.",
        ),
        AlertRule(
            alert=Alert.TRAINING_OOM,
            severity=Severity.WARNING,
            expr=on_scheduler_of_job(
                f"{oom} > 0.5\nunless on ({RANK})\n({unrecovered} > 0.5)", oom
            ),
            summary="Recovered out-of-memory errors on rank {{ $labels.rank }} of job "
            "{{ $labels.job_id }}",
            description="{{ $value | printf `%.0f` }} out-of-memory error(s) in the last "
            f"{t.oom_window} on {WHO}; the OOM guard recovered by splitting the batch, "
            "at a cost in throughput.",
        ),
    ]


def _oom_risk(t: Thresholds) -> AlertRule:
    """Little headroom left, or less headroom with allocations growing to the limit."""
    headroom = c.REC_RANK_MEMORY_HEADROOM
    return AlertRule(
        alert=Alert.TRAINING_OOM_RISK,
        severity=Severity.WARNING,
        expr=on_scheduler_of_job(
            f"{headroom} < {num(t.oom_risk_headroom_ratio)}\nor\n"
            f"(\n  {headroom} < {num(t.oom_risk_predict_headroom_ratio)}\n"
            f"  and on ({RANK})\n  {c.REC_RANK_MEMORY_AT_CAPACITY}\n)",
            headroom,
        ),
        for_=t.oom_risk_for,
        summary="Memory about to run out on rank {{ $labels.rank }} of job {{ $labels.job_id }}",
        description="Only {{ $value | humanizePercentage }} of device memory is free on "
        f"{WHO} (below {num(t.oom_risk_headroom_ratio * 100)}%, or below "
        f"{num(t.oom_risk_predict_headroom_ratio * 100)}% with allocations growing "
        f"to the limit within {num(t.oom_risk_predict_horizon_seconds)}s).",
    )


def _fragmentation(t: Thresholds) -> AlertRule:
    """Reserved memory holding no tensor, while the allocator has to retry."""
    retries = c.REC_RANK_ALLOC_RETRIES
    return AlertRule(
        alert=Alert.TRAINING_MEMORY_FRAGMENTATION,
        severity=Severity.WARNING,
        expr=on_scheduler_of_job(
            f"max by ({RANK}) ({c.MEMORY_FRAGMENTATION.name}) > "
            f"{num(t.fragmentation_ratio)}\nand on ({RANK})\n{retries}",
            retries,
        ),
        for_=t.fragmentation_for,
        summary="Fragmented GPU memory on rank {{ $labels.rank }} of job {{ $labels.job_id }}",
        description="{{ $value | humanizePercentage }} of the memory reserved on "
        f"{WHO} holds no tensor, and the allocator had to free its cache and retry in the "
        f"last {t.fragmentation_retry_window}.",
    )


@ALERT_RULES.register(Failure.OOM)
def rules(t: Thresholds) -> list[AlertRule]:
    return [*_oom(t), _oom_risk(t), _fragmentation(t)]


@RECORDING_RULES.register(Failure.OOM)
def recording(t: Thresholds) -> list[Recorded]:
    """Memory headroom per rank, and the alerts' long-window inputs (OOMs and their recoveries,
    allocator retries, the allocation the trend reaches within the risk horizon where that is at
    capacity): one pass over the raw series, kept where non-zero, so the alerts and their
    ``cover`` read a handful of recorded series, not every rank's window twice."""
    health, inputs = RecordingGroup.RANKS_HEALTH, RecordingGroup.RANKS_ALERT_INPUTS
    return [
        Recorded(
            health,
            c.REC_RANK_MEMORY_HEADROOM,
            f"1 - sum by ({RANK}) ({c.MEMORY_RESERVED.name})\n"
            f"/ sum by ({RANK}) ({c.MEMORY_CAPACITY.name} > 0)",
        ),
        Recorded(inputs, c.REC_RANK_OOM_EVENTS, increased(c.OOM_EVENTS, t.oom_window)),
        Recorded(inputs, c.REC_RANK_OOM_RECOVERIES, increased(c.OOM_RECOVERIES, t.oom_window)),
        Recorded(
            inputs,
            c.REC_RANK_ALLOC_RETRIES,
            increased(c.MEMORY_ALLOC_RETRIES, t.fragmentation_retry_window),
        ),
        Recorded(
            inputs,
            c.REC_RANK_MEMORY_AT_CAPACITY,
            f"sum by ({RANK}) (predict_linear("
            f"{c.MEMORY_ALLOCATED.name}[{t.oom_risk_predict_window}], "
            f"{num(t.oom_risk_predict_horizon_seconds)}))\n"
            f">= on ({RANK})\nsum by ({RANK}) ({c.MEMORY_CAPACITY.name})",
        ),
    ]
