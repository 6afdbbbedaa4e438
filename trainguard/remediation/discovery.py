"""HTTP service discovery of ranks and node exporters, for clusters without a shared file system.

Each training rank (the hook) and each node exporter registers the address of its ``/metrics``
with its identity labels (``POST /v1/discovery/<kind>``, :class:`Registration`) and renews the
registration before its TTL runs out; a clean exit deregisters it (``DELETE``). Prometheus reads
each kind's live registrations through ``http_sd_configs`` (``GET /v1/discovery/<kind>``): the
documented HTTP SD format, a JSON list of ``{"targets": [...], "labels": {...}}`` groups. The
routes are in :mod:`trainguard.remediation.discovery_api`.

Registrations live in the store's ``discovery_targets`` table, one row per (kind, address), so
every replica sharing a Postgres database serves the same targets. A row whose ``expires_at``
has passed is never served, and each registration purges the expired rows. What one client can
register is bounded: sane label names and values (:class:`Registration`), and a most number of
live registrations per kind and per job (:class:`Limits`, the service's settings).
"""

from __future__ import annotations

import ipaddress
import json
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timezone

from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from pydantic import BaseModel, ConfigDict, Field, field_validator
from sqlalchemy import Connection, text

from trainguard import contract
from trainguard.discovery import DEFAULT_TTL_SECONDS, MIN_TTL_SECONDS
from trainguard.prometheus_families import gauge_family
from trainguard.remediation.settings import Settings
from trainguard.remediation.store import Store, StoreError

MAX_LABELS = 32
MAX_LABEL_NAME = 128
MAX_LABEL_VALUE = 256
# Prometheus' label names; those starting with __ are its own (__address__, __scheme__,
# __metrics_path__, __param_*) and would let a client redirect the scrape.
_LABEL_NAME = re.compile(rf"[a-zA-Z_][a-zA-Z0-9_]{{0,{MAX_LABEL_NAME - 1}}}")
# Set by Prometheus from the scrape job and the address.
_RESERVED_LABELS = frozenset({"job", "instance"})
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
# host:port with a DNS name, an IPv4 address or a bracketed IPv6 address.
_HOST = r"\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9_](?:[A-Za-z0-9_.-]{0,251}[A-Za-z0-9_])?"
_TARGET = re.compile(rf"(?P<host>{_HOST}):(?P<port>[0-9]{{1,5}})")


class Registration(BaseModel):
    """What a rank or an exporter registers: where Prometheus scrapes it, and its labels."""

    model_config = ConfigDict(extra="forbid")

    target: str = Field(
        max_length=262,
        description="host:port of the /metrics endpoint (a DNS name, IPv4, or [IPv6]).",
        examples=["node-7:9400"],
    )
    labels: dict[str, str] = Field(
        default_factory=dict,
        max_length=MAX_LABELS,
        description="Target labels: for a rank its identity (job_id, rank, local_rank, node), "
        "for an exporter its node.",
    )
    ttl_seconds: float = Field(
        default=DEFAULT_TTL_SECONDS,
        ge=MIN_TTL_SECONDS,
        allow_inf_nan=False,
        description="Seconds the registration lives unless renewed (at most the service's "
        "discovery_max_ttl_seconds).",
    )

    @field_validator("target")
    @classmethod
    def _host_and_port(cls, target: str) -> str:
        match = _TARGET.fullmatch(target)
        if match is None or not 1 <= int(match["port"]) <= 65535:
            raise ValueError(
                f"target {target[:80]!r} is not host:port (a DNS name, an IPv4 address or a "
                "bracketed IPv6 address, and a port 1-65535)"
            )
        host = match["host"]
        if host.startswith("["):
            try:
                ipaddress.IPv6Address(host[1:-1])
            except ValueError as exc:
                raise ValueError(f"target {target!r}: {exc}") from None
        return target

    @field_validator("labels")
    @classmethod
    def _sane_labels(cls, labels: dict[str, str]) -> dict[str, str]:
        for name, value in labels.items():
            if not _LABEL_NAME.fullmatch(name):
                raise ValueError(
                    f"label name {name[:80]!r} is not a Prometheus label name "
                    f"([a-zA-Z_][a-zA-Z0-9_]*, at most {MAX_LABEL_NAME} characters)"
                )
            if name.startswith("__") or name in _RESERVED_LABELS:
                raise ValueError(
                    f"label {name!r} is Prometheus' own (job, instance and __*) and cannot be "
                    "registered"
                )
            if len(value) > MAX_LABEL_VALUE or _CONTROL.search(value):
                raise ValueError(
                    f"the value of label {name!r} must be at most {MAX_LABEL_VALUE} characters "
                    "without control characters"
                )
        return labels


class Registered(BaseModel):
    """A registration as stored: renew it before ``expires_at``."""

    kind: contract.DiscoveryKind
    target: str
    expires_at: datetime


class TargetGroup(BaseModel):
    """One group of Prometheus' HTTP SD format (here one target, with its own labels)."""

    targets: list[str]
    labels: dict[str, str]


@dataclass(frozen=True)
class Limits:
    """The most live registrations one kind, and one job's ranks, may have."""

    max_targets: int
    max_targets_per_job: int
    max_ttl_seconds: float

    @classmethod
    def from_settings(cls, settings: Settings) -> Limits:
        return cls(
            max_targets=settings.discovery_max_targets,
            max_targets_per_job=settings.discovery_max_targets_per_job,
            max_ttl_seconds=settings.discovery_max_ttl_seconds,
        )


class LimitError(ValueError):
    """The registration would exceed a bound (the route answers 429)."""


_PURGE = text("DELETE FROM discovery_targets WHERE expires_at <= :now")
_COUNT_KIND = text(
    "SELECT COUNT(*) FROM discovery_targets WHERE kind = :kind AND target != :target"
)
_COUNT_JOB = text(
    "SELECT COUNT(*) FROM discovery_targets "
    "WHERE kind = :kind AND job_id = :job_id AND target != :target"
)
_UPSERT = text("""
    INSERT INTO discovery_targets (kind, target, job_id, labels, renewed_at, expires_at)
    VALUES (:kind, :target, :job_id, :labels, :now, :expires_at)
    ON CONFLICT (kind, target) DO UPDATE SET
        job_id = excluded.job_id, labels = excluded.labels,
        renewed_at = excluded.renewed_at, expires_at = excluded.expires_at
    """)
_DELETE = text("DELETE FROM discovery_targets WHERE kind = :kind AND target = :target")
_LIVE = text(
    "SELECT target, labels FROM discovery_targets "
    "WHERE kind = :kind AND expires_at > :now ORDER BY target"
)
_LIVE_COUNTS = text(
    "SELECT kind, COUNT(*) FROM discovery_targets WHERE expires_at > :now GROUP BY kind"
)


def check_registration(
    kind: contract.DiscoveryKind, registration: Registration, limits: Limits
) -> None:
    """What the model alone cannot check (it depends on the kind and the settings); raises
    ValueError with the reason."""
    if registration.ttl_seconds > limits.max_ttl_seconds:
        raise ValueError(
            f"ttl_seconds {registration.ttl_seconds:g} is over this service's "
            f"discovery_max_ttl_seconds ({limits.max_ttl_seconds:g})"
        )
    if kind is contract.DiscoveryKind.RANKS and not registration.labels.get(contract.LABEL_JOB_ID):
        raise ValueError(f"a rank registers with a non-empty {contract.LABEL_JOB_ID!r} label")


def register(
    conn: Connection, kind: contract.DiscoveryKind, registration: Registration, limits: Limits
) -> Registered:
    """Store (or renew) a registration, within the limits; a store unit.

    Raises :class:`LimitError` when a new target would exceed them (a renewal never does).
    """
    now = time.time()
    conn.execute(_PURGE, {"now": now})
    key = {"kind": kind.value, "target": registration.target}
    count = conn.execute(_COUNT_KIND, key).scalar_one()
    if count >= limits.max_targets:
        raise LimitError(
            f"{count} {kind.value} targets are registered, the most this service takes "
            f"(discovery_max_targets); {registration.target} is refused"
        )
    job_id = registration.labels.get(contract.LABEL_JOB_ID) or None
    if kind is contract.DiscoveryKind.RANKS:
        in_job = conn.execute(_COUNT_JOB, {**key, "job_id": job_id}).scalar_one()
        if in_job >= limits.max_targets_per_job:
            raise LimitError(
                f"job {job_id} has {in_job} ranks registered, the most this service takes "
                f"for one job (discovery_max_targets_per_job); {registration.target} is refused"
            )
    expires_at = now + registration.ttl_seconds
    conn.execute(
        _UPSERT,
        {
            **key,
            "job_id": job_id,
            "labels": json.dumps(registration.labels, sort_keys=True),
            "now": now,
            "expires_at": expires_at,
        },
    )
    return Registered(
        kind=kind,
        target=registration.target,
        expires_at=datetime.fromtimestamp(expires_at, tz=timezone.utc),
    )


def deregister(conn: Connection, kind: contract.DiscoveryKind, target: str) -> bool:
    """Remove a registration at once; whether there was one. A store unit."""
    return bool(conn.execute(_DELETE, {"kind": kind.value, "target": target}).rowcount)


def target_list(conn: Connection, kind: contract.DiscoveryKind) -> bytes:
    """The kind's live registrations in Prometheus' HTTP SD format, as JSON.

    Written from the stored label JSON without parsing it again: Prometheus asks for the
    whole list at every refresh, and a large cluster's list has thousands of targets.
    """
    rows = conn.execute(_LIVE, {"kind": kind.value, "now": time.time()}).all()
    groups = (f'{{"targets":[{json.dumps(target)}],"labels":{labels}}}' for target, labels in rows)
    return f"[{','.join(groups)}]".encode()


def live_counts(conn: Connection) -> dict[str, int]:
    """Live registrations by kind."""
    rows = conn.execute(_LIVE_COUNTS, {"now": time.time()}).all()
    return {kind: int(count) for kind, count in rows}


class TargetsCollector(Collector):
    """``trainguard_remediation_discovery_targets{kind}``, read from the store at scrape time."""

    def __init__(self, store: Store) -> None:
        self._store = store

    def describe(self) -> Iterator[Metric]:
        yield self._family({})

    def collect(self) -> Iterator[Metric]:
        try:
            counts = self._store.read(live_counts)
        except StoreError:
            return
        yield self._family(counts)

    @staticmethod
    def _family(counts: dict[str, int]) -> GaugeMetricFamily:
        family = gauge_family(contract.REMEDIATION_DISCOVERY_TARGETS)
        for kind in contract.DiscoveryKind:
            family.add_metric([kind.value], counts.get(kind.value, 0))
        return family
