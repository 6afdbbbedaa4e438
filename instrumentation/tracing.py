"""OpenTelemetry spans for training steps and gradient syncs, built off the training thread.

Every rank derives the trace id from ``(job_id, step)``, so the spans of one step from every
rank land in ONE trace without any communication; rank 0 also emits the step's root span,
whose span id every rank derives the same way. Spans are created after the fact by the
worker thread with explicit start and end timestamps recorded by the training thread.

The tracer provider is our own (never the global one) because the root span's id must be
chosen by us: :class:`DerivedIdGenerator` hands out a derived id when one is pending and a
random one otherwise. Exports go through :class:`CountingSpanExporter` so an unreachable
collector costs a bounded queue and a counter, nothing more.
"""

from __future__ import annotations

import hashlib
import logging
import os
from collections.abc import Sequence

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult
from opentelemetry.sdk.trace.id_generator import IdGenerator, RandomIdGenerator
from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags
from prometheus_client.metrics import Counter

logger = logging.getLogger("trainguard.instrumentation")

# Bounded export queue: with the collector down, at most this many spans are held.
MAX_QUEUED_SPANS = 4096
EXPORT_TIMEOUT_SECONDS = 5.0


def _derive(nbytes: int, *parts: object) -> int:
    digest = hashlib.blake2b(
        "\x1f".join(str(part) for part in parts).encode(), digest_size=nbytes
    ).digest()
    return int.from_bytes(digest, "big") or 1  # 0 is the invalid id


def trace_id_for(job_id: str, step: int) -> int:
    """The trace id shared by every rank's spans of ``step``."""
    return _derive(16, "trace", job_id, step)


def root_span_id_for(job_id: str, step: int) -> int:
    """The span id of the step's root span (emitted by rank 0, parent of every rank's spans)."""
    return _derive(8, "root", job_id, step)


def rank_span_id_for(job_id: str, step: int, rank: int) -> int:
    """The span id of ``rank``'s span of ``step`` (what its logs of that step point at)."""
    return _derive(8, "rank", job_id, step, rank)


def format_trace_id(trace_id: int) -> str:
    return f"{trace_id:032x}"


def format_span_id(span_id: int) -> str:
    return f"{span_id:016x}"


class DerivedIdGenerator(IdGenerator):
    """Random ids, except the one pending id set just before a span is started.

    Only the worker thread starts spans on our provider, so a plain attribute suffices.
    """

    def __init__(self) -> None:
        self._random = RandomIdGenerator()
        self.pending_trace_id: int | None = None
        self.pending_span_id: int | None = None

    def generate_trace_id(self) -> int:
        value, self.pending_trace_id = self.pending_trace_id, None
        return value if value is not None else self._random.generate_trace_id()

    def generate_span_id(self) -> int:
        value, self.pending_span_id = self.pending_span_id, None
        return value if value is not None else self._random.generate_span_id()


class CountingSpanExporter(SpanExporter):
    """Wraps an exporter; spans of a failed export are counted as dropped, never retried here."""

    def __init__(self, inner: SpanExporter, dropped: Counter) -> None:
        self._inner = inner
        self._dropped = dropped

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        try:
            result = self._inner.export(spans)
        except Exception:
            result = SpanExportResult.FAILURE
        if result is not SpanExportResult.SUCCESS:
            self._dropped.inc(len(spans))
        return result

    def shutdown(self) -> None:
        self._inner.shutdown()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return self._inner.force_flush(timeout_millis)


def default_exporter() -> SpanExporter:
    """OTLP over HTTP, configured by the standard ``OTEL_EXPORTER_OTLP_*`` variables."""
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    timeout = float(os.environ.get("OTEL_EXPORTER_OTLP_TIMEOUT", EXPORT_TIMEOUT_SECONDS))
    return OTLPSpanExporter(timeout=timeout)


def build_provider(
    resource_attributes: dict[str, str | int],
    exporter: SpanExporter,
    dropped: Counter,
) -> tuple[TracerProvider, DerivedIdGenerator]:
    ids = DerivedIdGenerator()
    service = os.environ.get("OTEL_SERVICE_NAME", "trainguard-training")
    resource = Resource.create({"service.name": service, **resource_attributes})
    provider = TracerProvider(resource=resource, id_generator=ids)
    provider.add_span_processor(
        BatchSpanProcessor(
            CountingSpanExporter(exporter, dropped),
            max_queue_size=MAX_QUEUED_SPANS,
            schedule_delay_millis=1000,
            export_timeout_millis=int(EXPORT_TIMEOUT_SECONDS * 1000),
        )
    )
    return provider, ids


def remote_parent(trace_id: int, span_id: int) -> Context:
    """A context whose parent is the (possibly remote) span ``span_id`` of ``trace_id``."""
    parent = SpanContext(
        trace_id=trace_id,
        span_id=span_id,
        is_remote=True,
        trace_flags=TraceFlags(TraceFlags.SAMPLED),
    )
    return trace.set_span_in_context(NonRecordingSpan(parent))
