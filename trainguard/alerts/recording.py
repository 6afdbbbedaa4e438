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
from trainguard.alerts.promql import PHASE, RANK, SCHEDULER, J, N, job_quantile, mean
from trainguard.alerts.rule import RECORDING_RULES, RecordingGroup
from trainguard.contract import FAILURES, Catalogue
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


def _jobs() -> list[Rule]:
    """Per-job aggregations of the recorded per-rank series every failure and dashboard reads."""
    c = contract
    return [
        (c.REC_JOB_STEPS_RATE, f"max by ({J}) ({c.REC_RANK_STEPS_RATE})"),
        (c.REC_JOB_GRAD_SYNC_P50, job_quantile(0.5, c.REC_JOB_GRAD_SYNC_BUCKET_RATE)),
        (c.REC_JOB_GRAD_SYNC_P99, job_quantile(0.99, c.REC_JOB_GRAD_SYNC_BUCKET_RATE)),
    ]


def _shared(t: Thresholds) -> dict[RecordingGroup, list[Rule]]:
    w = t.rate_window
    return {
        RecordingGroup.RANKS: _rank_step_times(w),
        RecordingGroup.RANKS_PHASES: _rank_phases(w),
        RecordingGroup.RANKS_STEP_BUCKETS: _job_step_buckets(w),
        RecordingGroup.RANKS_SYNC: _rank_sync(w),
        RecordingGroup.RANKS_HEALTH: _schedulers(t),
        RecordingGroup.JOBS: _jobs(),
    }


def recording_groups(
    t: Thresholds, catalogue: Catalogue = FAILURES
) -> list[tuple[str, list[dict[str, str]]]]:
    """The recording rules as (group name suffix, rules in evaluation order), in the order the
    groups are laid out: each group's shared rules, then each failure's (``RECORDING_RULES``)
    in catalogue order.

    The ``ranks*`` groups read the ranks' raw series, each a different part of a rank's
    exposition once, so no group's evaluation grows with more than its share of a job's
    series; the ``jobs*`` groups read recorded series only. Prometheus runs groups
    concurrently, each at its own offset in the interval, and a group reads another's recorded
    series as of that group's last evaluation (``jobs-phases`` reads the step and phase means).
    """
    groups = {group: list(rules) for group, rules in _shared(t).items()}
    for _, recording in catalogue.implementations(RECORDING_RULES):
        for rule in recording(t):
            groups.setdefault(rule.group, []).append((rule.record, rule.expr))
    return [(group.value, _as_records(groups.get(group, []))) for group in RecordingGroup]


def recording_rules(t: Thresholds, catalogue: Catalogue = FAILURES) -> list[dict[str, str]]:
    """Every recording rule the alerts and dashboards read, group after group, each group's in
    evaluation order (later rules read earlier ones)."""
    return [rule for _, group in recording_groups(t, catalogue) for rule in group]


def _as_records(rules: list[Rule]) -> list[dict[str, str]]:
    return [{"record": name, "expr": expr} for name, expr in rules]


def _reliability(w: str) -> list[Rule]:
    """Success rate and MTTR of the incidents the remediation service closed within ``w``, per
    failure and over all of them.

    Success rate: incidents recovered / incidents judged, where judged leaves out those closed
    because their job ended normally before the repair could be judged (``job_ended``). A
    failure whose incidents all failed has no ``recovered`` series to increase, so it counts as
    0 recovered rather than vanishing; a window without judged incidents has no ratio (no
    series) rather than 0/0. MTTR: the mean time to recover of the incidents that recovered,
    from the histogram's sum and count.
    """
    c = contract
    name = c.REMEDIATION_INCIDENTS.name
    closed = f'{name}{{{c.LABEL_OUTCOME}!="{c.IncidentOutcome.JOB_ENDED.value}"}}'
    recovered = f'{name}{{{c.LABEL_OUTCOME}="{c.IncidentOutcome.RECOVERED.value}"}}'
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
