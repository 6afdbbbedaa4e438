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


def increased(counter: contract.MetricSpec, window: str) -> str:
    """A counter's per-rank increase over ``window``, kept only where it is not zero."""
    return f"sum by ({RANK}) (increase({counter.name}[{window}])) > 0"


def job_quantile(q: float, bucket_rates: str) -> str:
    """A job's quantile from its recorded per-job bucket rates."""
    return f"histogram_quantile({q}, sum by ({J}, le) ({bucket_rates}))"


def quantile(q: float, metric: str, by: str, window: str) -> str:
    return f"histogram_quantile({q}, sum by ({by}, le) (rate({metric}_bucket[{window}])))"


def with_labels(condition: str, on: str, labels: str, source: str, cover: str) -> str:
    """``condition`` with ``labels`` copied from the one ``source`` series of its group.

    ``cover`` has a series for every ``on`` group the condition can hold: the groups of an
    operand the condition requires (a recorded series, cheap to read), or, where the condition
    reads few series, the condition itself. A group ``source`` lacks joins its ``cover`` series
    instead and goes without the labels, so a missing helper series never silences an alert,
    and the condition is evaluated once (a fallback ``or`` would evaluate it twice, over every
    rank of a job).
    """
    return (
        f"(\n{condition}\n)\n* on ({on}) group_left ({labels})\n"
        f"(\n  0 * (\n    {source}\n    or on ({on})\n    group by ({on}) ({cover})\n  ) + 1\n)"
    )


def on_scheduler_of_job(condition: str, cover: str) -> str:
    """A job's alert, labelled with where the job runs (the remediation service's routing);
    ``cover``: see ``with_labels``."""
    return with_labels(condition, J, SCHEDULER, contract.REC_JOB_SCHEDULER, cover)


def on_scheduler_of_node(condition: str) -> str:
    """A node's alert, labelled with the scheduler of the training ranks it runs, if any.

    Node alerts read the exporter's per-GPU series, a few per node and none per rank, and
    their conditions hold few series, so the condition is its own cover (``with_labels``).
    """
    return with_labels(
        condition, N, contract.LABEL_SCHEDULER, contract.REC_NODE_SCHEDULER, condition
    )


def warmed_up(t: Thresholds) -> str:
    """Ranks past their warm-up steps (a rank's first steps after a (re)start are slow)."""
    return f"sum by ({J}, {R}) ({contract.STEPS.name}) >= {t.warmup_steps}"
