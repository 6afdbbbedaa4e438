"""The rank's Prometheus metrics, created from the contract on a registry that is passed in.

Children are bound to the rank's identity labels once, at creation, so an observation on the
hot path is a single method call with no label lookup.

The families are sized to ``contract.RANK_SERIES_BUDGET``: the histograms of
``contract.BUCKETED_HISTOGRAMS`` keep a few buckets chosen from measured step times, those of
``contract.DETAIL_HISTOGRAMS`` keep their buckets only with ``detail`` on (else a summary
without quantiles: the same ``_sum`` and ``_count``), and prometheus_client's ``_created``
series, which Prometheus would store as one more series per counter and histogram child and
nothing reads, are switched off.
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Callable, Iterable
from typing import TypeVar

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    Info,
    Summary,
    disable_created_metrics,
)
from prometheus_client.core import CounterMetricFamily, Metric
from prometheus_client.registry import Collector

from trainguard import contract
from trainguard.contract import MetricSpec
from trainguard.prometheus_families import counter_family

# Step times measured and published (docs/instrumentation.md#buckets): 4 ms (a tiny FSDP2 step
# here) to some 30 s (a 175B-parameter model's step on 1,024 GPUs); a bucket per factor of 4-5.
# Steps, phases, compute and sync wait share them. +Inf is added by prometheus_client.
STEP_BUCKETS: tuple[float, ...] = (0.005, 0.025, 0.1, 0.5, 2.5, 10.0, 60.0)
# Collectives of a step (a gradient sync, FSDP's all-gathers): 1 ms to tens of seconds.
COLLECTIVE_BUCKETS: tuple[float, ...] = (0.001, 0.005, 0.025, 0.1, 0.5, 2.5, 10.0)


M = TypeVar("M", bound=Collector)
# The metrics last created on each registry, so that instrumenting it again can replace them.
_LATEST: weakref.WeakKeyDictionary[CollectorRegistry, RankMetrics] = weakref.WeakKeyDictionary()


def _labelnames(spec: MetricSpec) -> tuple[str, ...]:
    return contract.RANK_IDENTITY_LABELS + spec.labels


class RankMetrics:
    """Every metric a training rank exports, bound to that rank's identity."""

    def __init__(
        self, registry: CollectorRegistry, identity: dict[str, str], detail: bool = False
    ) -> None:
        # prometheus_client's own switch, process-wide: Prometheus (2.x, text format) stores
        # each _created sample as a series of its own, one per counter and histogram child.
        disable_created_metrics()
        self.registry = registry
        self.detail = detail
        self.identity = identity
        self._registered: list[Collector] = []
        self.released = False
        previous = _LATEST.get(registry)
        if previous is not None and previous.released:
            # The registry was instrumented before (prometheus' global one, say) and that
            # handle is gone: its metrics make way for these.
            previous.unregister()
        _LATEST[registry] = self

        def kept(metric: M) -> M:
            self._registered.append(metric)
            return metric

        def counter(spec: MetricSpec) -> Counter:
            return kept(
                Counter(spec.client_name, spec.documentation, _labelnames(spec), registry=registry)
            )

        def gauge(spec: MetricSpec) -> Gauge:
            return kept(
                Gauge(spec.client_name, spec.documentation, _labelnames(spec), registry=registry)
            )

        def histogram(spec: MetricSpec, buckets: tuple[float, ...] = STEP_BUCKETS) -> Histogram:
            return kept(
                Histogram(
                    spec.client_name,
                    spec.documentation,
                    _labelnames(spec),
                    registry=registry,
                    buckets=buckets,
                )
            )

        def detailed(spec: MetricSpec) -> Histogram | Summary:
            if detail:
                return histogram(spec)
            return kept(
                Summary(spec.client_name, spec.documentation, _labelnames(spec), registry=registry)
            )

        self.instrumentation_errors = counter(contract.INSTRUMENTATION_ERRORS)
        self.steps = counter(contract.STEPS).labels(**identity)
        self.step_duration = histogram(contract.STEP_DURATION).labels(**identity)
        phases = detailed(contract.STEP_PHASE_DURATION)
        self.phase_duration = {
            phase: phases.labels(**identity, **{contract.LABEL_PHASE: phase.value})
            for phase in contract.Phase
        }
        self.compute_duration = detailed(contract.STEP_COMPUTE_DURATION).labels(**identity)
        self.sync_wait_duration = detailed(contract.SYNC_WAIT_DURATION).labels(**identity)
        self.compute_share = gauge(contract.STEP_COMPUTE_SHARE).labels(**identity)
        self.last_step_timestamp = gauge(contract.LAST_STEP_TIMESTAMP).labels(**identity)
        self.training_step = gauge(contract.TRAINING_STEP).labels(**identity)
        self.world_size = gauge(contract.WORLD_SIZE).labels(**identity)
        self.rank_index = gauge(contract.RANK_INDEX).labels(**identity)
        self.elastic_restarts = gauge(contract.ELASTIC_RESTARTS).labels(**identity)
        self.grad_sync_duration = histogram(contract.GRAD_SYNC_DURATION, COLLECTIVE_BUCKETS).labels(
            **identity
        )
        self.grad_sync_bytes = counter(contract.GRAD_SYNC_BYTES).labels(**identity)
        self.param_gather_duration = histogram(
            contract.PARAM_GATHER_DURATION, COLLECTIVE_BUCKETS
        ).labels(**identity)
        self.collective_inflight = gauge(contract.COLLECTIVE_INFLIGHT).labels(**identity)
        self.collective_oldest_inflight = gauge(contract.COLLECTIVE_OLDEST_INFLIGHT).labels(
            **identity
        )
        self.collective_timeouts = counter(contract.COLLECTIVE_TIMEOUTS).labels(**identity)
        self.collective_stalls = counter(contract.COLLECTIVE_STALLS).labels(**identity)
        self.memory_allocated = gauge(contract.MEMORY_ALLOCATED).labels(**identity)
        self.memory_reserved = gauge(contract.MEMORY_RESERVED).labels(**identity)
        self.memory_capacity = gauge(contract.MEMORY_CAPACITY).labels(**identity)
        self.memory_fragmentation = gauge(contract.MEMORY_FRAGMENTATION).labels(**identity)
        self.memory_alloc_retries = counter(contract.MEMORY_ALLOC_RETRIES).labels(**identity)
        self.oom_events = counter(contract.OOM_EVENTS).labels(**identity)
        self.oom_recoveries = counter(contract.OOM_RECOVERIES).labels(**identity)
        self.spans_dropped = counter(contract.SPANS_DROPPED).labels(**identity)
        self.rank_info = kept(
            Info(
                contract.RANK_INFO.client_name,
                contract.RANK_INFO.documentation,
                contract.RANK_IDENTITY_LABELS,
                registry=registry,
            )
        ).labels(**identity)

    def release(self) -> None:
        """The handle is gone. The metrics stay readable (what uninstrument counted last, such
        as spans dropped at shutdown, included) until the registry is instrumented again."""
        self.released = True

    def unregister(self) -> None:
        """Take these metrics out of the registry."""
        for metric in self._registered:
            with contextlib.suppress(KeyError):  # already taken out
                self.registry.unregister(metric)
        self._registered.clear()


CollectiveProgress = Callable[[], "tuple[int, int] | None"]


class CollectiveProgressCollector(Collector):
    """``collectives_launched_total`` / ``collectives_completed_total``, read at scrape time.

    The numbers are the rank's collective sequence numbers as torch's Flight Recorder keeps
    them (``pg_status``), so nothing is counted on the training thread. ``read`` returns
    ``(launched, completed)`` or ``None`` when unknown; a failing read yields no samples
    and is counted, it never fails the scrape.
    """

    def __init__(
        self,
        identity: dict[str, str],
        read: CollectiveProgress,
        on_error: Callable[[BaseException], None],
    ) -> None:
        self._identity = identity
        self._read = read
        self._on_error = on_error

    def _families(self) -> tuple[CounterMetricFamily, CounterMetricFamily]:
        labels = list(self._identity)
        return (
            counter_family(contract.COLLECTIVES_LAUNCHED, labels=labels),
            counter_family(contract.COLLECTIVES_COMPLETED, labels=labels),
        )

    def describe(self) -> Iterable[Metric]:
        return self._families()

    def collect(self) -> Iterable[Metric]:
        launched, completed = self._families()
        try:
            progress = self._read()
        except Exception as error:
            self._on_error(error)
            progress = None
        if progress is not None:
            values = list(self._identity.values())
            launched.add_metric(values, progress[0])
            completed.add_metric(values, progress[1])
        return (launched, completed)
