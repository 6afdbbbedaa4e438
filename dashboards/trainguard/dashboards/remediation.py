"""Remediation: alerts received, actions planned and executed, outcomes, approvals."""

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


def dashboard() -> DashboardSpec:
    """The *Remediation* dashboard, row by row."""
    return DashboardSpec(
        uid="trainguard-remediation",
        title="trainguard / Remediation",
        description="Alerts received, actions planned and executed, outcomes and approvals.",
        variables=remediation_variables(),
        rows=[("State", _state()), ("Flow", _flow())],
    )
