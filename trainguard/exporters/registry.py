"""Collector registration and the wrapper that runs every enabled collector at each sample.

A collector module registers a factory under its name with :func:`register`; importing
``trainguard.exporters.collectors`` imports them all. The command line turns each name into
``--collector.NAME`` / ``--no-collector.NAME`` (and ``TRAINGUARD_EXPORTER_COLLECTOR_NAME=0|1``).

:class:`ScrapeSupervisor` is the one object registered with prometheus_client; the sampler
(``trainguard.exporters.sampler``) collects it on an interval, never a scrape. It runs the
collectors one after the other, each on a daemon thread of its own, times them, and turns an
exception into ``trainguard_exporter_collector_success{collector} 0`` while keeping the
families the collector yielded before it failed: one collector failing never fails a sample.

A collector that gives no answer within ``timeout`` (an NVML call that never returns: a GPU
fallen off the bus) is abandoned: its thread is left to finish on its own, the sample goes on
without the collector's families, and ``trainguard_exporter_collector_timeouts_total`` counts
it. While that read still hangs the collector is not started again (one stuck thread per
collector at most) and each sample counts another timeout. Its families are dropped rather
than kept from its last good read: a GPU that stopped answering must not go on showing its
last temperature as if current, and Prometheus marks the dropped series stale at once.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Generic, Protocol, TypeVar

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, InfoMetricFamily
from prometheus_client.metrics_core import Metric

from trainguard import contract
from trainguard.exporters.app import DEFAULT_COLLECTOR_TIMEOUT_SECONDS
from trainguard.exporters.procs import HostSource, ProcessScan, ProcessSource
from trainguard.exporters.provider import GpuFailure, GpuProvider, GpuSample
from trainguard.prometheus_families import counter_family, gauge_family, info_family
from trainguard.version import VERSION

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
    # How often the follower process looks for new lines; None: at each sample, in-process.
    nccl_poll_seconds: float | None = 1.0
    # /proc is scanned at most this often; environments rarely change during a run.
    process_scan_ttl_seconds: float = 15.0
    # The collectors of one sample share one GPU reading.
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

    GPU samples are cached for a fraction of a second so the collectors of one sample see the
    same readings and NVML is asked once per sample.
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


@dataclass
class _Read:
    """One call of a collector's ``collect()``, made on a thread of its own."""

    started: float
    families: list[Metric] = field(default_factory=list)
    duration: float = 0.0
    error: Exception | None = None
    done: threading.Event = field(default_factory=threading.Event)


class _CollectorRunner:
    """Reads one collector on a fresh daemon thread per read, so a read that hangs can be left
    behind: the thread cannot be killed, but it never blocks the sampler nor the exit."""

    def __init__(self, name: str, collector: NodeCollector, clock: Callable[[], float]) -> None:
        self._name = name
        self._collector = collector
        self._clock = clock
        self._last: _Read | None = None

    def read(self, timeout: float) -> _Read | None:
        """This read, or ``None`` when it gave no answer within ``timeout`` or an earlier read
        left behind still hangs (then nothing new is started)."""
        if self._last is not None and not self._last.done.is_set():
            return None
        read = _Read(started=self._clock())
        self._last = read
        threading.Thread(
            target=self._run, args=(read,), name=f"trainguard-collector-{self._name}", daemon=True
        ).start()
        return read if read.done.wait(timeout) else None

    def running_for(self) -> float:
        """How long the read left behind has been running."""
        return 0.0 if self._last is None else self._clock() - self._last.started

    def _run(self, read: _Read) -> None:
        try:
            for family in self._collector.collect():
                read.families.append(family)
        except Exception as error:
            read.error = error
        read.duration = self._clock() - read.started
        read.done.set()


@dataclass(eq=False)  # registries key collectors by identity
class ScrapeSupervisor:
    """Runs each collector at every sample, each within ``timeout`` seconds, and reports its
    duration, success and timeouts."""

    collectors: Mapping[str, NodeCollector]
    provider_kind: str
    clock: Callable[[], float] = time.perf_counter
    timeout: float = DEFAULT_COLLECTOR_TIMEOUT_SECONDS
    _runners: dict[str, _CollectorRunner] = field(init=False)
    _timeouts: dict[str, int] = field(init=False)
    _status: dict[str, str] = field(init=False)  # ok, failed or timeout: logged when it changes
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def __post_init__(self) -> None:
        if self.timeout <= 0:
            raise ValueError(f"collector timeout must be positive, got {self.timeout}")
        self._runners = {
            name: _CollectorRunner(name, collector, self.clock)
            for name, collector in self.collectors.items()
        }
        self._timeouts = dict.fromkeys(self.collectors, 0)
        self._status = dict.fromkeys(self.collectors, "ok")

    def _own_families(
        self,
    ) -> tuple[InfoMetricFamily, GaugeMetricFamily, GaugeMetricFamily, CounterMetricFamily]:
        return (
            info_family(contract.EXPORTER_INFO),
            gauge_family(contract.EXPORTER_COLLECTOR_DURATION),
            gauge_family(contract.EXPORTER_COLLECTOR_SUCCESS),
            counter_family(contract.EXPORTER_COLLECTOR_TIMEOUTS),
        )

    def describe(self) -> Iterator[Metric]:
        for collector in self.collectors.values():
            yield from collector.describe()
        yield from self._own_families()

    def collect(self) -> Iterator[Metric]:
        with self._lock:  # one sample at a time: the runners and counts are shared
            return iter(self._sample())

    def _sample(self) -> list[Metric]:
        info, duration, success, timeouts = self._own_families()
        info.add_metric([self.provider_kind, VERSION], {})
        families: list[Metric] = []
        for name, runner in self._runners.items():
            read = runner.read(self.timeout)
            if read is None:
                self._timeouts[name] += 1
                elapsed, status = runner.running_for(), "timeout"
            else:
                families.extend(read.families)
                elapsed = read.duration
                status = "ok" if read.error is None else "failed"
            self._log_change(name, status, read)
            duration.add_metric([name], elapsed)
            success.add_metric([name], 1.0 if status == "ok" else 0.0)
            timeouts.add_metric([name], self._timeouts[name])
        return [*families, info, duration, success, timeouts]

    def _log_change(self, name: str, status: str, read: _Read | None) -> None:
        """Log when a collector starts failing, hangs or recovers; not at every sample."""
        if status == self._status[name]:
            return
        self._status[name] = status
        if status == "timeout":
            log.warning(
                "collector %s gave no answer within %.3g s: left running, its series left out",
                name,
                self.timeout,
            )
        elif status == "failed" and read is not None:
            log.warning("collector %s failed: %s", name, read.error)
            log.debug("collector %s failure", name, exc_info=read.error)
        else:
            log.info("collector %s recovered", name)

    def close(self) -> None:
        for collector in self.collectors.values():
            collector.close()
