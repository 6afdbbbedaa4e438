"""Collector registration and the wrapper that runs every enabled collector at each scrape.

A collector module registers a factory under its name with :func:`register`; importing
``trainguard.exporters.collectors`` imports them all. The command line turns each name into
``--collector.NAME`` / ``--no-collector.NAME`` (and ``TRAINGUARD_EXPORTER_COLLECTOR_NAME=0|1``).

:class:`ScrapeSupervisor` is the one object registered with prometheus_client. At each scrape
it runs the collectors one by one, times them, and turns an exception into
``trainguard_exporter_collector_success{collector} 0`` while keeping the families the collector
yielded before it failed: one collector failing never fails the scrape.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Generic, Protocol, TypeVar

from prometheus_client.core import GaugeMetricFamily, InfoMetricFamily
from prometheus_client.metrics_core import Metric

from trainguard import __version__, contract
from trainguard.exporters.procs import HostSource, ProcessScan, ProcessSource
from trainguard.exporters.provider import GpuFailure, GpuProvider, GpuSample
from trainguard.prometheus_families import gauge_family, info_family

log = logging.getLogger(__name__)

T = TypeVar("T")


class NodeCollector(Protocol):
    """A prometheus_client collector (``collect`` and ``describe``) that may hold resources."""

    def collect(self) -> Iterable[Metric]: ...

    def describe(self) -> Iterable[Metric]: ...

    def close(self) -> None: ...


@dataclass
class ExporterSettings:
    hostname: str = ""
    dcgm_compat: bool = False
    nccl_log_globs: tuple[str, ...] = ()
    # How often the follower process looks for new lines; None: at each scrape, in-process.
    nccl_poll_seconds: float | None = 1.0
    # /proc is scanned at most this often; environments rarely change during a run.
    process_scan_ttl_seconds: float = 15.0
    # The collectors of one scrape share one GPU reading.
    gpu_sample_ttl_seconds: float = 0.5


class TtlCache(Generic[T]):
    """One value (or the exception computing it raised), reused for ``ttl`` seconds."""

    def __init__(self, compute: Callable[[], T], ttl: float) -> None:
        self._compute = compute
        self._ttl = ttl
        self._lock = threading.Lock()
        self._at = -float("inf")
        self._value: T | None = None
        self._error: Exception | None = None

    def get(self) -> T:
        with self._lock:
            now = time.monotonic()
            if now - self._at >= self._ttl:
                self._at = now
                try:
                    self._value, self._error = self._compute(), None
                except Exception as error:  # re-raised to every caller until the next refresh
                    self._value, self._error = None, error
            if self._error is not None:
                # Dropping the old traceback keeps a long-failing source from growing it.
                raise self._error.with_traceback(None)
            assert self._value is not None
            return self._value


class ExporterContext:
    """What collectors share: the GPU provider, the process and host sources, the settings.

    GPU samples are cached for a fraction of a second so the collectors of one scrape see the
    same readings and NVML is asked once per scrape.
    """

    def __init__(
        self,
        provider: GpuProvider,
        processes: ProcessSource,
        host: HostSource,
        settings: ExporterSettings | None = None,
    ) -> None:
        self.provider = provider
        self.processes = processes
        self.host = host
        self.settings = settings or ExporterSettings()
        self._samples = TtlCache(provider.sample, ttl=self.settings.gpu_sample_ttl_seconds)
        self._scan = TtlCache(processes.scan, ttl=self.settings.process_scan_ttl_seconds)

    def gpu_samples(self) -> list[GpuSample | GpuFailure]:
        return self._samples.get()

    def process_scan(self) -> ProcessScan:
        return self._scan.get()


CollectorFactory = Callable[[ExporterContext], NodeCollector]


@dataclass(frozen=True)
class CollectorSpec:
    name: str
    help: str
    factory: CollectorFactory
    enabled_by_default: bool = True


_COLLECTORS: dict[str, CollectorSpec] = {}


def register(
    name: str, help_text: str, *, enabled_by_default: bool = True
) -> Callable[[CollectorFactory], CollectorFactory]:
    """Register a collector factory under ``name`` (a decorator)."""

    def decorate(factory: CollectorFactory) -> CollectorFactory:
        if name in _COLLECTORS:
            raise ValueError(f"collector {name!r} registered twice")
        _COLLECTORS[name] = CollectorSpec(name, help_text, factory, enabled_by_default)
        return factory

    return decorate


def registered() -> Mapping[str, CollectorSpec]:
    import trainguard.exporters.collectors  # noqa: F401  (importing registers them)

    return dict(_COLLECTORS)


@dataclass(eq=False)  # registries key collectors by identity
class ScrapeSupervisor:
    """Runs each collector at every scrape and reports its duration and success."""

    collectors: Mapping[str, NodeCollector]
    provider_kind: str
    clock: Callable[[], float] = time.perf_counter
    _failing: set[str] = field(default_factory=set)

    def _own_families(self) -> tuple[InfoMetricFamily, GaugeMetricFamily, GaugeMetricFamily]:
        return (
            info_family(contract.EXPORTER_INFO),
            gauge_family(contract.EXPORTER_COLLECTOR_DURATION),
            gauge_family(contract.EXPORTER_COLLECTOR_SUCCESS),
        )

    def describe(self) -> Iterator[Metric]:
        for collector in self.collectors.values():
            yield from collector.describe()
        yield from self._own_families()

    def collect(self) -> Iterator[Metric]:
        info, duration, success = self._own_families()
        info.add_metric([self.provider_kind, __version__], {})
        families: list[Metric] = []
        for name, collector in self.collectors.items():
            start = self.clock()
            ok = True
            try:
                for family in collector.collect():
                    families.append(family)
            except Exception as error:
                ok = False
                if name not in self._failing:  # log the change, not every scrape
                    log.warning("collector %s failed: %s", name, error)
                    log.debug("collector %s failure", name, exc_info=True)
                self._failing.add(name)
            else:
                if name in self._failing:
                    log.info("collector %s recovered", name)
                self._failing.discard(name)
            duration.add_metric([name], self.clock() - start)
            success.add_metric([name], 1.0 if ok else 0.0)
        yield from families
        yield info
        yield duration
        yield success

    def close(self) -> None:
        for collector in self.collectors.values():
            collector.close()
