"""``AlertRule`` and ``Recorded``: one alerting rule and one recording rule, named by the
contract; and the two roles a failure's module registers them under.

Each failure with alerts has a module named after it (``trainguard.alerts.oom``, ...) that
registers ``rules(t)`` under :data:`ALERT_RULES` (its ``AlertRule``s) and, where its alerts read
series no other failure reads, ``recording(t)`` under :data:`RECORDING_RULES`; ``rules``
renders them failure by failure, in the catalogue's order.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from trainguard import contract
from trainguard.alerts.promql import RANK_UP, G, N
from trainguard.contract import Alert, Role, Severity
from trainguard.thresholds import Thresholds


@dataclass(frozen=True)
class AlertRule:
    """One alerting rule; an alert with two severities has two (same ``alert``)."""

    alert: Alert
    severity: Severity
    expr: str
    summary: str
    description: str
    for_: str = "0s"
    labels: Mapping[str, str] = field(default_factory=dict)

    @property
    def runbook_anchor(self) -> str:
        """The alert's own ``### <AlertName>`` section, under its failure's section."""
        return self.alert.value.lower()

    def render(self, runbook_base_url: str) -> dict[str, Any]:
        """The rule as it appears in the rules file."""
        rule: dict[str, Any] = {"alert": self.alert.value, "expr": self.expr}
        if self.for_ != "0s":
            rule["for"] = self.for_
        rule["labels"] = {contract.LABEL_SEVERITY: self.severity.value, **self.labels}
        rule["annotations"] = {
            contract.ANNOTATION_SUMMARY: self.summary,
            contract.ANNOTATION_DESCRIPTION: self.description,
            contract.ANNOTATION_RUNBOOK_URL: f"{runbook_base_url}#{self.runbook_anchor}",
        }
        return rule


class RecordingGroup(str, enum.Enum):
    """The recording groups, in the order the rules file lays them out (docs/alerts.md#how-the-
    rules-scale): the ``ranks*`` groups each read their part of the ranks' raw series once per
    evaluation; the ``jobs*`` groups read recorded series only."""

    RANKS = "ranks"
    RANKS_PHASES = "ranks-phases"
    RANKS_STEP_BUCKETS = "ranks-step-buckets"
    RANKS_SYNC = "ranks-sync"
    RANKS_HEALTH = "ranks-health"
    RANKS_ALERT_INPUTS = "ranks-alert-inputs"
    JOBS = "jobs"
    JOBS_PHASES = "jobs-phases"
    JOBS_PHASE_MEDIANS = "jobs-phase-medians"


@dataclass(frozen=True)
class Recorded:
    """One recording rule and the group it runs in. Within a group rules run in order, the
    shared ones (``recording``) first, then each failure's in catalogue order: a rule may read
    one recorded earlier in its group, or in any group (as of that group's last evaluation)."""

    group: RecordingGroup
    record: str
    expr: str


AlertRulesOf = Callable[[Thresholds], list[AlertRule]]
RecordedOf = Callable[[Thresholds], list[Recorded]]

# What a failure's module in this package registers (``@ALERT_RULES.register(Failure.X)``).
ALERT_RULES: Role[AlertRulesOf] = Role("alert rules", "trainguard.alerts")
RECORDING_RULES: Role[RecordedOf] = Role("recording rules", "trainguard.alerts")


# Template fragments: who an alert is about.
WHO = "rank {{ $labels.rank }} of job {{ $labels.job_id }} on node {{ $labels.node }}"
WHO_START = WHO[0].upper() + WHO[1:]


def ranks_on_node() -> str:
    """Annotation text listing the training ranks (job, rank) that run on ``$labels.node``."""
    selector = f'{RANK_UP.removesuffix("}")},{N}="%s"}}'
    return (
        "Training ranks on this node: {{ range query (printf `"
        + selector
        + "` $labels.node) | sortByLabel `rank` }}"
        "job {{ .Labels.job_id }} rank {{ .Labels.rank }}; {{ else }}none known; {{ end }}"
    )


def ranks_on_gpu() -> str:
    """Annotation text naming the ranks on ``$labels.gpu`` (the exporter's process map), or
    else every rank of the node."""
    # Processes that are not ranks share one series per GPU with empty rank labels.
    selector = f'{contract.GPU_PROCESS_INFO.name}{{{N}="%s",{G}="%s",{contract.LABEL_RANK}!=""}}'
    return (
        "{{ with query (printf `"
        + selector
        + "` $labels.node $labels.gpu) }}Training ranks on this GPU: "
        "{{ range sortByLabel `rank` . }}job {{ .Labels.job_id }} rank {{ .Labels.rank }}; "
        "{{ end }}{{ else }}" + ranks_on_node() + "{{ end }}"
    )
