"""Renders trainguard's Prometheus recording and alert rules from ``thresholds.yml`` beside it.

The thresholds file is the one place a threshold lives; ``trainguard.rules.yml`` beside it is
this module's output, committed so Prometheus can load it without Python, and kept in step by
``trainguard rules --check`` (run by the test suite). Every metric name comes from
``trainguard.contract``.
"""

from __future__ import annotations

from typing import Any

import yaml

from trainguard import contract
from trainguard.contract import Alert, Severity
from trainguard.thresholds import Thresholds

# One group: rules of a group run in order, so every alert reads the recording rules of the
# same evaluation (separate groups run independently and would see them one interval late).
GROUP = "trainguard"

# Labels kept by per-rank aggregations: the rank's identity, without Prometheus' job/instance.
RANK = ", ".join(contract.RANK_IDENTITY_LABELS)
J = contract.LABEL_JOB_ID
R = contract.LABEL_RANK
N = contract.LABEL_NODE
G = contract.LABEL_GPU
PHASE = contract.LABEL_PHASE
SCHEDULER = ", ".join(contract.SCHEDULER_LABELS)


def _up(scrape_job: str) -> str:
    return f'up{{job="{scrape_job}"}}'


RANK_UP = _up(contract.SCRAPE_JOB_RANKS)
EXPORTER_UP = _up(contract.SCRAPE_JOB_EXPORTER)


def _num(value: float) -> str:
    """A threshold as PromQL and annotation text: 1.2, 60, 0.05 (never 60.0)."""
    return f"{value:g}"


def _mean(metric: str, by: str, window: str) -> str:
    return (
        f"sum by ({by}) (rate({metric}_sum[{window}]))\n"
        f"/\nsum by ({by}) (rate({metric}_count[{window}]))"
    )


def _quantile(q: float, metric: str, by: str, window: str) -> str:
    return f"histogram_quantile({q}, sum by ({by}, le) (rate({metric}_bucket[{window}])))"


def _with_labels(condition: str, on: str, labels: str, source: str) -> str:
    """``condition`` with ``labels`` copied from the one ``source`` series of its group.

    Falls back to the bare condition where ``source`` has no series, so a missing helper
    series never silences an alert.
    """
    return (
        f"(\n{condition}\n)\n* on ({on}) group_left ({labels})\n(0 * {source} + 1)\n"
        f"or on ({on})\n(\n{condition}\n)"
    )


def _one_scheduler_per(level: str, labels: str, window: str, *preferred: str) -> str:
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


def _on_scheduler_of_job(condition: str) -> str:
    """A job's alert, labelled with where the job runs (the remediation service's routing)."""
    return _with_labels(condition, J, SCHEDULER, contract.REC_JOB_SCHEDULER)


def _on_scheduler_of_node(condition: str) -> str:
    """A node's alert, labelled with the scheduler of the training ranks it runs, if any."""
    return _with_labels(condition, N, contract.LABEL_SCHEDULER, contract.REC_NODE_SCHEDULER)


def recording_rules(t: Thresholds) -> list[dict[str, str]]:
    """The recording rules, in evaluation order (later rules read earlier ones)."""
    w = t.rate_window
    c = contract
    fwd_data = f'{c.REC_RANK_PHASE_MEAN}{{{PHASE}=~"{c.Phase.DATA.value}|{c.Phase.FORWARD.value}"}}'
    rules = [
        (
            c.REC_JOB_SCHEDULER,
            _one_scheduler_per(
                J,
                SCHEDULER,
                t.scheduler_labels_window,
                c.LABEL_NAMESPACE,
                c.LABEL_SLURM_JOB_ID,
            ),
        ),
        (
            c.REC_NODE_SCHEDULER,
            _one_scheduler_per(N, c.LABEL_SCHEDULER, t.scheduler_labels_window),
        ),
        (c.REC_RANK_STEPS_RATE, f"sum by ({RANK}) (rate({c.STEPS.name}[{w}]))"),
        (c.REC_JOB_STEPS_RATE, f"max by ({J}) ({c.REC_RANK_STEPS_RATE})"),
        (c.REC_RANK_STEP_DURATION_MEAN, _mean(c.STEP_DURATION.name, RANK, w)),
        (c.REC_RANK_COMPUTE_MEAN, _mean(c.STEP_COMPUTE_DURATION.name, RANK, w)),
        (c.REC_RANK_SYNC_WAIT_MEAN, _mean(c.SYNC_WAIT_DURATION.name, RANK, w)),
        (c.REC_RANK_PHASE_MEAN, _mean(c.STEP_PHASE_DURATION.name, f"{RANK}, {PHASE}", w)),
        # Compute time split by phase: data and forward as measured; backward compute is what
        # is left of the compute time, since the backward phase also holds the wait on peers.
        (
            c.REC_RANK_PHASE_COMPUTE_MEAN,
            f"{fwd_data}\nor\nlabel_replace(\n  clamp_min(\n    {c.REC_RANK_COMPUTE_MEAN}\n"
            f"    - on ({RANK})\n    sum by ({RANK}) ({fwd_data}),\n"
            f'    0\n  ),\n  "{PHASE}", "{c.Phase.BACKWARD.value}", "", ""\n)',
        ),
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
        (
            c.REC_RANK_DATA_WAIT_RATIO,
            f'{c.REC_RANK_PHASE_MEAN}{{{PHASE}="{c.Phase.DATA.value}"}}\n'
            f"/ on ({RANK})\n{c.REC_RANK_STEP_DURATION_MEAN}",
        ),
        (c.REC_JOB_GRAD_SYNC_P50, _quantile(0.5, c.GRAD_SYNC_DURATION.name, J, w)),
        (c.REC_JOB_GRAD_SYNC_P99, _quantile(0.99, c.GRAD_SYNC_DURATION.name, J, w)),
        (c.REC_RANK_GRAD_SYNC_P99, _quantile(0.99, c.GRAD_SYNC_DURATION.name, RANK, w)),
        (c.REC_JOB_STEP_DURATION_P99_1H, _quantile(0.99, c.STEP_DURATION.name, J, "1h")),
        (
            c.REC_RANK_MEMORY_HEADROOM,
            f"1 - sum by ({RANK}) ({c.MEMORY_RESERVED.name})\n"
            f"/ sum by ({RANK}) ({c.MEMORY_CAPACITY.name} > 0)",
        ),
        (
            c.REC_JOB_OLDEST_INFLIGHT,
            f"max by ({J}) ({c.COLLECTIVE_OLDEST_INFLIGHT.name})",
        ),
        # A hang's threshold scales with the job's own step time; jobs without step history
        # (or with NaN quantiles) fall back to the floor.
        (
            c.REC_JOB_STALL_THRESHOLD,
            f"clamp_min(\n  {_num(t.collective_stall_step_multiplier)} * "
            f"{c.REC_JOB_STEP_DURATION_P99_1H} > 0,\n"
            f"  {_num(t.collective_stall_floor_seconds)}\n)\n"
            f"or on ({J})\n(0 * {c.REC_JOB_OLDEST_INFLIGHT} + "
            f"{_num(t.collective_stall_floor_seconds)})",
        ),
        # The rank a hang waits for: fewest collectives launched, and among equals the one with
        # no collective in flight (+0.5 for having one keeps launched counts dominant).
        (
            c.REC_JOB_COLLECTIVE_LAGGARD,
            f"bottomk by ({J}) (\n  1,\n  sum by ({RANK}) ({c.COLLECTIVES_LAUNCHED.name})\n"
            f"  + on ({RANK})\n  0.5 * clamp_max(sum by ({RANK}) "
            f"({c.COLLECTIVE_INFLIGHT.name}), 1)\n)",
        ),
    ]
    return [{"record": name, "expr": expr} for name, expr in rules]


def _warmed_up(t: Thresholds) -> str:
    return f"sum by ({J}, {R}) ({contract.STEPS.name}) >= {t.warmup_steps}"


def _anchor(alert: Alert) -> str:
    return alert.value.lower()


def _alert(
    t: Thresholds,
    alert: Alert,
    severity: Severity,
    expr: str,
    for_: str,
    summary: str,
    description: str,
) -> dict[str, Any]:
    rule: dict[str, Any] = {"alert": alert.value, "expr": expr}
    if for_ != "0s":
        rule["for"] = for_
    rule["labels"] = {contract.LABEL_SEVERITY: severity.value}
    rule["annotations"] = {
        contract.ANNOTATION_SUMMARY: summary,
        contract.ANNOTATION_DESCRIPTION: description,
        contract.ANNOTATION_RUNBOOK_URL: f"{t.runbook_base_url}#{_anchor(alert)}",
    }
    return rule


# Template fragments: who an alert is about.
WHO = "rank {{ $labels.rank }} of job {{ $labels.job_id }} on node {{ $labels.node }}"
WHO_START = WHO[0].upper() + WHO[1:]


def _ranks_on_node() -> str:
    """Annotation text listing the training ranks (job, rank) that run on ``$labels.node``."""
    selector = f'{RANK_UP.removesuffix("}")},{N}="%s"}}'
    return (
        "Training ranks on this node: {{ range query (printf `"
        + selector
        + "` $labels.node) | sortByLabel `rank` }}"
        "job {{ .Labels.job_id }} rank {{ .Labels.rank }}; {{ else }}none known; {{ end }}"
    )


def _ranks_on_gpu() -> str:
    """Annotation text naming the ranks on ``$labels.gpu`` (the exporter's process map), or
    else every rank of the node."""
    selector = f'{contract.GPU_PROCESS_INFO.client_name}_info{{{N}="%s",{G}="%s"}}'
    return (
        "{{ with query (printf `"
        + selector
        + "` $labels.node $labels.gpu) }}Training ranks on this GPU: "
        "{{ range sortByLabel `rank` . }}job {{ .Labels.job_id }} rank {{ .Labels.rank }}; "
        "{{ end }}{{ else }}" + _ranks_on_node() + "{{ end }}"
    )


def alert_rules(t: Thresholds) -> list[dict[str, Any]]:
    """One or more rules per alert of the contract (a second rule splits severities)."""
    c = contract
    rank_by = RANK
    oom = f"sum by ({rank_by}) (increase({c.OOM_EVENTS.name}[{t.oom_window}]))"
    recovered = f"sum by ({rank_by}) (increase({c.OOM_RECOVERIES.name}[{t.oom_window}]))"
    # Counted OOMs not followed by a recovery; a hook without the recovery counter counts 0.
    unrecovered = f"{oom}\n- on ({rank_by})\n({recovered} or 0 * {oom})"
    xid_critical = "|".join(str(x) for x in t.xid_critical)
    xid = f"sum by ({N}, {G}, {contract.LABEL_XID}) (increase({c.GPU_XID_ERRORS.name}"
    straggler = (
        f"{c.REC_RANK_COMPUTE_RATIO} >= {_num(t.straggler_factor)}\n"
        f"and on ({J}) ({c.REC_JOB_RANKS_REPORTING} >= {t.straggler_min_ranks})\n"
        f"and on ({J}, {R}) ({_warmed_up(t)})"
    )
    slowest_phase = f"topk by ({J}, {R}) (1, {c.REC_RANK_PHASE_COMPUTE_EXCESS})"
    stalled_collective = f"{c.REC_JOB_OLDEST_INFLIGHT}\n> on ({J})\n{c.REC_JOB_STALL_THRESHOLD}"
    last_step = f"(max by ({rank_by}) ({c.LAST_STEP_TIMESTAMP.name}) > 0)"
    stalled = f"min by ({J}) (time() - {last_step}) > {_num(t.stalled_seconds)}"
    stalest = f"topk by ({J}) (1, time() - {last_step})"
    rank_down = (
        f"(\n  (max by ({rank_by}) ({RANK_UP}) == 0)\n"
        f"  unless on ({J}, {R}) ({RANK_UP} == 1)\n"
        f"or\n  group by ({rank_by}) (max_over_time({RANK_UP}[{t.rank_absent_window}]))\n"
        f"  unless on ({J}, {R}) {RANK_UP}\n)\n"
        f"and on ({J}) (max by ({J}) ({RANK_UP}) == 1)"
    )
    return [
        _alert(
            t,
            Alert.TRAINING_OOM,
            Severity.CRITICAL,
            _on_scheduler_of_job(f"{unrecovered}\n> 0.5"),
            "0s",
            "CUDA out of memory on rank {{ $labels.rank }} of job {{ $labels.job_id }}",
            "{{ $value | printf `%.0f` }} out-of-memory error(s) in the last "
            f"{t.oom_window} on {WHO} were not recovered by the OOM guard; the step failed.",
        ),
        _alert(
            t,
            Alert.TRAINING_OOM,
            Severity.WARNING,
            _on_scheduler_of_job(f"{oom} > 0.5\nunless on ({rank_by})\n({unrecovered} > 0.5)"),
            "0s",
            "Recovered out-of-memory errors on rank {{ $labels.rank }} of job {{ $labels.job_id }}",
            "{{ $value | printf `%.0f` }} out-of-memory error(s) in the last "
            f"{t.oom_window} on {WHO}; the OOM guard recovered by splitting the batch, "
            "at a cost in throughput.",
        ),
        _alert(
            t,
            Alert.TRAINING_OOM_RISK,
            Severity.WARNING,
            _on_scheduler_of_job(
                f"{c.REC_RANK_MEMORY_HEADROOM} < {_num(t.oom_risk_headroom_ratio)}\nor\n"
                f"(\n  {c.REC_RANK_MEMORY_HEADROOM} < {_num(t.oom_risk_predict_headroom_ratio)}\n"
                f"  and on ({rank_by})\n  (\n    sum by ({rank_by}) (predict_linear("
                f"{c.MEMORY_ALLOCATED.name}[{t.oom_risk_predict_window}], "
                f"{_num(t.oom_risk_predict_horizon_seconds)}))\n"
                f"    >= on ({rank_by})\n    sum by ({rank_by}) ({c.MEMORY_CAPACITY.name})\n  )\n)"
            ),
            t.oom_risk_for,
            "Memory about to run out on rank {{ $labels.rank }} of job {{ $labels.job_id }}",
            "Only {{ $value | humanizePercentage }} of device memory is free on "
            f"{WHO} (below {_num(t.oom_risk_headroom_ratio * 100)}%, or below "
            f"{_num(t.oom_risk_predict_headroom_ratio * 100)}% with allocations growing "
            f"to the limit within {_num(t.oom_risk_predict_horizon_seconds)}s).",
        ),
        _alert(
            t,
            Alert.TRAINING_STRAGGLER,
            Severity.WARNING,
            _on_scheduler_of_job(_with_labels(straggler, f"{J}, {R}", PHASE, slowest_phase)),
            t.straggler_for,
            "Straggler: rank {{ $labels.rank }} of job {{ $labels.job_id }} on node "
            "{{ $labels.node }}",
            f"{WHO_START} needs "
            "{{ $value | printf `%.2f` }}x the job's median step compute time "
            f"(threshold {_num(t.straggler_factor)}x) for {t.straggler_for}; every other "
            "rank waits for it at each gradient sync. Slowest phase: "
            "{{ or $labels.phase `unknown` }}.",
        ),
        _alert(
            t,
            Alert.TRAINING_COLLECTIVE_STALLED,
            Severity.CRITICAL,
            _on_scheduler_of_job(
                _with_labels(
                    stalled_collective,
                    J,
                    f"{R}, {contract.LABEL_LOCAL_RANK}, {N}",
                    c.REC_JOB_COLLECTIVE_LAGGARD,
                )
            ),
            t.collective_stall_for,
            "Collective stalled in job {{ $labels.job_id }}"
            "{{ with $labels.rank }}; suspect rank {{ . }}{{ end }}",
            "The oldest in-flight collective of job {{ $labels.job_id }} has waited "
            "{{ $value | humanizeDuration }}, past its threshold of {{ with query (printf `"
            + c.REC_JOB_STALL_THRESHOLD
            + '{job_id="%s"}` $labels.job_id) }}{{ . | first | value | humanizeDuration }}'
            "{{ end }}. Suspect: rank {{ or $labels.rank `unknown` }} on node "
            "{{ or $labels.node `unknown` }}, which launched the fewest collectives or has "
            "none in flight. Read its Flight Recorder dump before NCCL's timeout kills the job.",
        ),
        _alert(
            t,
            Alert.TRAINING_NCCL_TIMEOUT,
            Severity.CRITICAL,
            _on_scheduler_of_job(
                f"sum by ({rank_by}) (increase({c.COLLECTIVE_TIMEOUTS.name}"
                f"[{t.nccl_timeout_window}])) > 0"
            ),
            "0s",
            "NCCL collective timeout on rank {{ $labels.rank }} of job {{ $labels.job_id }}",
            f"A collective on {WHO} ran past its process group's timeout in the last "
            f"{t.nccl_timeout_window}; the NCCL watchdog aborts the job.",
        ),
        _alert(
            t,
            Alert.TRAINING_STALLED,
            Severity.CRITICAL,
            _on_scheduler_of_job(
                _with_labels(stalled, J, f"{R}, {contract.LABEL_LOCAL_RANK}, {N}", stalest)
            ),
            t.stalled_for,
            "Training job {{ $labels.job_id }} makes no progress",
            "No rank of job {{ $labels.job_id }} has completed a step for "
            "{{ $value | humanizeDuration }}; the rank whose last step is oldest is rank "
            "{{ or $labels.rank `unknown` }} on node {{ or $labels.node `unknown` }}.",
        ),
        _alert(
            t,
            Alert.TRAINING_RANK_DOWN,
            Severity.CRITICAL,
            _on_scheduler_of_job(rank_down),
            t.rank_down_for,
            "Rank {{ $labels.rank }} of job {{ $labels.job_id }} is down",
            f"The metrics endpoint of {WHO} is down or gone while other ranks of the job "
            "still run; the survivors will block at their next collective.",
        ),
        _alert(
            t,
            Alert.TRAINING_DATALOADER_BOUND,
            Severity.WARNING,
            _on_scheduler_of_job(
                f"{c.REC_RANK_DATA_WAIT_RATIO} > {_num(t.dataloader_wait_ratio)}\n"
                f"and on ({J}, {R}) ({_warmed_up(t)})"
            ),
            t.dataloader_for,
            "Data loading bounds rank {{ $labels.rank }} of job {{ $labels.job_id }}",
            f"{WHO_START} spends "
            "{{ $value | humanizePercentage }} of each step waiting for data "
            f"(threshold {_num(t.dataloader_wait_ratio * 100)}%).",
        ),
        _alert(
            t,
            Alert.TRAINING_MEMORY_FRAGMENTATION,
            Severity.WARNING,
            _on_scheduler_of_job(
                f"max by ({rank_by}) ({c.MEMORY_FRAGMENTATION.name}) > "
                f"{_num(t.fragmentation_ratio)}\nand on ({rank_by})\n"
                f"(sum by ({rank_by}) (increase({c.MEMORY_ALLOC_RETRIES.name}"
                f"[{t.fragmentation_retry_window}])) > 0)"
            ),
            t.fragmentation_for,
            "Fragmented GPU memory on rank {{ $labels.rank }} of job {{ $labels.job_id }}",
            "{{ $value | humanizePercentage }} of the memory reserved on "
            f"{WHO} holds no tensor, and the allocator had to free its cache and retry in the "
            f"last {t.fragmentation_retry_window}.",
        ),
        _alert(
            t,
            Alert.GPU_XID_ERROR,
            Severity.CRITICAL,
            _on_scheduler_of_node(
                f'{xid}{{{contract.LABEL_XID}=~"{xid_critical}"}}[{t.xid_window}])) > 0'
            ),
            "0s",
            "Critical Xid {{ $labels.xid }} on GPU {{ $labels.gpu }} of node {{ $labels.node }}",
            "GPU {{ $labels.gpu }} on node {{ $labels.node }} reported Xid {{ $labels.xid }} "
            f"in the last {t.xid_window} (hardware, driver or interconnect fault). "
            + _ranks_on_gpu(),
        ),
        _alert(
            t,
            Alert.GPU_XID_ERROR,
            Severity.WARNING,
            _on_scheduler_of_node(
                f'{xid}{{{contract.LABEL_XID}!~"{xid_critical}"}}[{t.xid_window}])) > 0'
            ),
            "0s",
            "Xid {{ $labels.xid }} on GPU {{ $labels.gpu }} of node {{ $labels.node }}",
            "GPU {{ $labels.gpu }} on node {{ $labels.node }} reported Xid {{ $labels.xid }} "
            f"in the last {t.xid_window} (often an application fault). " + _ranks_on_gpu(),
        ),
        _alert(
            t,
            Alert.GPU_THERMAL_THROTTLING,
            Severity.WARNING,
            _on_scheduler_of_node(
                f"max by ({N}, {G}) ({c.GPU_CLOCK_THROTTLED.name}"
                f'{{{contract.LABEL_REASON}=~"{t.thermal_throttle_reasons}"}}) == 1'
            ),
            t.thermal_for,
            "GPU {{ $labels.gpu }} of node {{ $labels.node }} is throttling",
            "GPU {{ $labels.gpu }} on node {{ $labels.node }} has held its clocks down for "
            f"heat or power for {t.thermal_for}; its ranks become stragglers. " + _ranks_on_gpu(),
        ),
        _alert(
            t,
            Alert.GPU_NVML_DOWN,
            Severity.WARNING,
            _on_scheduler_of_node(
                f"max by ({N}) ({c.NVML_UP.name}) == 0\nor\nmax by ({N}) ({EXPORTER_UP}) == 0"
            ),
            t.nvml_down_for,
            "No GPU telemetry from node {{ $labels.node }}",
            "NVML or the trainguard exporter on node {{ $labels.node }} stopped answering; "
            "GPU alerts of this node are silenced until it is back. " + _ranks_on_node(),
        ),
        _alert(
            t,
            Alert.NCCL_SOCKET_TRANSPORT_FALLBACK,
            Severity.WARNING,
            _on_scheduler_of_node(
                f"max by ({N}) ({c.NCCL_INFO.client_name}_info"
                f'{{{contract.LABEL_TRANSPORT}=~"{t.nccl_socket_transport}"}}) == 1'
            ),
            t.nccl_socket_for,
            "NCCL on node {{ $labels.node }} uses the Socket transport",
            "NCCL on node {{ $labels.node }} fell back to TCP sockets instead of InfiniBand "
            "/ RoCE; collectives are an order of magnitude slower. " + _ranks_on_node(),
        ),
    ]


def render(t: Thresholds) -> str:
    """The rules file's text (deterministic: same thresholds, same bytes)."""
    document = {
        "groups": [
            {"name": GROUP, "rules": [*recording_rules(t), *alert_rules(t)]},
        ]
    }
    header = (
        "# Generated by `trainguard rules` from thresholds.yml. Do not edit by hand:\n"
        "# change the thresholds (or rules.py beside them) and run `trainguard rules`.\n"
    )
    return header + yaml.dump(document, Dumper=_BlockDumper, sort_keys=False, width=100)


class _BlockDumper(yaml.SafeDumper):
    """Writes multi-line strings (PromQL) as literal blocks so the rules file reads like code."""


def _str_representer(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_BlockDumper.add_representer(str, _str_representer)
