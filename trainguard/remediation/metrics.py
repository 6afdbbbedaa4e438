"""The service's Prometheus metrics, in a registry of its own (one per app instance)."""

from __future__ import annotations

import collections
import time
from collections.abc import Iterator

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import Metric
from prometheus_client.registry import Collector

from trainguard import contract
from trainguard.contract import Action
from trainguard.prometheus_families import gauge_family
from trainguard.remediation import inbox, incidents, queries
from trainguard.remediation.actions import failure_of
from trainguard.remediation.models import ActionState
from trainguard.remediation.policy import Policy
from trainguard.remediation.store import Store, StoreError

_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
_ACTION_BUCKETS = (0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 10.0, 30.0, 60.0, 120.0)
# Detection, action and recovery: from seconds (a directive) to hours (a human after a page).
# From the next moment (an idle decider) to minutes (a burst the decider works through).
_LAG_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0)
_INCIDENT_BUCKETS = (5.0, 15.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1200.0, 1800.0, 3600.0, 7200.0)


class StoreCollector(Collector):
    """Gauges read from the store at scrape time: actions by state, open breakers, dry-run,
    open incidents by failure, the inbox's depth, oldest wait and failures."""

    def __init__(self, store: Store, dry_run: bool) -> None:
        self._store = store
        self._dry_run = dry_run

    def describe(self) -> Iterator[Metric]:
        yield from self._families({}, 0)

    def collect(self) -> Iterator[Metric]:
        try:
            counts = self._store.read(queries.state_counts)
            breakers = len(self._store.read(queries.breakers))
            open_incidents = self._store.read(incidents.open_counts)
            lag = self._store.read(lambda conn: inbox.lag(conn, time.time()))
            failed = self._store.read(inbox.failed_count)
        except StoreError:
            return
        yield from self._families(counts, breakers, open_incidents, lag, failed)

    def _families(
        self,
        counts: dict[str, int],
        breakers: int,
        open_incidents: dict[str | None, int] | None = None,
        lag: tuple[int, float] = (0, 0.0),
        failed: int = 0,
    ) -> Iterator[Metric]:
        actions = gauge_family(contract.REMEDIATION_ACTIONS)
        for state in ActionState:
            actions.add_metric([state.value], counts.get(state.value, 0))
        yield actions
        yield gauge_family(contract.REMEDIATION_CIRCUIT_BREAKERS_OPEN, value=breakers)
        yield gauge_family(contract.REMEDIATION_DRY_RUN, value=int(self._dry_run))
        opened = gauge_family(contract.REMEDIATION_INCIDENTS_OPEN)
        found = dict(open_incidents or {})
        # Every failure at 0 from the start, and incidents of alerts outside the catalogue as "".
        for failure in contract.Failure:
            opened.add_metric([failure.value], found.pop(failure.value, 0))
        if found.get(None):
            opened.add_metric([""], found[None])
        yield opened
        depth, oldest = lag
        yield gauge_family(contract.REMEDIATION_INBOX_DEPTH, value=depth)
        yield gauge_family(contract.REMEDIATION_INBOX_OLDEST_AGE, value=oldest)
        yield gauge_family(contract.REMEDIATION_INBOX_FAILED, value=failed)


class Metrics:
    def __init__(self, store: Store, dry_run: bool) -> None:
        self.registry = CollectorRegistry()
        c = contract

        def counter(spec: contract.MetricSpec) -> Counter:
            return Counter(
                spec.client_name, spec.documentation, spec.labels, registry=self.registry
            )

        self.alerts_received = counter(c.REMEDIATION_ALERTS_RECEIVED)
        self.alerts_deduplicated = counter(c.REMEDIATION_ALERTS_DEDUPLICATED)
        self.webhook_rejected = counter(c.REMEDIATION_WEBHOOK_REJECTED)
        for reason in ("unauthorized", "too_large", "invalid", "unavailable"):
            # Present at 0 from the start, so rate() over rejections has data before one.
            self.webhook_rejected.labels(reason)
        self.decisions = counter(c.REMEDIATION_DECISIONS)
        self.actions_executed = counter(c.REMEDIATION_ACTIONS_EXECUTED)
        self.directive_acks = counter(c.REMEDIATION_DIRECTIVE_ACKS)
        self.webhook_duration = Histogram(
            c.REMEDIATION_WEBHOOK_DURATION.client_name,
            c.REMEDIATION_WEBHOOK_DURATION.documentation,
            buckets=_LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.decision_lag = Histogram(
            c.REMEDIATION_DECISION_LAG.client_name,
            c.REMEDIATION_DECISION_LAG.documentation,
            buckets=_LAG_BUCKETS,
            registry=self.registry,
        )
        self.action_duration = Histogram(
            c.REMEDIATION_ACTION_DURATION.client_name,
            c.REMEDIATION_ACTION_DURATION.documentation,
            c.REMEDIATION_ACTION_DURATION.labels,
            buckets=_ACTION_BUCKETS,
            registry=self.registry,
        )
        self.escalations = counter(c.REMEDIATION_ESCALATIONS)
        self.incidents = counter(c.REMEDIATION_INCIDENTS)
        self.incident_jobs = counter(c.REMEDIATION_INCIDENT_JOBS)
        self.time_to_detect, self.time_to_act, self.time_to_recover = (
            Histogram(
                spec.client_name,
                spec.documentation,
                spec.labels,
                buckets=_INCIDENT_BUCKETS,
                registry=self.registry,
            )
            for spec in (
                c.REMEDIATION_TIME_TO_DETECT,
                c.REMEDIATION_TIME_TO_ACT,
                c.REMEDIATION_TIME_TO_RECOVER,
            )
        )
        self.registry.register(StoreCollector(store, dry_run))

    def prime(self, policy: Policy) -> None:
        """Every incident series the policy can produce, at 0 from the start: ``increase()``
        over a counter that appears at 1 misses that first incident, and a dashboard panel of
        escalations would have no series until the first one."""
        for rule in policy.rules:
            failure = failure_of(rule.alert)
            repairs = [s.action for s in rule.actions if s.action is not Action.RECOMMEND]
            escalations = [s.action for s in rule.escalate]
            if failure is None or not (repairs or escalations):
                continue  # opens no incident
            for outcome in contract.IncidentOutcome:
                self.incidents.labels(failure.value, outcome.value)
            for job_outcome in contract.JobOutcome:
                self.incident_jobs.labels(failure.value, job_outcome.value)
            self.time_to_detect.labels(failure.value)
            for action in (*repairs, *escalations):
                self.time_to_act.labels(failure.value, action.value)
                self.time_to_recover.labels(failure.value, action.value)
            for action in escalations:
                self.escalations.labels(failure.value, action.value)

    def record_decisions(self, decisions: list[tuple[str, ActionState]]) -> None:
        # One increment per kind of decision: a notification's alerts mostly decide alike.
        for (action, state), count in collections.Counter(decisions).items():
            self.decisions.labels(action, state.value).inc(count)
