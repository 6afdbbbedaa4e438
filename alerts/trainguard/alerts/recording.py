"""The recording rules: per-rank and per-job series every alert, dashboard and diagnosis reads.

In groups that each stay bounded as a job grows (``recording_groups``,
docs/alerts.md#how-the-rules-scale): the ``ranks*`` groups read the ranks' raw series, each
group its part of them, once per evaluation, and keep per-rank means, per-job aggregates (bucket
rates, the oldest collective, the last step) and the alerts' long-window inputs where non-zero;
the ``jobs*`` groups read recorded series only (per-job medians and quantiles, each rank's ratio
to its job's median joined on the job, the phase split). Within a group rules run in order
(later rules read earlier ones); across groups, and in the alert group, a rule reads the others'
recorded series as of their last evaluation, at most one interval behind. The reliability rules
(the remediation service's success rate and MTTR over an hour to a week) feed dashboards only,
so they run in a group of their own, once a minute.
"""

from __future__ import annotations

from typing import Any

from trainguard import contract
from trainguard.alerts.promql import PHASE, RANK, SCHEDULER, J, N, R, mean, num
from trainguard.thresholds import Thresholds


def one_scheduler_per(level: str, labels: str, window: str, *preferred: str) -> str:
    """Per ``level`` value, the ``labels`` its ranks report in ``rank_info``, or no series.

    Reads the ranks' ``rank_info`` as recorded per job and node (``REC_JOB_NODE_SCHEDULER``).
    Tiers, the first that has an answer wins: ranks reporting now that name a scheduler and
    one of the ``preferred`` labels (the handle an executor needs); ranks reporting now that
    name a scheduler; ranks that named one within ``window`` (an alert that outlives its
    ranks keeps its labels). Within a tier, ranks that disagree give no answer at all: the
    alert goes without the labels (to the service's default scheduler) rather than to a
    scheduler picked at random.
    """
    info = contract.REC_JOB_NODE_SCHEDULER
    fresh_with_handle = " or ".join(f'{info}{{{label}!=""}}' for label in preferred)
    tiers = [
        *([fresh_with_handle] if preferred else []),
        info,
        f"last_over_time({info}[{window}])",
    ]

    def unambiguous(selector: str) -> str:
        answers = f"max by ({level}, {labels}) ({selector})"
        return f"(\n  {answers}\n  and on ({level}) (count by ({level}) ({answers}) == 1)\n)"

    return f"\nor on ({level})\n".join(unambiguous(tier) for tier in tiers)


Rule = tuple[str, str]  # (record, expr)


def _schedulers(t: Thresholds) -> list[Rule]:
    """Where each job and node runs: the labels alerts copy for remediation's routing."""
    c = contract
    info = contract.RANK_INFO.name
    return [
        (
            c.REC_JOB_NODE_SCHEDULER,
            f'max by ({J}, {N}, {SCHEDULER}) ({info}{{{c.LABEL_SCHEDULER}!=""}})',
        ),
        (
            c.REC_JOB_SCHEDULER,
            one_scheduler_per(
                J,
                SCHEDULER,
                t.scheduler_labels_window,
                c.LABEL_NAMESPACE,
                c.LABEL_SLURM_JOB_ID,
            ),
        ),
        (
            c.REC_NODE_SCHEDULER,
            one_scheduler_per(N, c.LABEL_SCHEDULER, t.scheduler_labels_window),
        ),
    ]


def _rank_step_times(w: str) -> list[Rule]:
    """Step, compute and sync-wait times per rank, from the ranks' raw series."""
    c = contract
    return [
        (c.REC_RANK_STEPS_RATE, f"sum by ({RANK}) (rate({c.STEPS.name}[{w}]))"),
        (c.REC_RANK_STEP_DURATION_MEAN, mean(c.STEP_DURATION.name, RANK, w)),
        (c.REC_RANK_COMPUTE_MEAN, mean(c.STEP_COMPUTE_DURATION.name, RANK, w)),
        (c.REC_RANK_SYNC_WAIT_MEAN, mean(c.SYNC_WAIT_DURATION.name, RANK, w)),
    ]


def _rank_phases(w: str) -> list[Rule]:
    """Phase times per rank, from the ranks' raw series (the phase split and the dashboards)."""
    c = contract
    return [(c.REC_RANK_PHASE_MEAN, mean(c.STEP_PHASE_DURATION.name, f"{RANK}, {PHASE}", w))]


def _job_step_buckets(w: str) -> list[Rule]:
    """The one pass over the ranks' step-time buckets, summed per job (the job's step-time
    quantiles read these, never the ranks' buckets)."""
    c = contract
    return [
        (
            c.REC_JOB_STEP_DURATION_BUCKET_RATE,
            f"sum by ({J}, le) (rate({c.STEP_DURATION.bucket_name}[{w}]))",
        ),
    ]


def _rank_sync(w: str) -> list[Rule]:
    """The one pass over the ranks' gradient-sync buckets, summed per job, and each rank's mean
    gradient sync time (the dashboards: the rank the others wait for syncs least)."""
    c = contract
    return [
        (
            c.REC_JOB_GRAD_SYNC_BUCKET_RATE,
            f"sum by ({J}, le) (rate({c.GRAD_SYNC_DURATION.bucket_name}[{w}]))",
        ),
        (c.REC_RANK_GRAD_SYNC_MEAN, mean(c.GRAD_SYNC_DURATION.name, RANK, w)),
    ]


def _rank_memory() -> list[Rule]:
    """Memory headroom per rank."""
    c = contract
    return [
        (
            c.REC_RANK_MEMORY_HEADROOM,
            f"1 - sum by ({RANK}) ({c.MEMORY_RESERVED.name})\n"
            f"/ sum by ({RANK}) ({c.MEMORY_CAPACITY.name} > 0)",
        ),
    ]


def _rank_alert_inputs(t: Thresholds) -> list[Rule]:
    """The alerts' per-rank inputs over long windows (OOMs, timeouts, allocator retries, the
    memory trend): one pass over the raw series, kept where non-zero, so the alerts, and
    their ``cover`` of the scheduler join, read a handful of recorded series, not every rank's
    window twice."""
    c = contract

    def increased(counter: contract.MetricSpec, window: str) -> str:
        return f"sum by ({RANK}) (increase({counter.name}[{window}])) > 0"

    return [
        (c.REC_RANK_OOM_EVENTS, increased(c.OOM_EVENTS, t.oom_window)),
        (c.REC_RANK_OOM_RECOVERIES, increased(c.OOM_RECOVERIES, t.oom_window)),
        (c.REC_RANK_COLLECTIVE_TIMEOUTS, increased(c.COLLECTIVE_TIMEOUTS, t.nccl_timeout_window)),
        (c.REC_RANK_ALLOC_RETRIES, increased(c.MEMORY_ALLOC_RETRIES, t.fragmentation_retry_window)),
        (
            c.REC_RANK_MEMORY_AT_CAPACITY,
            f"sum by ({RANK}) (predict_linear("
            f"{c.MEMORY_ALLOCATED.name}[{t.oom_risk_predict_window}], "
            f"{num(t.oom_risk_predict_horizon_seconds)}))\n"
            f">= on ({RANK})\nsum by ({RANK}) ({c.MEMORY_CAPACITY.name})",
        ),
    ]


def _rank_hangs() -> list[Rule]:
    """Per job, from the ranks' raw series: the oldest collective in flight, the rank a hang
    waits for, the newest last step and the rank whose last step is oldest."""
    c = contract
    last_step = f"max by ({RANK}) ({c.LAST_STEP_TIMESTAMP.name} > 0)"
    return [
        (c.REC_JOB_OLDEST_INFLIGHT, f"max by ({J}) ({c.COLLECTIVE_OLDEST_INFLIGHT.name})"),
        # The rank a hang waits for: fewest collectives launched, and among equals the one with
        # no collective in flight (+0.5 for having one keeps launched counts dominant).
        (
            c.REC_JOB_COLLECTIVE_LAGGARD,
            f"bottomk by ({J}) (\n  1,\n  sum by ({RANK}) ({c.COLLECTIVES_LAUNCHED.name})\n"
            f"  + on ({RANK})\n  0.5 * clamp_max(sum by ({RANK}) "
            f"({c.COLLECTIVE_INFLIGHT.name}), 1)\n)",
        ),
        (c.REC_JOB_LAST_STEP, f"max by ({J}) ({c.LAST_STEP_TIMESTAMP.name} > 0)"),
        (c.REC_JOB_STALEST_RANK, f"bottomk by ({J}) (1, {last_step})"),
    ]


def _jobs(t: Thresholds) -> list[Rule]:
    """Per-job aggregations of the recorded per-rank series, and each rank against its job's
    recorded median (joined on the job: a rank is never compared with every other rank)."""
    c = contract
    return [
        (c.REC_JOB_STEPS_RATE, f"max by ({J}) ({c.REC_RANK_STEPS_RATE})"),
        (c.REC_JOB_RANKS_REPORTING, f"count by ({J}) ({c.REC_RANK_COMPUTE_MEAN})"),
        (c.REC_JOB_COMPUTE_MEDIAN, f"quantile by ({J}) (0.5, {c.REC_RANK_COMPUTE_MEAN})"),
        (
            c.REC_RANK_COMPUTE_RATIO,
            f"{c.REC_RANK_COMPUTE_MEAN}\n/ on ({J}) group_left ()\n{c.REC_JOB_COMPUTE_MEDIAN}",
        ),
        (c.REC_JOB_GRAD_SYNC_P50, _job_quantile(0.5, c.REC_JOB_GRAD_SYNC_BUCKET_RATE)),
        (c.REC_JOB_GRAD_SYNC_P99, _job_quantile(0.99, c.REC_JOB_GRAD_SYNC_BUCKET_RATE)),
        # The hour's p99 from the job's recorded 5-minute bucket rates averaged over the hour
        # (a handful of series per job), not from an hour of every rank's buckets.
        (
            c.REC_JOB_STEP_DURATION_P99_1H,
            _job_quantile(0.99, f"avg_over_time({c.REC_JOB_STEP_DURATION_BUCKET_RATE}[{_HOUR}])"),
        ),
        # A hang's threshold scales with the job's own step time; jobs without step history
        # (or with NaN quantiles) fall back to the floor.
        (
            c.REC_JOB_STALL_THRESHOLD,
            f"clamp_min(\n  {num(t.collective_stall_step_multiplier)} * "
            f"{c.REC_JOB_STEP_DURATION_P99_1H} > 0,\n"
            f"  {num(t.collective_stall_floor_seconds)}\n)\n"
            f"or on ({J})\n(0 * {c.REC_JOB_OLDEST_INFLIGHT} + "
            f"{num(t.collective_stall_floor_seconds)})",
        ),
    ]


def _job_phases() -> list[Rule]:
    """What the recorded phase and compute means make of each other: each rank's compute split
    by phase and its share of the step spent waiting for data."""
    c = contract
    phase_mean = c.REC_RANK_PHASE_MEAN
    data = f'{phase_mean}{{{PHASE}="{c.Phase.DATA.value}"}}'
    forward = f'{phase_mean}{{{PHASE}="{c.Phase.FORWARD.value}"}}'
    return [
        # Compute time split by phase: data and forward as measured; backward compute is what
        # is left of the compute time, since the backward phase also holds the wait on peers.
        # Equality matchers on the recorded means (no regex over the ranks' series).
        (
            c.REC_RANK_PHASE_COMPUTE_MEAN,
            f"{data}\nor\n{forward}\nor\nlabel_replace(\n  clamp_min(\n"
            f"    {c.REC_RANK_COMPUTE_MEAN}\n    - on ({RANK})\n"
            f"    sum by ({RANK}) ({data} or {forward}),\n"
            f'    0\n  ),\n  "{PHASE}", "{c.Phase.BACKWARD.value}", "", ""\n)',
        ),
        (
            c.REC_RANK_DATA_WAIT_RATIO,
            f"{data}\n/ on ({RANK})\n{c.REC_RANK_STEP_DURATION_MEAN}",
        ),
    ]


def _job_phase_medians() -> list[Rule]:
    """Each phase of each rank against its job's median, and the phase in which each rank
    exceeds it most (the straggler alert's label, read for a few ranks, not 4 x every rank)."""
    c = contract
    return [
        (
            c.REC_JOB_PHASE_COMPUTE_MEDIAN,
            f"quantile by ({J}, {PHASE}) (0.5, {c.REC_RANK_PHASE_COMPUTE_MEAN})",
        ),
        (
            c.REC_RANK_PHASE_COMPUTE_EXCESS,
            f"{c.REC_RANK_PHASE_COMPUTE_MEAN}\n- on ({J}, {PHASE}) group_left ()\n"
            f"{c.REC_JOB_PHASE_COMPUTE_MEDIAN}",
        ),
        (
            c.REC_RANK_SLOWEST_PHASE,
            f"topk by ({J}, {R}) (1, {c.REC_RANK_PHASE_COMPUTE_EXCESS})",
        ),
    ]


_HOUR = "1h"


def _job_quantile(q: float, bucket_rates: str) -> str:
    return f"histogram_quantile({q}, sum by ({J}, le) ({bucket_rates}))"


def recording_groups(t: Thresholds) -> list[tuple[str, list[dict[str, str]]]]:
    """The recording rules as (group name suffix, rules in evaluation order), in the order the
    groups are laid out.

    The ``ranks*`` groups read the ranks' raw series, each a different part of a rank's
    exposition once, so no group's evaluation grows with more than its share of a job's
    series; the ``jobs*`` groups read recorded series only. Prometheus runs groups
    concurrently, each at its own offset in the interval, and a group reads another's recorded
    series as of that group's last evaluation (``jobs-phases`` reads the step and phase means).
    """
    w = t.rate_window
    groups = {
        "ranks": _rank_step_times(w),
        "ranks-phases": _rank_phases(w),
        "ranks-step-buckets": _job_step_buckets(w),
        "ranks-sync": _rank_sync(w),
        "ranks-health": [*_schedulers(t), *_rank_memory(), *_rank_hangs()],
        "ranks-alert-inputs": _rank_alert_inputs(t),
        "jobs": _jobs(t),
        "jobs-phases": _job_phases(),
        "jobs-phase-medians": _job_phase_medians(),
    }
    return [(suffix, _as_records(rules)) for suffix, rules in groups.items()]


def recording_rules(t: Thresholds) -> list[dict[str, str]]:
    """Every recording rule the alerts and dashboards read, group after group, each group's in
    evaluation order (later rules read earlier ones)."""
    return [rule for _, group in recording_groups(t) for rule in group]


def _as_records(rules: list[Rule]) -> list[dict[str, str]]:
    return [{"record": name, "expr": expr} for name, expr in rules]


def _reliability(w: str) -> list[Rule]:
    """Success rate and MTTR of the incidents the remediation service closed within ``w``, per
    failure and over all of them.

    Success rate: incidents recovered / incidents closed. A failure whose incidents all failed
    has no ``recovered`` series to increase, so it counts as 0 recovered rather than vanishing;
    a window without incidents has no ratio (no series) rather than 0/0. MTTR: the mean time to
    recover of the incidents that recovered, from the histogram's sum and count.
    """
    c = contract
    closed = c.REMEDIATION_INCIDENTS.name
    recovered = f'{closed}{{{c.LABEL_OUTCOME}="{c.IncidentOutcome.RECOVERED.value}"}}'
    recover = c.REMEDIATION_TIME_TO_RECOVER

    def success(by: str) -> str:
        total = f"sum{by} (increase({closed}[{w}]))"
        return (
            f"(\n  sum{by} (increase({recovered}[{w}]))\n  or\n  0 * {total}\n)\n/\n({total} > 0)"
        )

    def mttr(by: str) -> str:
        return (
            f"sum{by} (increase({recover.sum_name}[{w}]))\n"
            f"/\n(sum{by} (increase({recover.count_name}[{w}])) > 0)"
        )

    per_failure = f" by ({c.LABEL_FAILURE})"
    return [
        (c.REC_FAILURE_SUCCESS_RATIO[w], success(per_failure)),
        (c.REC_SUCCESS_RATIO[w], success("")),
        (c.REC_FAILURE_MTTR[w], mttr(per_failure)),
        (c.REC_MTTR[w], mttr("")),
    ]


def reliability_group(prefix: str, t: Thresholds) -> dict[str, Any]:
    """The group of the reliability rules, every window of ``contract.RELIABILITY_WINDOWS``,
    named ``<prefix>-reliability`` and evaluated every ``t.reliability_interval`` (a group of
    its own: no alert reads them, and a week of the service's few dozen incident series is
    cheap at that pace; under Prometheus' 5m lookback a stat panel's instant query always
    finds the last value)."""
    rules = [rule for window in contract.RELIABILITY_WINDOWS for rule in _reliability(window)]
    return {
        "name": f"{prefix}-reliability",
        "interval": t.reliability_interval,
        "rules": _as_records(rules),
    }
