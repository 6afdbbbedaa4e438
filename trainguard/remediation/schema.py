"""The remediation service's tables (SQLAlchemy Core), the same on SQLite and Postgres.

Alerts as Alertmanager sent them, the inbox of notifications, the actions decided with their
transitions and the directives and acknowledgements of the ranks, the guards' breakers and
budget resets, the incidents with their alerts and actions, the diagnose reports, and the
discovery registrations. :mod:`.store` creates them; partial indexes keep the hot queries (the
guards' counted actions, the inbox's undecided entries) off the bulk of an alert storm.
"""

from __future__ import annotations

from sqlalchemy import (
    BigInteger,
    Column,
    Float,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    PrimaryKeyConstraint,
    Table,
    Text,
    UniqueConstraint,
    text,
)

from trainguard.remediation.decisions import COUNTED_FILTER

metadata = MetaData()

alerts = Table(
    "alerts",
    metadata,
    Column("id", Integer, primary_key=True),
    Column("fingerprint", Text, nullable=False),
    Column("starts_at", Text, nullable=False),
    Column("name", Text, nullable=False),
    Column("status", Text, nullable=False),
    Column("labels", Text, nullable=False),
    Column("annotations", Text, nullable=False),
    Column("ends_at", Text),
    Column("generator_url", Text, nullable=False),
    Column("group_key", Text, nullable=False),
    Column("receiver", Text, nullable=False),
    Column("received_at", Float, nullable=False),
    Column("notifications", Integer, nullable=False, server_default=text("1")),
    UniqueConstraint("fingerprint", "starts_at"),
    Index("alerts_status", "status"),
)
actions = Table(
    "actions",
    metadata,
    Column("id", Integer, primary_key=True),
    Column("alert_id", Integer, ForeignKey("alerts.id"), nullable=False),
    Column("step", Integer, nullable=False),
    Column("subject", Text, nullable=False),
    Column("action", Text, nullable=False),
    Column("executor", Text, nullable=False),
    Column("params", Text, nullable=False),
    Column("destructive", Integer, nullable=False),
    Column("state", Text, nullable=False),
    Column("reason", Text, nullable=False),
    Column("snapshot", Text),
    Column("output", Text),
    Column("created_at", Float, nullable=False),
    Column("updated_at", Float, nullable=False),
    UniqueConstraint("alert_id", "step"),
    Index("actions_state", "state", "id"),
    Index("actions_alert", "alert_id"),
    Index("actions_subject", "subject", "id"),
    # The guards' cooldown and budget look only at counted actions: suppressed and skipped
    # ones (an alert storm's bulk) stay out of this index and never slow the guards down.
    Index(
        "actions_counted",
        "subject",
        "action",
        "created_at",
        sqlite_where=text(COUNTED_FILTER),
        postgresql_where=text(COUNTED_FILTER),
    ),
)
transitions = Table(
    "transitions",
    metadata,
    Column("id", Integer, primary_key=True),
    Column("action_id", Integer, ForeignKey("actions.id"), nullable=False),
    Column("state", Text, nullable=False),
    Column("at", Float, nullable=False),
    Column("note", Text, nullable=False),
    Index("transitions_action", "action_id", "id"),
)
directives = Table(
    "directives",
    metadata,
    Column("id", Integer, primary_key=True),
    Column("action_id", Integer, ForeignKey("actions.id"), unique=True),
    Column("job_id", Text, nullable=False),
    Column("rank", Integer),
    Column("kind", Text, nullable=False),
    Column("params", Text, nullable=False),
    Column("created_at", Float, nullable=False),
    Index("directives_job", "job_id", "id"),
)
directive_acks = Table(
    "directive_acks",
    metadata,
    Column("directive_id", Integer, ForeignKey("directives.id"), nullable=False),
    Column("rank", Integer, nullable=False),
    Column("outcome", Text, nullable=False),
    Column("detail", Text, nullable=False),
    Column("at", Float, nullable=False),
    PrimaryKeyConstraint("directive_id", "rank"),
)
deferred = Table(
    "deferred",
    metadata,
    Column("alert_id", Integer, ForeignKey("alerts.id"), primary_key=True, autoincrement=False),
    Column("due_at", Float, nullable=False),
    Index("deferred_due", "due_at"),
)
breakers = Table(
    "breakers",
    metadata,
    Column("subject", Text, primary_key=True),
    Column("tripped_at", Float, nullable=False),
    Column("reason", Text, nullable=False),
)
# When an operator last reset a subject's breaker: its budget counts actions after this only.
budget_resets = Table(
    "budget_resets",
    metadata,
    Column("subject", Text, primary_key=True),
    Column("reset_at", Float, nullable=False),
)
reports = Table(
    "reports",
    metadata,
    Column("action_id", Integer, ForeignKey("actions.id"), primary_key=True, autoincrement=False),
    Column("job_id", Text, nullable=False),
    Column("created_at", Float, nullable=False),
    Column("markdown", Text),
    Column("report", Text),
    Column("error", Text),
)

# Incidents: one failure of one subject (a job, or ``node:<name>``), from the alert that opened
# it to the verifier's verdict (trainguard.remediation.incidents and .verify).
incidents = Table(
    "incidents",
    metadata,
    Column("id", Integer, primary_key=True),
    Column("subject", Text, nullable=False),
    Column("job_id", Text),
    Column("failure", Text),
    # What "the same failure" means: the failure, or ``alert:<name>`` outside the catalogue.
    Column("failure_key", Text, nullable=False),
    Column("alert_id", Integer, ForeignKey("alerts.id"), nullable=False),
    # The alert whose rule's ladder the incident climbs (the longest of its alerts' ladders),
    # and that ladder's length (escalation steps) when it was chosen.
    Column("ladder_alert_id", Integer, ForeignKey("alerts.id"), nullable=False),
    Column("ladder_length", Integer, nullable=False),
    Column("state", Text, nullable=False),
    Column("outcome", Text),
    Column("job_outcome", Text),
    Column("rung", Integer, nullable=False),
    Column("rung_action", Text, nullable=False),
    Column("rung_started_at", Float, nullable=False),
    Column("paged", Integer, nullable=False, server_default=text("0")),
    Column("first_evidence_at", Float),
    Column("detected_at", Float, nullable=False),
    Column("received_at", Float, nullable=False),
    Column("acted_at", Float),
    Column("recovered_at", Float),
    Column("closed_at", Float),
    Column("deadline_at", Float),
    Column("baseline_step", BigInteger),
    Column("baseline_ranks_up", Integer),
    # When the verifier read the baseline from Prometheus; null until it could.
    Column("baseline_at", Float),
    Column("note", Text, nullable=False),
    # One open incident per (subject, failure): a second alert joins it.
    Index(
        "incidents_open",
        "subject",
        "failure_key",
        unique=True,
        sqlite_where=text("state != 'closed'"),
        postgresql_where=text("state != 'closed'"),
    ),
    Index("incidents_state", "state", "id"),
    Index("incidents_job", "job_id", "id"),
)
incident_alerts = Table(
    "incident_alerts",
    metadata,
    Column("alert_id", Integer, ForeignKey("alerts.id"), primary_key=True, autoincrement=False),
    Column("incident_id", Integer, ForeignKey("incidents.id"), nullable=False),
    Index("incident_alerts_incident", "incident_id"),
)
incident_actions = Table(
    "incident_actions",
    metadata,
    Column("action_id", Integer, ForeignKey("actions.id"), primary_key=True, autoincrement=False),
    Column("incident_id", Integer, ForeignKey("incidents.id"), nullable=False),
    Column("rung", Integer, nullable=False),
    Column("verdict", Text),
    Index("incident_actions_incident", "incident_id", "rung"),
)
# Nodes taken out of a job on purpose (a succeeded exclude_node or drain_node): their ranks are
# not down, and alerts about them are not acted on.
removals = Table(
    "removals",
    metadata,
    Column("action_id", Integer, ForeignKey("actions.id"), primary_key=True, autoincrement=False),
    Column("job_id", Text, nullable=False),
    Column("node", Text, nullable=False),
    Column("at", Float, nullable=False),
    Index("removals_job_node", "job_id", "node"),
)
# How a removal ends: the verifier sees the node's ranks of the job gone (vacated), then a rank
# of the job up on it again (rejoined, a scale-up or the node back from repair); from then on
# alerts about its ranks are acted on again. A table of its own rather than columns of
# ``removals`` so that a store made before it gains it without a migration.
removal_states = Table(
    "removal_states",
    metadata,
    Column(
        "action_id",
        Integer,
        ForeignKey("removals.action_id"),
        primary_key=True,
        autoincrement=False,
    ),
    Column("vacated_at", Float),
    Column("rejoined_at", Float),
)
# Targets registered for Prometheus' HTTP service discovery (trainguard.remediation.discovery):
# one row per (kind, address), served until it expires. ``job_id`` is the rank's label, for the
# per-job bound.
discovery_targets = Table(
    "discovery_targets",
    metadata,
    Column("kind", Text, nullable=False),
    Column("target", Text, nullable=False),
    Column("job_id", Text),
    Column("labels", Text, nullable=False),
    Column("renewed_at", Float, nullable=False),
    Column("expires_at", Float, nullable=False),
    PrimaryKeyConstraint("kind", "target"),
    Index("discovery_targets_expiry", "expires_at"),
    Index("discovery_targets_job", "kind", "job_id"),
)

# The webhook's inbox (trainguard.remediation.inbox): each notification as received, committed
# before the webhook answers and decided afterwards, in id order. A decided entry keeps what its
# decision came to (``result``) and drops its body (its alerts are in ``alerts`` by then); one
# that could not be decided keeps its body and the ``error``.
inbox = Table(
    "inbox",
    metadata,
    Column("id", Integer, primary_key=True),
    Column("body", LargeBinary),
    Column("group_key", Text, nullable=False),
    Column("alerts", Integer, nullable=False),
    Column("accepted_at", Float, nullable=False),
    Column("decided_at", Float),
    Column("result", Text),
    Column("error", Text),
    # What the decider reads and the lag gauges count: the undecided entries only.
    Index(
        "inbox_undecided",
        "id",
        "accepted_at",
        sqlite_where=text("decided_at IS NULL"),
        postgresql_where=text("decided_at IS NULL"),
    ),
    Index(
        "inbox_failed",
        "id",
        sqlite_where=text("error IS NOT NULL"),
        postgresql_where=text("error IS NOT NULL"),
    ),
)
