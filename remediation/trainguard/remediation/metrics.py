"""The service's Prometheus metrics, in a registry of its own (one per app instance)."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import Metric
from prometheus_client.registry import Collector

from trainguard import contract
from trainguard.prometheus_families import gauge_family
from trainguard.remediation import queries
from trainguard.remediation.models import ActionState
from trainguard.remediation.store import Store, StoreError

_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
_ACTION_BUCKETS = (0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 10.0, 30.0, 60.0, 120.0)


class StoreCollector(Collector):
    """Gauges read from the store at scrape time: actions by state, open breakers, dry-run."""

    def __init__(self, store: Store, dry_run: bool) -> None:
        self._store = store
        self._dry_run = dry_run

    def describe(self) -> Iterator[Metric]:
        yield from self._families({}, 0)

    def collect(self) -> Iterator[Metric]:
        try:
            counts = self._store.read(queries.state_counts)
            breakers = len(self._store.read(queries.breakers))
        except StoreError:
            return
        yield from self._families(counts, breakers)

    def _families(self, counts: dict[str, int], breakers: int) -> Iterator[Metric]:
        actions = gauge_family(contract.REMEDIATION_ACTIONS)
        for state in ActionState:
            actions.add_metric([state.value], counts.get(state.value, 0))
        yield actions
        yield gauge_family(contract.REMEDIATION_CIRCUIT_BREAKERS_OPEN, value=breakers)
        yield gauge_family(contract.REMEDIATION_DRY_RUN, value=int(self._dry_run))


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
        self.action_duration = Histogram(
            c.REMEDIATION_ACTION_DURATION.client_name,
            c.REMEDIATION_ACTION_DURATION.documentation,
            c.REMEDIATION_ACTION_DURATION.labels,
            buckets=_ACTION_BUCKETS,
            registry=self.registry,
        )
        self.registry.register(StoreCollector(store, dry_run))

    def record_decisions(self, decisions: list[tuple[str, ActionState]]) -> None:
        for action, state in decisions:
            self.decisions.labels(action, state.value).inc()
