"""The sampler and the served exposition: scrapes read memory, hung collectors are left behind.

In-process, over real HTTP on 127.0.0.1. No test depends on how fast anything runs: timeouts
are seconds long, and whatever happens on another thread is polled for with a deadline.
"""

from __future__ import annotations

import gzip
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Protocol
from wsgiref.simple_server import WSGIServer

import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families

from tests.exporters.conftest import Samples, make_context, one, values
from trainguard import contract
from trainguard.exporters.collectors.gpu import GpuCollector
from trainguard.exporters.collectors.gpu_process import GpuProcessCollector
from trainguard.exporters.fake import FakeProvider
from trainguard.exporters.provider import GpuFailure, GpuSample
from trainguard.exporters.registry import NodeCollector, ScrapeSupervisor
from trainguard.exporters.sampler import Sampler
from trainguard.exporters.serving import (
    PROMETHEUS_SCRAPE_ACCEPT,
    metrics_server,
    serve_in_background,
)

DEADLINE_SECONDS = 30.0
# Long enough that a healthy collector never reaches it, even on a loaded 2-core machine.
TIMEOUT_SECONDS = 2.0
SUCCESS = contract.EXPORTER_COLLECTOR_SUCCESS.name
TIMEOUTS = contract.EXPORTER_COLLECTOR_TIMEOUTS.name
DURATION = contract.EXPORTER_COLLECTOR_DURATION.name
STAMP = contract.EXPORTER_LAST_SAMPLE_TIMESTAMP.name


@dataclass
class HangingProvider(FakeProvider):
    """A fake provider whose ``sample()`` blocks while ``hanging``, as NVML does when a GPU
    falls off the bus, until ``release`` is set."""

    hanging: bool = False
    release: threading.Event = field(default_factory=threading.Event)

    def sample(self) -> list[GpuSample | GpuFailure]:
        if self.hanging:
            self.release.wait()
        return super().sample()


class Ticking:
    """A collector whose one gauge counts its reads: it shows whether a sample read it."""

    def __init__(self) -> None:
        self.reads = 0

    def describe(self) -> Iterator[Metric]:
        yield GaugeMetricFamily("trainguard_test_reads", "Reads.")

    def collect(self) -> Iterator[Metric]:
        self.reads += 1
        yield GaugeMetricFamily("trainguard_test_reads", "Reads.", value=self.reads)

    def close(self) -> None:
        """Nothing held."""


@dataclass
class Served:
    """A supervisor, a sampler and a server on 127.0.0.1, as the exporter wires them."""

    supervisor: ScrapeSupervisor
    sampler: Sampler
    url: str

    def get(self, path: str = "/metrics", **headers: str) -> tuple[int, dict[str, str], bytes]:
        request = urllib.request.Request(self.url + path, headers=headers)
        try:
            with urllib.request.urlopen(request, timeout=DEADLINE_SECONDS) as response:
                return response.status, dict(response.headers), response.read()
        except urllib.error.HTTPError as error:
            return error.code, dict(error.headers), error.read()

    def scrape(self) -> Samples:
        status, _, body = self.get()
        assert status == 200
        out: Samples = {}
        for family in text_string_to_metric_families(body.decode()):
            for sample in family.samples:
                out[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
        return out


class Serve(Protocol):
    def __call__(
        self, collectors: dict[str, NodeCollector], interval: float = 3600.0
    ) -> Served: ...


@pytest.fixture
def serve() -> Iterator[Serve]:
    """Starts a :class:`Served` exporter; every one started is stopped after the test."""
    started: list[tuple[Served, WSGIServer]] = []

    def start(collectors: dict[str, NodeCollector], interval: float = 3600.0) -> Served:
        supervisor = ScrapeSupervisor(collectors, "fake", timeout=TIMEOUT_SECONDS)
        registry = CollectorRegistry()
        registry.register(supervisor)
        sampler = Sampler(registry, interval)
        server = metrics_server(sampler.current, "127.0.0.1", 0)
        sampler.start()
        serve_in_background(server)
        served = Served(supervisor, sampler, f"http://127.0.0.1:{server.server_address[1]}")
        started.append((served, server))
        return served

    yield start
    for served, server in started:
        server.shutdown()
        server.server_close()
        served.sampler.close()


def poll(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + DEADLINE_SECONDS
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def test_a_scrape_serves_the_last_sample_and_never_calls_the_provider(serve: Serve) -> None:
    fake = FakeProvider(gpus=4)
    context = make_context(fake)
    exporter = serve({"gpu": GpuCollector(context), "gpu_process": GpuProcessCollector(context)})
    taken = fake.samples_taken
    assert taken >= 1  # the first sample, taken by start()
    bodies = {exporter.get()[2] for _ in range(20)}
    assert fake.samples_taken == taken, "a scrape called the provider"
    assert len(bodies) == 1, "scrapes between two samples serve the same bytes"
    samples = exporter.scrape()
    assert one(samples, contract.GPU_UP.name, gpu="1") == 1.0
    assert len(values(samples, contract.GPU_TEMPERATURE.name)) == 4

    fake.lost = {1}  # the GPU falls off the bus: unseen until the next sample
    assert one(exporter.scrape(), contract.GPU_UP.name, gpu="1") == 1.0
    assert fake.samples_taken == taken
    exporter.sampler.sample()
    assert fake.samples_taken > taken
    assert one(exporter.scrape(), contract.GPU_UP.name, gpu="1") == 0.0


def test_a_gzip_scrape_gets_the_same_sample_compressed(serve: Serve) -> None:
    exporter = serve({"gpu": GpuCollector(make_context(FakeProvider(gpus=2)))})
    _, headers, plain = exporter.get(accept=PROMETHEUS_SCRAPE_ACCEPT)
    assert headers["Content-Type"] == "text/plain; version=0.0.4; charset=utf-8"
    assert "Content-Encoding" not in headers
    status, headers, body = exporter.get(
        accept=PROMETHEUS_SCRAPE_ACCEPT, **{"accept-encoding": "gzip"}
    )
    assert status == 200 and headers["Content-Encoding"] == "gzip"
    assert gzip.decompress(body) == plain


def test_a_hung_collector_is_left_behind_counted_and_the_others_keep_updating(
    serve: Serve,
) -> None:
    provider = HangingProvider(gpus=2)
    context = make_context(provider)
    ticking = Ticking()
    exporter = serve(
        {"gpu": GpuCollector(context), "gpu_process": GpuProcessCollector(context), "tick": ticking}
    )
    assert one(exporter.scrape(), SUCCESS, collector="gpu") == 1.0

    provider.hanging = True
    for expected_reads in (2, 3, 4):
        exporter.sampler.sample()  # returns: the hung reads are abandoned after their timeout
        samples = exporter.scrape()
        assert one(samples, "trainguard_test_reads") == expected_reads
        assert one(samples, SUCCESS, collector="tick") == 1.0
        for name in ("gpu", "gpu_process"):  # both wait on the hung NVML reading
            assert one(samples, SUCCESS, collector=name) == 0.0
            assert one(samples, TIMEOUTS, collector=name) == expected_reads - 1
        assert one(samples, TIMEOUTS, collector="tick") == 0.0
        # Dropped, not kept: no GPU series while the GPUs give no answer.
        assert not values(samples, contract.GPU_TEMPERATURE.name)
        assert not values(samples, contract.NVML_UP.name)
    # The hung read's duration is how long it has been running, at least one timeout.
    assert one(samples, DURATION, collector="gpu") >= TIMEOUT_SECONDS
    stuck = [t for t in threading.enumerate() if t.name == "trainguard-collector-gpu"]
    assert len(stuck) == 1, "a hung collector is not started again while its read hangs"

    provider.hanging = False
    provider.release.set()

    def recovered() -> bool:
        exporter.sampler.sample()
        return one(exporter.scrape(), SUCCESS, collector="gpu") == 1.0

    poll(recovered, "the gpu collector to answer again")
    samples = exporter.scrape()
    assert one(samples, TIMEOUTS, collector="gpu") >= 3  # a counter: never goes back
    assert len(values(samples, contract.GPU_TEMPERATURE.name)) == 2


def test_the_sample_timestamp_ages_once_sampling_stops(serve: Serve) -> None:
    ticking = Ticking()
    exporter = serve({"tick": ticking}, interval=0.2)
    first = one(exporter.scrape(), STAMP)
    assert first <= time.time()
    poll(lambda: one(exporter.scrape(), STAMP) > first, "the sampler thread's next sample")

    exporter.sampler.close()
    stopped = exporter.scrape()
    stamp = one(stopped, STAMP)
    age = time.time() - stamp
    reads = one(stopped, "trainguard_test_reads")
    time.sleep(0.5)
    later = exporter.scrape()
    assert one(later, STAMP) == stamp
    assert one(later, "trainguard_test_reads") == reads
    assert time.time() - one(later, STAMP) >= age + 0.5  # time() - stamp: the age, growing


@pytest.mark.parametrize(
    ("path", "status"),
    [("/nonexistent", 404), ("/metrics/", 404), ("/favicon.ico", 404), ("/metricsx", 404)],
)
def test_only_the_metrics_path_serves_the_exposition(serve: Serve, path: str, status: int) -> None:
    exporter = serve({"tick": Ticking()})
    code, _, body = exporter.get(path)
    assert code == status
    assert b"trainguard_" not in body


def test_the_root_is_a_landing_page_linking_to_the_metrics(serve: Serve) -> None:
    exporter = serve({"tick": Ticking()})
    status, headers, body = exporter.get("/")
    assert status == 200
    assert headers["Content-Type"].startswith("text/html")
    assert b"href='/metrics'" in body
    assert b"trainguard_test_reads" not in body
    status, _, body = exporter.get("/metrics?name[]=trainguard_test_reads")
    assert status == 200 and b"trainguard_test_reads 1.0" in body  # query strings ignored


def test_a_sampler_serves_nothing_before_its_first_sample() -> None:
    sampler = Sampler(CollectorRegistry(), 5.0)
    with pytest.raises(RuntimeError, match="no sample"):
        sampler.current()
    with pytest.raises(ValueError, match="positive"):
        Sampler(CollectorRegistry(), 0)
    with pytest.raises(ValueError, match="positive"):
        ScrapeSupervisor({}, "fake", timeout=0)
