"""Wire models: the Alertmanager webhook (version 4) and the service's own API documents."""

from __future__ import annotations

import enum
from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator
from pydantic.alias_generators import to_camel

from trainguard.contract import Action, Failure, IncidentOutcome, JobOutcome

ALERTNAME = "alertname"


class AlertStatus(str, enum.Enum):
    FIRING = "firing"
    RESOLVED = "resolved"


class _Camel(BaseModel):
    # Alertmanager spells fields in camelCase; Python code uses snake_case.
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, frozen=True)


class WebhookAlert(_Camel):
    """One alert of a notification."""

    status: AlertStatus
    labels: dict[str, str]
    annotations: dict[str, str] = Field(default_factory=dict)
    starts_at: datetime
    ends_at: datetime | None = None
    generator_url: str = Field(default="", alias="generatorURL")
    fingerprint: str = Field(min_length=1, max_length=128)

    @field_validator("labels")
    @classmethod
    def _has_alertname(cls, labels: dict[str, str]) -> dict[str, str]:
        if not labels.get(ALERTNAME):
            raise ValueError(f"labels must contain a non-empty {ALERTNAME!r}")
        return labels

    @property
    def name(self) -> str:
        return self.labels[ALERTNAME]

    @property
    def ends_at_or_none(self) -> datetime | None:
        # Alertmanager sends the zero time (year 1) for alerts with no known end.
        if self.ends_at is None or self.ends_at.year <= 1:
            return None
        return self.ends_at


class WebhookPayload(_Camel):
    """The body Alertmanager POSTs to a webhook receiver (payload version 4)."""

    version: Literal["4"]
    group_key: str
    truncated_alerts: int = Field(default=0, ge=0)
    status: AlertStatus
    receiver: str
    group_labels: dict[str, str] = Field(default_factory=dict)
    common_labels: dict[str, str] = Field(default_factory=dict)
    common_annotations: dict[str, str] = Field(default_factory=dict)
    external_url: str = Field(default="", alias="externalURL")
    alerts: list[WebhookAlert] = Field(min_length=1)


class WebhookAccepted(BaseModel):
    """The webhook's answer: the notification is committed to the inbox and will be decided, in
    the order notifications were accepted."""

    notification: int = Field(
        description="Its id in the inbox: GET /v1/notifications/{id} shows what it came to."
    )
    alerts: int


class WebhookResult(BaseModel):
    """What deciding a notification came to: counts, and the ids of actions it planned."""

    stored: int
    duplicates: int
    resolved: int
    cancelled_actions: int
    planned_actions: list[int]


class NotificationView(BaseModel):
    """One notification of the inbox: when it was accepted and decided, and what it came to."""

    id: int
    group_key: str
    alerts: int
    accepted_at: datetime
    decided_at: datetime | None = Field(
        description="When it was decided, or given up on (then ``error`` says why); null while "
        "it waits in the inbox."
    )
    result: WebhookResult | None
    error: str | None


class ActionState(str, enum.Enum):
    """Where an action is in its life; the audit trail records every change."""

    SKIPPED = "skipped"  # the alert lacks what the action needs (no job_id, no node)
    SUPPRESSED = "suppressed"  # a guard held it back (cooldown, budget, circuit breaker)
    DRY_RUN = "dry_run"  # recorded only; dry-run mode
    AWAITING_APPROVAL = "awaiting_approval"
    QUEUED = "queued"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    REJECTED = "rejected"
    CANCELLED = "cancelled"  # the alert resolved before it ran


PENDING_STATES = (ActionState.AWAITING_APPROVAL, ActionState.QUEUED)


class Transition(BaseModel):
    state: str
    at: datetime
    note: str


class AlertSummary(BaseModel):
    id: int
    name: str
    fingerprint: str
    status: AlertStatus
    starts_at: datetime
    received_at: datetime = Field(description="When the service first received the alert.")
    labels: dict[str, str]
    annotations: dict[str, str]


class ActionView(BaseModel):
    """One action with everything the audit trail holds about it."""

    id: int
    alert: AlertSummary
    step: int
    subject: str
    action: Action
    failure: Failure | None = Field(
        description="The failure the alert reports (trainguard.contract.Failure); null for an "
        "alert that is not one of trainguard's."
    )
    executor: str
    params: dict[str, Any]
    destructive: bool
    state: ActionState
    reason: str
    output: dict[str, Any] | None
    created_at: datetime
    updated_at: datetime
    transitions: list[Transition]
    report: str | None = Field(
        default=None,
        description="Path of the diagnose report attached to this action, once it is written.",
    )


class ActionList(BaseModel):
    actions: list[ActionView]


class Decision(BaseModel):
    """An operator's approval or rejection."""

    by: str = Field(default="", max_length=200)
    comment: str = Field(default="", max_length=2000)


class Directive(BaseModel):
    """An instruction for the ranks of a job (checkpoint now, dump diagnostics, ...)."""

    id: int
    job_id: str
    rank: int | None = Field(description="The rank it is for; null for every rank.")
    kind: Action
    params: dict[str, Any]
    created_at: datetime


class DirectiveList(BaseModel):
    directives: list[Directive]


class AckOutcome(str, enum.Enum):
    SUCCESS = "success"
    FAILURE = "failure"


class DirectiveAck(BaseModel):
    rank: int = Field(ge=0)
    outcome: AckOutcome = AckOutcome.SUCCESS
    detail: str = Field(default="", max_length=4000)


class Breaker(BaseModel):
    subject: str
    tripped_at: datetime
    reason: str


class BreakerList(BaseModel):
    breakers: list[Breaker]


class IncidentState(str, enum.Enum):
    """Where an incident is: a rung's actions are being carried out, their effect is being
    verified against the rung's deadline, or the verifier has concluded."""

    ACTING = "acting"
    VERIFYING = "verifying"
    CLOSED = "closed"


class IncidentAlert(BaseModel):
    """The alert that opened an incident."""

    name: str
    fingerprint: str
    labels: dict[str, str]


class TriedAction(BaseModel):
    """An action of an incident, on the rung that tried it, and what the verifier made of it;
    or the actions held back alike on that rung (``count``)."""

    rung: int
    action: str
    action_id: int
    state: str
    at: datetime = Field(description="When the action was decided.")
    verdict: str
    count: int = Field(
        default=1,
        description="How many actions the entry stands for: the actions a guard or an operator "
        "held back on one rung, of one action and state, are one entry (the first of them).",
    )
    last_at: datetime = Field(description="When the latest of them was decided.")


class IncidentView(BaseModel):
    """One failure of one job (or node), from detection to the verifier's verdict."""

    id: int
    subject: str
    job_id: str | None
    failure: Failure | None = Field(description="trainguard.contract.Failure; null outside it.")
    alert: IncidentAlert
    state: IncidentState
    outcome: IncidentOutcome | None
    job_outcome: JobOutcome | None
    rung: int = Field(description="The ladder's rung: 0 is the rule's plan, k its k-th escalation.")
    rung_action: str = Field(description="The rung's repair: its first action but recommend.")
    paged: bool
    first_evidence_at: datetime | None
    detected_at: datetime | None = Field(description="The alert's startsAt.")
    received_at: datetime | None
    acted_at: datetime | None = Field(description="When the first repair was carried out.")
    recovered_at: datetime | None
    closed_at: datetime | None
    deadline_at: datetime | None
    baseline_step: int | None = Field(
        description="The job's highest trainguard_step when the failure was detected."
    )
    baseline_ranks_up: int | None
    tried: list[TriedAction]
    note: str = Field(description="The verifier's last word.")


class IncidentList(BaseModel):
    incidents: list[IncidentView]
