"""Alert and recording rules of the ``straggler`` failure: one rank's compute slower than its
job's median."""

from __future__ import annotations

from trainguard import contract as c
from trainguard.alerts.promql import (
    PHASE,
    RANK,
    J,
    R,
    num,
    on_scheduler_of_job,
    warmed_up,
    with_labels,
)
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


# A rank whose oldest collective has been in flight this many of its mean steps has stopped.
STUCK_STEPS = 3


def _recent_straggler(t: Thresholds) -> AlertRule:
    """Each rank's recent share of its step spent on its own work (the hook's median over its
    steps of the last 50 s, which a transient of 20 s only nudges) against its job's median share,
    held past a scrape or two that a whole job's change of pace lifts (docs/alerts.md). The
    slowest rank waits least, so its share is the highest; a share, not
    seconds, because ranks are scraped at different moments and a whole job slowing moves
    every rank's seconds at once but its share hardly. Read from the ranks' gauges at the
    alert's own evaluation: a recorded ratio would add up to one evaluation interval of lag;
    the gauges are also the labels' cover (``with_labels``), one series a rank. A rank with no
    share yet (0) counts neither way; a rank whose collective has been in flight for
    :data:`STUCK_STEPS` of its steps is hanging, not straggling (its share is frozen where it
    stopped: the hang rules' business). Once firing (its own ``ALERTS`` series at the last
    evaluation), it stays firing while the rank's highest share of a recent window is above a
    lower factor: a straggler waits for the others while a neighbour slows them, and one such
    dip would otherwise resolve a straggler that is still there."""
    share = f"max by ({RANK}) ({c.STEP_COMPUTE_SHARE.name} > 0)"
    median = f"quantile by ({J}) (0.5, {share})"
    ratio = f"(\n{share}\n/ on ({J}) group_left ()\n{median}\n)"
    window = t.straggler_recent_resolve_window
    recent_high = (
        f"(\nmax by ({RANK}) (max_over_time({c.STEP_COMPUTE_SHARE.name}[{window}]))\n"
        f"/ on ({J}) group_left ()\n{median}\n)"
    )
    firing = (
        f'{c.ALERTS_SERIES}{{{c.LABEL_ALERTNAME}="{Alert.TRAINING_STRAGGLER.value}",'
        f'{c.LABEL_DETECTOR}="{c.DETECTOR_RECENT}",{c.LABEL_ALERTSTATE}="{c.ALERTSTATE_FIRING}"}}'
    )
    straggler = (
        f"(\n{ratio} >= {num(t.straggler_recent_factor)}\nor\n"
        f"{recent_high} >= {num(t.straggler_recent_resolve_factor)}\n"
        f"and on ({J}, {R}) {firing}\n)\n"
        f"and on ({J}) (count by ({J}) ({share}) >= {t.straggler_min_ranks})\n"
        f"and on ({J}, {R}) ({warmed_up(t)})\n"
        f"unless on ({J}, {R}) (\n"
        f"max by ({RANK}) ({c.COLLECTIVE_OLDEST_INFLIGHT.name})\n"
        f"> {STUCK_STEPS} * {c.REC_RANK_STEP_DURATION_MEAN}\n)"
    )
    return AlertRule(
        alert=Alert.TRAINING_STRAGGLER,
        severity=Severity.WARNING,
        expr=on_scheduler_of_job(
            with_labels(straggler, f"{J}, {R}", PHASE, c.REC_RANK_SLOWEST_PHASE, share),
            share,
        ),
        for_=t.straggler_recent_for,
        labels={c.LABEL_DETECTOR: c.DETECTOR_RECENT},
        summary="Straggler: rank {{ $labels.rank }} of job {{ $labels.job_id }} on node "
        "{{ $labels.node }}",
        description=f"{WHO_START} spends "
        "{{ $value | printf `%.2f` }}x the job's median share of a step on its own work over "
        f"its timed steps of the last {c.RECENT_COMPUTE_SECONDS:g} s (threshold "
        f"{num(t.straggler_recent_factor)}x; firing until its highest over "
        f"{window} is under {num(t.straggler_recent_resolve_factor)}x) for "
        f"{t.straggler_recent_for}: it waits least, "
        "and every other rank waits for it at each gradient sync. Slowest phase: "
        "{{ or $labels.phase `unknown` }}.",
    )


@ALERT_RULES.register(Failure.STRAGGLER)
def rules(t: Thresholds) -> list[AlertRule]:
    return [_straggler(t), _recent_straggler(t)]


@RECORDING_RULES.register(Failure.STRAGGLER)
def recording(t: Thresholds) -> list[Recorded]:
    """Each rank against its job's recorded median (joined on the job: a rank is never compared
    with every other rank), its compute split by phase, and the phase in which it exceeds the
    job's median most (the alert's label, read for a few ranks, not 4 x every rank)."""
    jobs, phases, medians = (
        RecordingGroup.JOBS,
        RecordingGroup.JOBS_PHASES,
        RecordingGroup.JOBS_PHASE_MEDIANS,
    )
    phase_mean = c.REC_RANK_PHASE_MEAN
    data = f'{phase_mean}{{{PHASE}="{c.Phase.DATA.value}"}}'
    forward = f'{phase_mean}{{{PHASE}="{c.Phase.FORWARD.value}"}}'
    return [
        Recorded(jobs, c.REC_JOB_RANKS_REPORTING, f"count by ({J}) ({c.REC_RANK_COMPUTE_MEAN})"),
        Recorded(
            jobs, c.REC_JOB_COMPUTE_MEDIAN, f"quantile by ({J}) (0.5, {c.REC_RANK_COMPUTE_MEAN})"
        ),
        Recorded(
            jobs,
            c.REC_RANK_COMPUTE_RATIO,
            f"{c.REC_RANK_COMPUTE_MEAN}\n/ on ({J}) group_left ()\n{c.REC_JOB_COMPUTE_MEDIAN}",
        ),
        # Compute time split by phase: data and forward as measured; backward compute is what
        # is left of the compute time, since the backward phase also holds the wait on peers.
        # Equality matchers on the recorded means (no regex over the ranks' series).
        Recorded(
            phases,
            c.REC_RANK_PHASE_COMPUTE_MEAN,
            f"{data}\nor\n{forward}\nor\nlabel_replace(\n  clamp_min(\n"
            f"    {c.REC_RANK_COMPUTE_MEAN}\n    - on ({RANK})\n"
            f"    sum by ({RANK}) ({data} or {forward}),\n"
            f'    0\n  ),\n  "{PHASE}", "{c.Phase.BACKWARD.value}", "", ""\n)',
        ),
        Recorded(
            medians,
            c.REC_JOB_PHASE_COMPUTE_MEDIAN,
            f"quantile by ({J}, {PHASE}) (0.5, {c.REC_RANK_PHASE_COMPUTE_MEAN})",
        ),
        Recorded(
            medians,
            c.REC_RANK_PHASE_COMPUTE_EXCESS,
            f"{c.REC_RANK_PHASE_COMPUTE_MEAN}\n- on ({J}, {PHASE}) group_left ()\n"
            f"{c.REC_JOB_PHASE_COMPUTE_MEDIAN}",
        ),
        Recorded(
            medians,
            c.REC_RANK_SLOWEST_PHASE,
            f"topk by ({J}, {R}) (1, {c.REC_RANK_PHASE_COMPUTE_EXCESS})",
        ),
    ]
