"""PromQL building blocks shared by the recording rules and the alert rules of every failure."""

from __future__ import annotations

from trainguard import contract
from trainguard.thresholds import Thresholds

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


def num(value: float) -> str:
    """A threshold as PromQL and annotation text: 1.2, 60, 0.05 (never 60.0)."""
    return f"{value:g}"


def mean(metric: str, by: str, window: str) -> str:
    return (
        f"sum by ({by}) (rate({metric}_sum[{window}]))\n"
        f"/\nsum by ({by}) (rate({metric}_count[{window}]))"
    )


def quantile(q: float, metric: str, by: str, window: str) -> str:
    return f"histogram_quantile({q}, sum by ({by}, le) (rate({metric}_bucket[{window}])))"


def with_labels(condition: str, on: str, labels: str, source: str) -> str:
    """``condition`` with ``labels`` copied from the one ``source`` series of its group.

    Falls back to the bare condition where ``source`` has no series, so a missing helper
    series never silences an alert.
    """
    return (
        f"(\n{condition}\n)\n* on ({on}) group_left ({labels})\n(0 * {source} + 1)\n"
        f"or on ({on})\n(\n{condition}\n)"
    )


def on_scheduler_of_job(condition: str) -> str:
    """A job's alert, labelled with where the job runs (the remediation service's routing)."""
    return with_labels(condition, J, SCHEDULER, contract.REC_JOB_SCHEDULER)


def on_scheduler_of_node(condition: str) -> str:
    """A node's alert, labelled with the scheduler of the training ranks it runs, if any."""
    return with_labels(condition, N, contract.LABEL_SCHEDULER, contract.REC_NODE_SCHEDULER)


def warmed_up(t: Thresholds) -> str:
    """Ranks past their warm-up steps (a rank's first steps after a (re)start are slow)."""
    return f"sum by ({J}, {R}) ({contract.STEPS.name}) >= {t.warmup_steps}"
