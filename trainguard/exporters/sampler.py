"""The exporter's sampler: reads every collector on an interval; scrapes serve its last reading.

As dcgm-exporter does with its collect interval, reading the hardware is decoupled from
scraping. Every ``interval`` seconds a daemon thread renders the exporter's registry once
(prometheus_client's ``generate_latest``; the registry's :class:`ScrapeSupervisor` runs each
collector within its timeout), compresses it once, and keeps the result as the current
:class:`~trainguard.exporters.serving.Exposition`. A scrape copies those bytes: it never calls
NVML, never runs a collector and never waits for a sample. :meth:`Sampler.start` takes the first
sample on the caller's thread, so the exporter has data before its server accepts a connection
and its first scrape is as fast as the others.

The age of the served data is ``time() - trainguard_exporter_last_sample_timestamp_seconds`` in
PromQL. A timestamp, not an age gauge: it is written once per sample, so the served bytes stay
the same between samples and a scrape does no work, where an age would have to be computed and
the body rendered and compressed again at every scrape. Alerting on it needs no per-scrape work
either (node_exporter's ``node_textfile_mtime_seconds`` and the Pushgateway's
``push_time_seconds`` are read the same way).

A sample that raises anyway (a bug outside the collectors, which the supervisor guards) is
logged and the previous exposition stays served, its timestamp ageing.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry
from prometheus_client.metrics_core import Metric

from trainguard import contract
from trainguard.background import BackgroundThread
from trainguard.exporters.serving import Exposition
from trainguard.prometheus_families import gauge_family

log = logging.getLogger(__name__)


class Sampler(BackgroundThread):
    """Renders ``registry`` every ``interval`` seconds and keeps the last rendering.

    It registers itself with ``registry`` to export the time of each sample (``clock``, Unix
    time), so that time is part of the bytes it renders.
    """

    def __init__(
        self,
        registry: CollectorRegistry,
        interval: float,
        *,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if interval <= 0:
            raise ValueError(f"sample interval must be positive, got {interval}")
        super().__init__("trainguard-exporter-sampler")
        self.interval = interval
        self._registry = registry
        self._clock = clock
        self._lock = threading.Lock()
        self._sampled_at = 0.0
        self._current: Exposition | None = None
        self._started = False
        registry.register(self)

    def describe(self) -> Iterator[Metric]:
        yield gauge_family(contract.EXPORTER_LAST_SAMPLE_TIMESTAMP)

    def collect(self) -> Iterator[Metric]:
        yield gauge_family(contract.EXPORTER_LAST_SAMPLE_TIMESTAMP, value=self._sampled_at)

    def sample(self) -> Exposition:
        """Read every collector now and serve the result from now on."""
        with self._lock:
            self._sampled_at = self._clock()
            exposition = Exposition.render(self._registry)
            self._current = exposition
        return exposition

    def current(self) -> Exposition:
        """The last sample's exposition: what a scrape serves."""
        exposition = self._current
        if exposition is None:
            raise RuntimeError("no sample taken yet: start() the sampler first")
        return exposition

    def start(self) -> None:
        """Take the first sample now, on this thread, then one every interval on a thread."""
        if self._started:
            raise RuntimeError("the sampler is already started")
        self._started = True
        self.sample()
        super().start()

    def run(self) -> None:
        due = time.monotonic() + self.interval
        while not self.sleep(due - time.monotonic()):
            try:
                self.sample()
            except Exception:
                log.exception("sampling failed; the previous sample is still served")
            # A sample longer than the interval delays the next one rather than queueing more.
            due = max(due + self.interval, time.monotonic())

    def close(self) -> None:
        """Stop sampling; the last exposition is still served. A sample under way finishes
        first (its collectors are bounded by their timeout)."""
        self.stop()
