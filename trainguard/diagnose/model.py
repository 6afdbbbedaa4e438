"""The incident report as data: symptoms, scope, ranked root-cause candidates, advice, what
remediation did and whether training recovered (validate), the settings that prevent each cause
(prevent), charts.

The Markdown and JSON renderings (:mod:`trainguard.diagnose.render`) and the remediation
service's stored copy are all made from one :class:`Report`.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any

from trainguard.contract import Cause, Failure, IncidentOutcome, JobOutcome


class ScopeLevel(str, enum.Enum):
    RANK = "rank"
    NODE = "node"
    JOB = "job"
    UNKNOWN = "unknown"


@dataclass
class Symptom:
    failure: Failure
    summary: str
    signals: list[str]
    since: float | None = None
    ranks: list[int] = field(default_factory=list)
    nodes: list[str] = field(default_factory=list)
    # Orders symptoms: 3 the job fails or hangs, 2 it is degraded, 1 a warning sign.
    severity: int = 2


@dataclass
class Scope:
    level: ScopeLevel
    explanation: str
    ranks: list[int] = field(default_factory=list)
    nodes: list[str] = field(default_factory=list)
    gpus: list[str] = field(default_factory=list)


@dataclass
class Candidate:
    """One possible root cause; ``confidence`` (0..1) ranks the candidates."""

    cause: Cause
    summary: str
    confidence: float
    evidence: list[str]
    do_now: list[str]
    prevention: list[str]
    facts: dict[str, Any] = field(default_factory=dict)


# The state of an incident the verifier has concluded: the service's IncidentState.CLOSED (its
# models need pydantic, which diagnose does not).
INCIDENT_CLOSED = "closed"


@dataclass
class RungTried:
    """One rung of an incident's ladder: the action tried and what became of it."""

    rung: int
    action: str
    action_id: int
    state: str
    at: float | None
    verdict: str
    # The actions held back alike on the rung that this entry stands for (the service lists
    # them once); 1 from a service that listed each.
    count: int = 1


@dataclass
class IncidentRecord:
    """One remediation incident of the job (the service's IncidentView), with the durations
    between its milestones: detect (first evidence -> alert firing), act (firing -> first
    repair), recover (firing -> verified recovery, the MTTR)."""

    id: int
    subject: str
    failure: Failure | None
    alert: str
    fingerprint: str
    state: str
    outcome: IncidentOutcome | None
    job_outcome: JobOutcome | None
    rung: int
    rung_action: str
    paged: bool
    first_evidence_at: float | None
    detected_at: float | None
    received_at: float | None
    acted_at: float | None
    recovered_at: float | None
    closed_at: float | None
    deadline_at: float | None
    baseline_step: int | None
    baseline_ranks_up: int | None
    tried: list[RungTried]
    note: str
    time_to_detect_seconds: float | None = None
    time_to_act_seconds: float | None = None
    time_to_recover_seconds: float | None = None
    # A rung past the first plan was tried.
    escalated: bool = False
    # The action of the rung that recovered training (None unless the outcome is recovered).
    recovered_by: str | None = None
    # Whether this report found a symptom of the incident's failure in its window.
    diagnosed: bool | None = None


@dataclass
class Validation:
    """What remediation did about the job and whether training recovered."""

    source: str
    incidents: list[IncidentRecord] = field(default_factory=list)
    # Why the incidents could not be read (service unreachable, a malformed file); the rest of
    # the report stands.
    gap: str | None = None
    notes: list[str] = field(default_factory=list)


@dataclass
class Setting:
    """One concrete configuration change, where it goes, and the report's facts behind it."""

    name: str
    value: str
    where: str
    evidence: list[str]


@dataclass
class Prevention:
    """What avoids one root cause next time: settings with their evidence, then the
    candidate's own advice that no setting expresses."""

    cause: Cause
    failure: Failure | None
    summary: str
    settings: list[Setting]
    practices: list[str]


@dataclass
class Chart:
    """A PNG and the data drawn in it (kept so the JSON report and tests can read it)."""

    name: str
    title: str
    path: str
    data: dict[str, Any]


@dataclass
class Report:
    job_id: str
    start: float
    end: float
    generated_at: float
    prometheus_url: str
    symptoms: list[Symptom] = field(default_factory=list)
    scope: Scope = field(default_factory=lambda: Scope(ScopeLevel.UNKNOWN, "no failure found"))
    candidates: list[Candidate] = field(default_factory=list)
    validation: Validation | None = None
    prevention: list[Prevention] = field(default_factory=list)
    charts: list[Chart] = field(default_factory=list)
    inputs: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def failure(self) -> Failure | None:
        return self.symptoms[0].failure if self.symptoms else None
