"""``AlertRule``: one Prometheus alerting rule, named by the contract, and its annotation text.

Each failure module (``memory``, ``stragglers``, ``hangs``, ``ranks``, ``gpus``, ``nccl``)
returns ``AlertRule``s for the alerts of its failures; ``rules`` renders them in the
contract's ``Alert`` order.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from trainguard import contract
from trainguard.alerts.promql import RANK_UP, G, N
from trainguard.contract import Alert, Failure, Severity


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
    def failure(self) -> Failure:
        """The failure this alert reports (the runbook's ``## <failure>`` section)."""
        return contract.failure_of(self.alert)

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
