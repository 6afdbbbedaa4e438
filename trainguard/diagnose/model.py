"""The incident report as data: symptoms, scope, ranked root-cause candidates, advice, charts.

The Markdown and JSON renderings (:mod:`trainguard.diagnose.render`) and the remediation
service's stored copy are all made from one :class:`Report`.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any

from trainguard.contract import Failure


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

    cause: str
    summary: str
    confidence: float
    evidence: list[str]
    do_now: list[str]
    prevention: list[str]
    facts: dict[str, Any] = field(default_factory=dict)


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
    charts: list[Chart] = field(default_factory=list)
    inputs: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def failure(self) -> Failure | None:
        return self.symptoms[0].failure if self.symptoms else None
