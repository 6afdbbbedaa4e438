"""The recording rules: per-rank and per-job series every alert, dashboard and diagnosis reads.

Two groups, so that each stays bounded as a job grows (docs/alerts.md#how-the-rules-scale):
``rank_rules`` read the ranks' raw series, once each, and keep per-rank means and per-job
aggregates (bucket rates, the oldest collective, the last step); ``job_rules`` read recorded
series only (per-job medians and quantiles, each rank's ratio to its job's median joined on the
job). Within a group rules run in order (later rules read earlier ones); the alert group reads
both, at most one evaluation interval behind. The reliability rules (the remediation service's
success rate and MTTR over an hour to a week) feed dashboards only, so they run in a group of
their own, once a minute.
"""

from __future__ import annotations

from typing import Any

from trainguard import contract
from trainguard.alerts.promql import PHASE, RANK, SCHEDULER, J, N, mean, num, quantile
from trainguard.thresholds import Thresholds


def one_scheduler_per(level: str, labels: str, window: str, *preferred: str) -> str:
    """Per ``level`` value, the ``labels`` its ranks report in ``rank_info``, or no series.

    Tiers, the first that has an answer wins: ranks reporting now that name a scheduler and
    one of the ``preferred`` labels (the handle an executor needs); ranks reporting now that
    name a scheduler; ranks that named one within ``window`` (an alert that outlives its
    ranks keeps its labels). Within a tier, ranks that disagree give no answer at all: the
    alert goes without the labels (to the service's default scheduler) rather than to a
    scheduler picked at random.
    """
    info = contract.RANK_INFO.name
    named = f'{contract.LABEL_SCHEDULER}!=""'
    fresh_with_handle = " or ".join(f'{info}{{{named},{label}!=""}}' for label in preferred)
    tiers = [
        *([fresh_with_handle] if preferred else []),
        f"{info}{{{named}}}",
        f"last_over_time({info}{{{named}}}[{window}])",
    ]

    def unambiguous(selector: str) -> str:
        answers = f"max by ({level}, {labels}) ({selector})"
        return f"(\n  {answers}\n  and on ({level}) (count by ({level}) ({answers}) == 1)\n)"

    return f"\nor on ({level})\n".join(unambiguous(tier) for tier in tiers)


Rule = tuple[str, str]  # (record, expr)


def _schedulers(t: Thresholds) -> list[Rule]:
    """Where each job and node runs: the labels alerts copy for remediation's routing."""
    c = contract
    return [
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
    """Step, compute, sync-wait and phase times per rank, from the ranks' raw series."""
    c = contract
    phase_mean = c.REC_RANK_PHASE_MEAN
    data = f'{phase_mean}{{{PHASE}="{c.Phase.DATA.value}"}}'
    forward = f'{phase_mean}{{{PHASE}="{c.Phase.FORWARD.value}"}}'
    fwd_data = f"{data}\nor\n{forward}"
    return [
        (c.REC_RANK_STEPS_RATE, f"sum by ({RANK}) (rate({c.STEPS.name}[{w}]))"),
        (c.REC_RANK_STEP_DURATION_MEAN, mean(c.STEP_DURATION.name, RANK, w)),
        (c.REC_RANK_COMPUTE_MEAN, mean(c.STEP_COMPUTE_DURATION.name, RANK, w)),
        (c.REC_RANK_SYNC_WAIT_MEAN, mean(c.SYNC_WAIT_DURATION.name, RANK, w)),
        (c.REC_RANK_PHASE_MEAN, mean(c.STEP_PHASE_DURATION.name, f"{RANK}, {PHASE}", w)),
        # Compute time split by phase: data and forward as measured; backward compute is what
        # is left of the compute time, since the backward phase also holds the wait on peers.
        # Equality matchers on the recorded means (no regex over the ranks' series).
        (
            c.REC_RANK_PHASE_COMPUTE_MEAN,
            f"{fwd_data}\nor\nlabel_replace(\n  clamp_min(\n    {c.REC_RANK_COMPUTE_MEAN}\n"
            f"    - on ({RANK})\n    sum by ({RANK}) ({data} or {forward}),\n"
            f'    0\n  ),\n  "{PHASE}", "{c.Phase.BACKWARD.value}", "", ""\n)',
        ),
        (
            c.REC_RANK_DATA_WAIT_RATIO,
            f"{data}\n/ on ({RANK})\n{c.REC_RANK_STEP_DURATION_MEAN}",
        ),
    ]


def _rank_latencies_and_memory(w: str) -> list[Rule]:
    """The one pass over the ranks' histogram buckets (per job, or per rank for the dashboards'
    per-rank gradient sync), and memory headroom."""
    c = contract
    return [
        (
            c.REC_JOB_STEP_DURATION_BUCKET_RATE,
            f"sum by ({J}, le) (rate({c.STEP_DURATION.bucket_name}[{w}]))",
        ),
        (
            c.REC_JOB_GRAD_SYNC_BUCKET_RATE,
            f"sum by ({J}, le) (rate({c.GRAD_SYNC_DURATION.bucket_name}[{w}]))",
        ),
        (c.REC_RANK_GRAD_SYNC_P99, quantile(0.99, c.GRAD_SYNC_DURATION.name, RANK, w)),
        (
            c.REC_RANK_MEMORY_HEADROOM,
            f"1 - sum by ({RANK}) ({c.MEMORY_RESERVED.name})\n"
            f"/ sum by ({RANK}) ({c.MEMORY_CAPACITY.name} > 0)",
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
        (
            c.REC_JOB_PHASE_COMPUTE_MEDIAN,
            f"quantile by ({J}, {PHASE}) (0.5, {c.REC_RANK_PHASE_COMPUTE_MEAN})",
        ),
        (
            c.REC_RANK_PHASE_COMPUTE_EXCESS,
            f"{c.REC_RANK_PHASE_COMPUTE_MEAN}\n- on ({J}, {PHASE}) group_left ()\n"
            f"{c.REC_JOB_PHASE_COMPUTE_MEDIAN}",
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


_HOUR = "1h"


def _job_quantile(q: float, bucket_rates: str) -> str:
    return f"histogram_quantile({q}, sum by ({J}, le) ({bucket_rates}))"


def rank_rules(t: Thresholds) -> list[dict[str, str]]:
    """The recording rules that read the ranks' raw series (their cost grows with the ranks),
    in evaluation order."""
    w = t.rate_window
    rules = [
        *_schedulers(t),
        *_rank_step_times(w),
        *_rank_latencies_and_memory(w),
        *_rank_hangs(),
    ]
    return _as_records(rules)


def job_rules(t: Thresholds) -> list[dict[str, str]]:
    """The recording rules that read recorded series only, in evaluation order."""
    return _as_records(_jobs(t))


def recording_rules(t: Thresholds) -> list[dict[str, str]]:
    """Every recording rule the alerts read, in evaluation order (later rules read earlier
    ones): the per-rank group's, then the per-job group's."""
    return [*rank_rules(t), *job_rules(t)]


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
