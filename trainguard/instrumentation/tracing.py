"""OpenTelemetry spans for training steps and gradient syncs, built off the training thread.

Every rank derives the trace id from ``(job_id, step)``, so the spans of one step from every
rank land in ONE trace without any communication; rank 0 also emits the step's root span,
whose span id every rank derives the same way. Spans are created after the fact by the
worker thread with explicit start and end timestamps recorded by the training thread.

The tracer provider is our own (never the global one) because the root span's id must be
chosen by us: :class:`DerivedIdGenerator` hands out a derived id when one is pending and a
random one otherwise. Spans go through :class:`AccountedBatchSpanProcessor`, so an unreachable
collector costs a bounded queue and a counter, nothing more: every span that is never exported
(queue full, export failed, still queued at shutdown) is counted dropped exactly once, shutdown
gives up after :data:`SHUTDOWN_FLUSH_SECONDS`, and :class:`ExporterLogLimiter` keeps the OTLP
exporter's per-retry log lines to one per kind.
"""

from __future__ import annotations

import hashlib
import logging
import os
import threading
from collections.abc import Callable, Sequence

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult
from opentelemetry.sdk.trace.id_generator import IdGenerator, RandomIdGenerator
from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags
from prometheus_client.metrics import Counter

# Bounded export queue: with the collector down, at most this many spans are held.
MAX_QUEUED_SPANS = 4096
MAX_EXPORT_BATCH_SPANS = 512
EXPORT_TIMEOUT_SECONDS = 5.0
# How often queued spans are exported: a process killed outright loses at most this much.
EXPORT_INTERVAL_SECONDS = 1.0
# How long uninstrument() lets queued spans flush before it gives them up (counted dropped),
# and how long it then waits for an export in progress to notice the exporter's shutdown.
SHUTDOWN_FLUSH_SECONDS = 1.0
SHUTDOWN_GRACE_SECONDS = 0.5
# The OTLP exporters' module loggers (HTTP and gRPC) all live under this name.
OTLP_EXPORTER_LOGGERS = "opentelemetry.exporter.otlp"


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


class SpanExportError(Exception):
    """An exporter reported FAILURE without raising (how OTLP reports an unreachable collector)."""


class SpanLedger:
    """How many spans sit between the batch processor's queue and the exporter.

    The processor's queue silently evicts its oldest span when full, and keeps what it could not
    send at shutdown; reserving a slot here before a span is queued (and releasing it when the
    exporter takes the span) means neither happens unseen: the queue never overflows, and what
    is still reserved when the ledger closes is counted dropped.
    """

    def __init__(self, dropped: Counter, capacity: int) -> None:
        self._dropped = dropped
        self._capacity = capacity
        self._reserved = 0
        self._closed = False
        self._lock = threading.Lock()

    def admit(self) -> bool:
        """Reserve a queue slot for one span; without one, the span is counted dropped."""
        with self._lock:
            admitted = not self._closed and self._reserved < self._capacity
            if admitted:
                self._reserved += 1
        if not admitted:
            self._dropped.inc()
        return admitted

    def take(self, count: int) -> bool:
        """The exporter took ``count`` spans off the queue; False if closing counted them."""
        with self._lock:
            if self._closed:
                return False
            self._reserved -= count
            return True

    def lose(self, count: int) -> None:
        self._dropped.inc(count)

    def close(self) -> None:
        """Count every span still queued as dropped, and admit nothing more."""
        with self._lock:
            lost, self._reserved = self._reserved, 0
            self._closed = True
        self._dropped.inc(lost)


class CountingSpanExporter(SpanExporter):
    """Wraps an exporter; spans of a failed export are counted as dropped, never retried here.

    Each failed export is also reported to ``on_error`` (the hook's error budget), so it is
    counted in the instrumentation errors and logged once.
    """

    def __init__(
        self,
        inner: SpanExporter,
        ledger: SpanLedger,
        on_error: Callable[[BaseException], None],
    ) -> None:
        self._inner = inner
        self._ledger = ledger
        self._on_error = on_error
        self._inner_shut_down = False
        self._shutdown_lock = threading.Lock()

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        if not self._ledger.take(len(spans)):
            return SpanExportResult.FAILURE
        try:
            result = self._inner.export(spans)
        except Exception as error:
            self._on_error(error)
            result = SpanExportResult.FAILURE
        else:
            if result is not SpanExportResult.SUCCESS:
                self._on_error(
                    SpanExportError(
                        f"{type(self._inner).__name__} did not export {len(spans)} spans"
                    )
                )
        if result is not SpanExportResult.SUCCESS:
            self._ledger.lose(len(spans))
        return result

    def abandon(self) -> None:
        """Give up on every queued span (counted dropped) and interrupt an export's retries."""
        self._ledger.close()
        self.shutdown()

    def shutdown(self) -> None:
        # Called by abandon() and again by the processor; the inner exporter warns on a second.
        with self._shutdown_lock:
            if self._inner_shut_down:
                return
            self._inner_shut_down = True
        self._inner.shutdown()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return self._inner.force_flush(timeout_millis)


class AccountedBatchSpanProcessor(BatchSpanProcessor):
    """The SDK's batch processor, with every unexported span counted and a bounded shutdown."""

    def __init__(
        self,
        exporter: SpanExporter,
        dropped: Counter,
        on_export_error: Callable[[BaseException], None],
    ) -> None:
        capacity = MAX_QUEUED_SPANS
        self._ledger = SpanLedger(dropped, capacity)
        self._counting_exporter = CountingSpanExporter(exporter, self._ledger, on_export_error)
        super().__init__(
            self._counting_exporter,
            max_queue_size=capacity,
            schedule_delay_millis=int(EXPORT_INTERVAL_SECONDS * 1000),
            max_export_batch_size=min(MAX_EXPORT_BATCH_SPANS, capacity),
            export_timeout_millis=int(EXPORT_TIMEOUT_SECONDS * 1000),
        )

    def on_end(self, span: ReadableSpan) -> None:
        # The batch processor ignores unsampled spans; they take no slot.
        if span.context is None or not span.context.trace_flags.sampled:
            return
        if self._ledger.admit():
            super().on_end(span)

    def shutdown(self) -> None:
        """Flush for at most :data:`SHUTDOWN_FLUSH_SECONDS`, then give up on what is left.

        The SDK's shutdown waits up to 30 s for the queue to drain (and longer with the
        collector down, batch after batch), so it runs on a thread of its own that is abandoned
        at the deadline.
        """
        flushing = threading.Thread(
            target=super().shutdown, name="trainguard-span-flush", daemon=True
        )
        flushing.start()
        flushing.join(SHUTDOWN_FLUSH_SECONDS)
        self._counting_exporter.abandon()
        flushing.join(SHUTDOWN_GRACE_SECONDS)


class ExporterLogLimiter(logging.Filter):
    """Lets through the first warning or error of each kind the OTLP exporter logs.

    With the collector down the exporter logs every retry of every batch; the failures are
    counted by :class:`CountingSpanExporter`, so one line of each kind is all the log needs.
    A logger's filters apply only to records made on that very logger, so the filter is added
    to each OTLP exporter logger rather than to their common parent.
    """

    def __init__(self) -> None:
        super().__init__()
        self._seen: set[tuple[str, object]] = set()
        self._lock = threading.Lock()
        self._loggers: list[logging.Logger] = []

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno < logging.WARNING:
            return True
        # The unformatted message is the kind: the retry delay and the error vary per record.
        kind = (record.name, record.msg)
        with self._lock:
            first = kind not in self._seen
            self._seen.add(kind)
        return first

    def attach(self) -> None:
        """Filter the OTLP exporter loggers that exist now (the exporter's module is loaded)."""
        prefix = OTLP_EXPORTER_LOGGERS + "."
        self._loggers = [
            existing
            for existing in list(logging.Logger.manager.loggerDict.values())
            if isinstance(existing, logging.Logger) and (existing.name + ".").startswith(prefix)
        ]
        for exporter_logger in self._loggers:
            exporter_logger.addFilter(self)

    def detach(self) -> None:
        for exporter_logger in self._loggers:
            exporter_logger.removeFilter(self)
        self._loggers = []


def default_exporter() -> SpanExporter:
    """OTLP over HTTP, configured by the standard ``OTEL_EXPORTER_OTLP_*`` variables."""
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    timeout = float(os.environ.get("OTEL_EXPORTER_OTLP_TIMEOUT", EXPORT_TIMEOUT_SECONDS))
    return OTLPSpanExporter(timeout=timeout)


def build_provider(
    resource_attributes: dict[str, str | int],
    exporter: SpanExporter,
    dropped: Counter,
    on_export_error: Callable[[BaseException], None],
) -> tuple[TracerProvider, DerivedIdGenerator]:
    ids = DerivedIdGenerator()
    service = os.environ.get("OTEL_SERVICE_NAME", "trainguard-training")
    resource = Resource.create({"service.name": service, **resource_attributes})
    provider = TracerProvider(resource=resource, id_generator=ids)
    provider.add_span_processor(AccountedBatchSpanProcessor(exporter, dropped, on_export_error))
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
