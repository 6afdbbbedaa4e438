"""The registering side: the hook's rank registration and the shared client, against a live
service on a loopback socket and against one that cannot be reached."""

from __future__ import annotations

import logging
import time
from typing import Any

import pytest
import torch
from prometheus_client import CollectorRegistry
from torch import nn

import trainguard
from tests.discovery.conftest import Clock, listed
from tests.polling import wait_for
from tests.ports import free_port
from tests.remediation.conftest import TOKEN, rows
from trainguard import contract
from trainguard.discovery import Registration
from trainguard.events import EVENTS_LOGGER
from trainguard.remediation.settings import Settings

IDENTITY = {"job_id": "job-1", "rank": "0", "local_rank": "0", "node": "node-a"}
ERRORS = "trainguard_instrumentation_errors_total"


def train(steps: int = 3, **settings: Any) -> tuple[trainguard.Instrumentation, CollectorRegistry]:
    """A one-process job instrumented with ``settings``, after ``steps`` steps."""
    model = nn.Linear(8, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    registry = CollectorRegistry()
    handle = trainguard.instrument(
        model,
        optimizer,
        job_id="job-1",
        node="node-a",
        registry=registry,
        metrics_port=0,
        metrics_addr="127.0.0.1",
        **settings,
    )
    for _ in range(steps):
        optimizer.zero_grad()
        model(torch.ones(4, 8)).mean().backward()
        optimizer.step()
    handle.flush()
    return handle, registry


def errors(registry: CollectorRegistry, component: str = "discovery") -> float | None:
    return registry.get_sample_value(ERRORS, {**IDENTITY, "component": component})


def test_the_hook_registers_its_rank_renews_it_and_withdraws_it_on_uninstrument(
    service: str, settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(contract.ENV_REMEDIATION_TOKEN, TOKEN)
    monkeypatch.delenv(contract.ENV_FILE_SD_DIR, raising=False)
    handle, registry = train(discovery_url=service, discovery_ttl_seconds=3)
    target = f"127.0.0.1:{handle.metrics_port}"
    wait_for("the rank registered", lambda: target in listed(service))
    # The file_sd file's labels: the rank's identity.
    assert listed(service) == {target: IDENTITY}

    def renewed_at() -> float:
        ((value,),) = rows(settings, "SELECT renewed_at FROM discovery_targets")
        return float(value)

    first = renewed_at()
    wait_for("a renewal (every third of the TTL)", lambda: renewed_at() > first)
    assert errors(registry) == 0  # the series is there, at 0, before any failure
    handle.uninstrument()
    assert listed(service) == {}, "withdrawn at once, not left to expire"
    assert errors(registry) == 0


def test_a_renewal_brings_back_a_registration_the_service_lost(service: str, clock: Clock) -> None:
    registration = Registration(
        service, contract.DiscoveryKind.EXPORTERS, "node-a:9835", {"node": "node-a"},
        token=TOKEN, ttl_seconds=1.5,
    )  # fmt: skip
    registration.start()
    try:
        wait_for("registered", lambda: "node-a:9835" in listed(service, "exporters"))
        clock.advance(2)  # the service's clock: the registration has expired there
        assert listed(service, "exporters") == {}
        wait_for("renewed", lambda: "node-a:9835" in listed(service, "exporters"))
        assert registration.failures == 0
    finally:
        registration.stop()
    assert listed(service, "exporters") == {}


def test_an_unreachable_service_is_counted_and_training_goes_on(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger=EVENTS_LOGGER)
    started = time.monotonic()
    handle, registry = train(
        steps=0, discovery_url=f"http://127.0.0.1:{free_port()}", discovery_ttl_seconds=3
    )
    # The first registration and its retries (after 1 s) fail on the registration's thread.
    wait_for("two failures counted", lambda: (errors(registry) or 0) >= 2)
    model, optimizer = handle.model, handle.optimizer
    assert optimizer is not None
    for _ in range(3):
        optimizer.zero_grad()
        model(torch.ones(4, 8)).mean().backward()
        optimizer.step()
    handle.flush()
    assert registry.get_sample_value("trainguard_steps_total", IDENTITY) == 3
    before = errors(registry) or 0
    handle.uninstrument()  # its deregistration fails too, and is counted, not raised
    assert (errors(registry) or 0) > before
    assert time.monotonic() - started < 60
    logged = [
        r.getMessage() for r in caplog.records if "trainguard discovery failed" in r.getMessage()
    ]
    assert len(logged) == 1, "logged once, then only counted"
    assert "Connection refused" in logged[0]


def test_a_refusal_is_counted_with_the_service_s_reason(
    service: str, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    caplog.set_level(logging.WARNING, logger=EVENTS_LOGGER)
    monkeypatch.setenv(contract.ENV_REMEDIATION_TOKEN, "not-the-token")
    handle, registry = train(steps=1, discovery_url=service)
    wait_for("the refusal counted", lambda: (errors(registry) or 0) >= 1)
    handle.uninstrument()
    assert listed(service) == {}
    (logged,) = [r.getMessage() for r in caplog.records if "discovery failed" in r.getMessage()]
    assert "answered 401" in logged and "bearer token" in logged


@pytest.mark.parametrize("ttl", ["soon", "0.5"])
def test_a_ttl_that_cannot_work_is_counted_and_nothing_registers(
    service: str, ttl: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(contract.ENV_REMEDIATION_TOKEN, TOKEN)
    monkeypatch.setenv(contract.ENV_DISCOVERY_TTL, ttl)
    handle, registry = train(steps=2, discovery_url=service)
    assert errors(registry) == 1
    assert registry.get_sample_value("trainguard_steps_total", IDENTITY) == 2
    handle.uninstrument()
    assert listed(service) == {}


def test_discovery_is_off_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(contract.ENV_DISCOVERY_URL, raising=False)
    handle, registry = train(steps=1)
    assert handle.config.resolved_discovery_url() is None
    assert errors(registry) is None  # no discovery series: nothing registers
    handle.uninstrument()
