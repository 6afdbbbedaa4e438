"""Remediation: alerts received, actions planned and executed, outcomes, approvals, and the
service's reliability (success rate, MTTR, and where the time to recover goes)."""

from __future__ import annotations

from trainguard import contract as c
from trainguard.dashboards.panels import (
    RATE,
    REMEDIATION_FILTER,
    DashboardSpec,
    PanelBuilder,
    Query,
    increase,
    quantile,
    remediation_variables,
    series,
    single,
)
from trainguard.thresholds import Thresholds


def _state() -> list[PanelBuilder]:
    """Row "State"."""
    f = REMEDIATION_FILTER
    return [
        single(
            "Awaiting approval",
            "Destructive actions waiting for a human (POST /v1/actions/{id}/approve).",
            "short",
            Query(f'sum({c.REMEDIATION_ACTIONS.name}{{{f},state="awaiting_approval"}})'),
        ),
        single(
            "Queued or running",
            "The executor queue.",
            "short",
            Query(f'sum({c.REMEDIATION_ACTIONS.name}{{{f},state=~"queued|running"}})'),
        ),
        single(
            "Circuit breakers open",
            "Jobs or nodes whose action budget tripped; needs a manual reset.",
            "short",
            Query(f"sum({c.REMEDIATION_CIRCUIT_BREAKERS_OPEN.name}{{{f}}})"),
        ),
        single(
            "Dry run",
            "1 while the service only records decisions.",
            "short",
            Query(f"max({c.REMEDIATION_DRY_RUN.name}{{{f}}})"),
        ),
    ]


def _flow() -> list[PanelBuilder]:
    """Row "Flow"."""
    f = REMEDIATION_FILTER
    return [
        series(
            "Alerts received",
            "Alertmanager webhook alerts stored, by status.",
            "short",
            Query(increase(c.REMEDIATION_ALERTS_RECEIVED, f, "status"), "{{status}}"),
            Query(
                f"sum(increase({c.REMEDIATION_ALERTS_DEDUPLICATED.name}{{{f}}}[{RATE}]))",
                "deduplicated",
            ),
            Query(
                increase(c.REMEDIATION_WEBHOOK_REJECTED, f, "reason"),
                "rejected {{reason}}",
            ),
        ),
        series(
            "Decisions",
            "Actions planned by the policy, by the state the guards put them in.",
            "short",
            Query(
                increase(c.REMEDIATION_DECISIONS, f, "action, state"),
                "{{action}} {{state}}",
            ),
            stacked=True,
        ),
        series(
            "Actions executed",
            "Actions carried out, by executor and outcome.",
            "short",
            Query(
                increase(c.REMEDIATION_ACTIONS_EXECUTED, f, "action, executor, outcome"),
                "{{action}} {{executor}} {{outcome}}",
            ),
            stacked=True,
        ),
        series(
            "Latency",
            "Webhook answer time and executor time (p99).",
            "s",
            Query(quantile(0.99, c.REMEDIATION_WEBHOOK_DURATION.name, f), "webhook p99"),
            Query(
                quantile(0.99, c.REMEDIATION_ACTION_DURATION.name, f, by="executor"),
                "{{executor}} p99",
            ),
        ),
        series(
            "Directive acknowledgements",
            "Ranks acknowledging directives (checkpoint now, compress gradients, "
            "new timeout), by outcome.",
            "short",
            Query(increase(c.REMEDIATION_DIRECTIVE_ACKS, f, "outcome"), "{{outcome}}"),
            width=24,
        ),
    ]


# The window of the incident latency quantiles: incidents are rare, so a rate over Grafana's
# usual few minutes would hold an observation for a moment; an hour keeps each incident on the
# graph long enough to read.
INCIDENT_WINDOW = "1h"


def _phase_quantiles(title: str, description: str, spec: c.MetricSpec) -> PanelBuilder:
    """p50 and p90 of one of the incident latencies, by failure."""
    f = REMEDIATION_FILTER

    def by_failure(q: float) -> str:
        return (
            f"histogram_quantile({q}, sum by ({c.LABEL_FAILURE}, le) "
            f"(rate({spec.bucket_name}{{{f}}}[{INCIDENT_WINDOW}])))"
        )

    return series(
        title,
        description,
        "s",
        Query(by_failure(0.5), "{{failure}} p50"),
        Query(by_failure(0.9), "{{failure}} p90"),
        width=8,
    )


def _reliability() -> list[PanelBuilder]:
    """Row "Reliability": the figures a team's before/after reliability report leads with."""
    f = REMEDIATION_FILTER
    windows = c.RELIABILITY_WINDOWS
    every = "over every service instance (recording rules)"
    return [
        *(
            single(
                f"Success rate {w}",
                f"Incidents recovered / incidents closed in the last {w}, {every}; no data "
                "when none closed.",
                "percentunit",
                Query(c.REC_SUCCESS_RATIO[w]),
                width=4,
            )
            for w in windows
        ),
        *(
            single(
                f"MTTR {w}",
                "Mean time from detection to verified recovery (alert resolved, training past "
                f"its pre-incident step) of the incidents recovered in the last {w}, {every}.",
                "s",
                Query(c.REC_MTTR[w]),
                width=4,
            )
            for w in windows
        ),
        series(
            "Success rate by failure (1d)",
            f"Incidents recovered / closed over the trailing day, by failure, {every}: the "
            "before/after line of a remediation change.",
            "percentunit",
            Query(c.REC_FAILURE_SUCCESS_RATIO["1d"], "{{failure}}"),
        ),
        series(
            "Time to resume by failure (1d MTTR)",
            "Mean time from detection until training ran again past its pre-incident step, "
            f"over the trailing day, by failure, {every}.",
            "s",
            Query(c.REC_FAILURE_MTTR["1d"], "{{failure}}"),
        ),
        series(
            "Incidents by outcome",
            "Incidents closed, by the verifier's outcome (recovered, not_recovered, worse, "
            "job_ended: the job ended normally before the repair could be judged), and incidents "
            "open (being acted on or verified).",
            "short",
            Query(increase(c.REMEDIATION_INCIDENTS, f, c.LABEL_OUTCOME), "{{outcome}}"),
            Query(f"sum({c.REMEDIATION_INCIDENTS_OPEN.name}{{{f}}})", "open"),
        ),
        series(
            "Jobs resumed vs lost",
            "Incidents closed by whether the job's training passed the step it had reached "
            "before the incident (resumed) or not (lost), or ran to its end (finished).",
            "short",
            Query(increase(c.REMEDIATION_INCIDENT_JOBS, f, c.LABEL_OUTCOME), "{{outcome}}"),
            stacked=True,
        ),
        _phase_quantiles(
            "Time to detect",
            "From the first evidence (the alert's pending start) to the service receiving the "
            f"firing alert, by failure (over {INCIDENT_WINDOW}).",
            c.REMEDIATION_TIME_TO_DETECT,
        ),
        _phase_quantiles(
            "Time to act",
            "From detection (the alert firing) to the first repair carried out, by failure "
            f"(over {INCIDENT_WINDOW}).",
            c.REMEDIATION_TIME_TO_ACT,
        ),
        _phase_quantiles(
            "Time to recover",
            "From detection to verified recovery, by failure (over "
            f"{INCIDENT_WINDOW}): where the MTTR comes from.",
            c.REMEDIATION_TIME_TO_RECOVER,
        ),
        series(
            "Escalations",
            "Rungs climbed: a repair that did not recover in time, and the action tried next. "
            f"The last rung pages a human ({c.REMEDIATION_FAILED_ALERT}).",
            "short",
            Query(
                increase(c.REMEDIATION_ESCALATIONS, f, f"{c.LABEL_FAILURE}, {c.LABEL_ACTION}"),
                "{{failure}} -> {{action}}",
            ),
            stacked=True,
            width=24,
        ),
    ]


def dashboard(t: Thresholds) -> DashboardSpec:
    """The *Remediation* dashboard, row by row."""
    return DashboardSpec(
        uid="trainguard-remediation",
        title="trainguard / Remediation",
        description="Alerts received, actions planned and executed, outcomes and approvals; "
        "the service's reliability: success rate, MTTR, time to detect, act and recover.",
        variables=remediation_variables(),
        # Reliability last: panel ids follow the order, and links to existing panels stay valid.
        rows=[("State", _state()), ("Flow", _flow()), ("Reliability", _reliability())],
    )
