"""Shared fixtures: a fake provider, made-up processes and hosts, and exposition helpers."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterable
from dataclasses import dataclass, field

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from trainguard.exporters.fake import FakeProvider
from trainguard.exporters.procs import HostFacts, ProcessScan, TrainingProcess
from trainguard.exporters.registry import (
    ExporterContext,
    ExporterSettings,
    NodeCollector,
    ScrapeSupervisor,
)


@dataclass
class StaticProcesses:
    processes: list[TrainingProcess] = field(default_factory=list)
    unreadable: int = 0
    scans: int = 0

    def scan(self) -> ProcessScan:
        self.scans += 1
        return ProcessScan(list(self.processes), self.unreadable)


@dataclass
class StaticHost:
    value: HostFacts = field(default_factory=HostFacts)

    def facts(self) -> HostFacts:
        return self.value


def rank_env(rank: int, local_rank: int, **extra: str) -> dict[str, str]:
    """The environment torchrun gives a worker, plus ``extra``."""
    env = {
        "RANK": str(rank),
        "LOCAL_RANK": str(local_rank),
        "WORLD_SIZE": "16",
        "LOCAL_WORLD_SIZE": "8",
        "TORCHELASTIC_RUN_ID": "llama-7b-run-42",
        "MASTER_ADDR": "10.12.0.7",
        "MASTER_PORT": "29500",
    }
    env.update(extra)
    return env


def well_configured(rank: int, local_rank: int) -> dict[str, str]:
    return rank_env(
        rank,
        local_rank,
        NCCL_DEBUG="INFO",
        NCCL_DEBUG_FILE="/var/log/nccl/%h.%p.log",
        NCCL_SOCKET_IFNAME="ib0",
        TORCH_FR_BUFFER_SIZE="2000",
    )


def make_context(
    provider: FakeProvider | None = None,
    processes: StaticProcesses | None = None,
    host: HostFacts | None = None,
    **settings: object,
) -> ExporterContext:
    config = ExporterSettings(
        hostname="gpu-node-07",
        process_scan_ttl_seconds=0.0,
        gpu_sample_ttl_seconds=0.0,
        nccl_poll_seconds=None,  # in-process: the child-process follower has its own test
    )
    for key, value in settings.items():
        setattr(config, key, value)
    return ExporterContext(
        provider or FakeProvider(),
        processes or StaticProcesses(),
        StaticHost(host or HostFacts()),
        config,
    )


def registry_of(
    collectors: dict[str, NodeCollector], provider_kind: str = "fake"
) -> tuple[CollectorRegistry, ScrapeSupervisor]:
    supervisor = ScrapeSupervisor(collectors, provider_kind, clock=_FixedClock())
    registry = CollectorRegistry()
    registry.register(supervisor)
    return registry, supervisor


class _FixedClock:
    """Each collector appears to take exactly 0.5 ms, so expositions are reproducible."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        self.now += 0.0005
        return self.now


Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def scrape(registry: CollectorRegistry) -> Samples:
    """Every sample of one scrape, keyed by (name, sorted labels)."""
    text = generate_latest(registry).decode()
    out: Samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return out


def values(
    samples: Samples, metric: str, /, **labels: str
) -> dict[tuple[tuple[str, str], ...], float]:
    """Samples of ``metric`` whose labels include ``labels``."""
    return {
        key[1]: value
        for key, value in samples.items()
        if key[0] == metric and all(dict(key[1]).get(k) == v for k, v in labels.items())
    }


def one(samples: Samples, metric: str, /, **labels: str) -> float:
    found = values(samples, metric, **labels)
    assert len(found) == 1, (metric, labels, found)
    return next(iter(found.values()))


def names(samples: Iterable[tuple[str, object]]) -> set[str]:
    return {key[0] for key in samples}


def require_binary(name: str) -> str:
    """The binary's path; skips without it unless TRAINGUARD_REQUIRE_BINARIES=1 (then fails)."""
    path = shutil.which(name)
    if path is None:
        if os.environ.get("TRAINGUARD_REQUIRE_BINARIES") == "1":
            pytest.fail(f"{name} is required (TRAINGUARD_REQUIRE_BINARIES=1) but not on PATH")
        pytest.skip(f"{name} not installed")
    return path


@pytest.fixture
def fake() -> FakeProvider:
    return FakeProvider(gpus=8)
