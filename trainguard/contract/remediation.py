"""The remediation service's metrics, incident vocabulary and HTTP service discovery."""

from __future__ import annotations

import enum

from trainguard.contract.labels import LABEL_KIND, LABEL_REASON
from trainguard.contract.metric import MetricSpec, counter, gauge, histogram
from trainguard.contract.rules import SCRAPE_JOB_EXPORTER, SCRAPE_JOB_RANKS

# --- remediation service (emitted by trainguard.remediation) -------------------------------
LABEL_STATE = "state"
LABEL_ACTION = "action"
LABEL_EXECUTOR = "executor"
LABEL_OUTCOME = "outcome"
LABEL_STATUS = "status"

REMEDIATION_ALERTS_RECEIVED = counter(
    "remediation_alerts_received_total",
    "Alerts received from Alertmanager and committed to the inbox, by status (firing|resolved).",
    (LABEL_STATUS,),
)
REMEDIATION_ALERTS_DEDUPLICATED = counter(
    "remediation_alerts_deduplicated_total",
    "Alerts received again with a (fingerprint, startsAt) already stored.",
)
REMEDIATION_WEBHOOK_REJECTED = counter(
    "remediation_webhook_rejected_total",
    "Requests refused before storage (reason: unauthorized|too_large|invalid|unavailable).",
    (LABEL_REASON,),
)
REMEDIATION_WEBHOOK_DURATION = histogram(
    "remediation_webhook_duration_seconds",
    "Time from receiving a webhook to answering it, its commit to the inbox included.",
)
# The webhook's inbox (trainguard.remediation.inbox): notifications accepted, not yet decided.
REMEDIATION_INBOX_DEPTH = gauge(
    "remediation_inbox_depth",
    "Notifications committed to the inbox and not yet decided (from the store).",
)
REMEDIATION_INBOX_OLDEST_AGE = gauge(
    "remediation_inbox_oldest_age_seconds",
    "How long the oldest undecided notification has waited in the inbox; 0 when none does.",
)
REMEDIATION_INBOX_FAILED = gauge(
    "remediation_inbox_failed",
    "Notifications that could not be decided, kept in the inbox with their error.",
)
REMEDIATION_DECISION_LAG = histogram(
    "remediation_decision_lag_seconds",
    "Time from a notification's acceptance (the webhook's commit) to its decision.",
)
REMEDIATION_DECISIONS = counter(
    "remediation_decisions_total",
    "Actions planned by the policy, by the state the guards put them in "
    "(queued, awaiting_approval, dry_run, suppressed, skipped).",
    (LABEL_ACTION, LABEL_STATE),
)
REMEDIATION_ACTIONS_EXECUTED = counter(
    "remediation_actions_executed_total",
    "Actions carried out by an executor, by outcome (success|failure).",
    (LABEL_ACTION, LABEL_EXECUTOR, LABEL_OUTCOME),
)
REMEDIATION_ACTION_DURATION = histogram(
    "remediation_action_duration_seconds",
    "Time an executor took to carry out an action.",
    (LABEL_EXECUTOR,),
)
REMEDIATION_ACTIONS = gauge(
    "remediation_actions",
    "Actions in the store by state; queued + running is the executor queue depth.",
    (LABEL_STATE,),
)
REMEDIATION_CIRCUIT_BREAKERS_OPEN = gauge(
    "remediation_circuit_breakers_open",
    "Jobs (or nodes) whose action budget tripped a circuit breaker awaiting a manual reset.",
)
REMEDIATION_DIRECTIVE_ACKS = counter(
    "remediation_directive_acks_total",
    "Directive acknowledgements from ranks, by outcome (success|failure).",
    (LABEL_OUTCOME,),
)
REMEDIATION_DRY_RUN = gauge(
    "remediation_dry_run", "1 while the service only records decisions (dry-run mode)."
)

# Incidents: what the verifier concluded after each repair (trainguard.remediation.verify).
LABEL_FAILURE = "failure"


class IncidentOutcome(str, enum.Enum):
    """How an incident ended: training recovered, did not, is worse than when it started (more
    ranks down), or the job ended normally before a repair could be judged (neither a success
    nor a failure of remediation: the reliability ratios leave it out)."""

    RECOVERED = "recovered"
    NOT_RECOVERED = "not_recovered"
    WORSE = "worse"
    JOB_ENDED = "job_ended"


class JobOutcome(str, enum.Enum):
    """Whether the job's training passed the step it had reached before the incident, or ran to
    its end (every rank withdrew cleanly)."""

    RESUMED = "resumed"
    LOST = "lost"
    FINISHED = "finished"


# The alert the service posts to Alertmanager when the last rung of a ladder did not recover a
# job: a page for a human, through the same routing, grouping and silences as every alert.
REMEDIATION_FAILED_ALERT = "TrainguardRemediationFailed"
LABEL_INCIDENT = "incident"
LABEL_RUNG = "rung"

REMEDIATION_INCIDENTS = counter(
    "remediation_incidents_total",
    "Incidents closed, by failure and outcome (recovered|not_recovered|worse|job_ended).",
    (LABEL_FAILURE, LABEL_OUTCOME),
)
REMEDIATION_INCIDENTS_OPEN = gauge(
    "remediation_incidents_open",
    "Incidents being acted on or verified, by failure (from the store).",
    (LABEL_FAILURE,),
)
REMEDIATION_INCIDENT_JOBS = counter(
    "remediation_incident_jobs_total",
    "Incidents closed, by whether the job's training passed its pre-incident step or ran to its "
    "end (resumed|lost|finished).",
    (LABEL_FAILURE, LABEL_OUTCOME),
)
REMEDIATION_TIME_TO_DETECT = histogram(
    "remediation_time_to_detect_seconds",
    "From the first evidence of a failure (its alert's pending start) to the service receiving "
    "the firing alert.",
    (LABEL_FAILURE,),
)
REMEDIATION_TIME_TO_ACT = histogram(
    "remediation_time_to_act_seconds",
    "From the failure's detection (its alert firing) to the first repair carried out.",
    (LABEL_FAILURE, LABEL_ACTION),
)
REMEDIATION_TIME_TO_RECOVER = histogram(
    "remediation_time_to_recover_seconds",
    "From the failure's detection to verified recovery (alert resolved and training past its "
    "pre-incident step), by the action that recovered it: the MTTR.",
    (LABEL_FAILURE, LABEL_ACTION),
)
REMEDIATION_ESCALATIONS = counter(
    "remediation_escalations_total",
    "Rungs climbed: a repair that did not recover in time, and the action tried next.",
    (LABEL_FAILURE, LABEL_ACTION),
)

# --- discovery without a shared file system (Prometheus http_sd_configs) ---------------------
# Ranks and node exporters register their /metrics address with the remediation service, which
# serves each kind's live registrations as one HTTP SD target list at DISCOVERY_PATH/<kind>.
DISCOVERY_PATH = "/v1/discovery"


class DiscoveryKind(str, enum.Enum):
    """What registered a target: each kind is one target list and one scrape job."""

    RANKS = "ranks"
    EXPORTERS = "exporters"


DISCOVERY_SCRAPE_JOBS: dict[DiscoveryKind, str] = {
    DiscoveryKind.RANKS: SCRAPE_JOB_RANKS,
    DiscoveryKind.EXPORTERS: SCRAPE_JOB_EXPORTER,
}
# The remediation service's base URL the hook and the exporter register with; unset: they do
# not (file_sd alone). They present the token of TRAINGUARD_REMEDIATION_TOKEN.
ENV_DISCOVERY_URL = "TRAINGUARD_DISCOVERY_URL"
# How long a registration lives unless renewed; it is renewed every third of it.
ENV_DISCOVERY_TTL = "TRAINGUARD_DISCOVERY_TTL_SECONDS"
REMEDIATION_DISCOVERY_TARGETS = gauge(
    "remediation_discovery_targets",
    "Targets registered for Prometheus' HTTP service discovery and not expired, by kind "
    "(ranks|exporters).",
    (LABEL_KIND,),
)

REMEDIATION_METRICS: tuple[MetricSpec, ...] = (
    REMEDIATION_ALERTS_RECEIVED,
    REMEDIATION_ALERTS_DEDUPLICATED,
    REMEDIATION_WEBHOOK_REJECTED,
    REMEDIATION_WEBHOOK_DURATION,
    REMEDIATION_INBOX_DEPTH,
    REMEDIATION_INBOX_OLDEST_AGE,
    REMEDIATION_INBOX_FAILED,
    REMEDIATION_DECISION_LAG,
    REMEDIATION_DECISIONS,
    REMEDIATION_ACTIONS_EXECUTED,
    REMEDIATION_ACTION_DURATION,
    REMEDIATION_ACTIONS,
    REMEDIATION_CIRCUIT_BREAKERS_OPEN,
    REMEDIATION_DIRECTIVE_ACKS,
    REMEDIATION_DRY_RUN,
    REMEDIATION_INCIDENTS,
    REMEDIATION_INCIDENTS_OPEN,
    REMEDIATION_INCIDENT_JOBS,
    REMEDIATION_TIME_TO_DETECT,
    REMEDIATION_TIME_TO_ACT,
    REMEDIATION_TIME_TO_RECOVER,
    REMEDIATION_ESCALATIONS,
    REMEDIATION_DISCOVERY_TARGETS,
)
# Read by the directive client of the training hook (the service reads the same variable).
ENV_REMEDIATION_TOKEN = "TRAINGUARD_REMEDIATION_TOKEN"
