"""A rank's registration with the remediation service's HTTP service discovery.

Where Prometheus cannot read the ranks' ``file_sd`` files (no file system shared with it), the
hook registers the rank's ``/metrics`` address, with the same target labels its ``file_sd``
file carries, with the service named by ``TRAINGUARD_DISCOVERY_URL`` (``discovery_url=``), and
Prometheus reads the ranks from there (``http_sd_configs``). The registration is renewed on
its own daemon thread (:class:`trainguard.discovery.Registration`) and withdrawn by
``uninstrument()``; a rank that dies without it drops out when its TTL passes. Failures never
reach training: each is counted in ``trainguard_instrumentation_errors_total{component=
"discovery"}`` and logged once per kind of error (:class:`.errors.ErrorBudget`).
"""

from __future__ import annotations

import os

from prometheus_client import Counter

from trainguard import contract
from trainguard.discovery import Registration
from trainguard.instrumentation.errors import ErrorBudget

COMPONENT = "discovery"


def register_rank(
    url: str,
    target: str,
    labels: dict[str, str],
    ttl_seconds: float,
    errors: ErrorBudget,
    counter: Counter,
) -> Registration:
    """Start keeping ``target`` registered as a rank; ``counter`` is the errors counter, whose
    discovery series is made now so that its rate has data before a first failure."""
    counter.labels(**labels, component=COMPONENT)
    registration = Registration(
        url,
        contract.DiscoveryKind.RANKS,
        target,
        labels,
        token=os.environ.get(contract.ENV_REMEDIATION_TOKEN) or None,
        ttl_seconds=ttl_seconds,
        on_error=lambda error: errors.record(COMPONENT, error),
    )
    registration.start()
    return registration
