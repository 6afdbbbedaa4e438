"""ECS JSON logging for every trainguard process.

:func:`configure_logging` installs the ``ecs-logging`` formatter on a size-rotated NDJSON file
(what Filebeat ships, see ``deploy/filebeat.yml``) and/or standard output, and a filter that adds
to every record the process's identity (``labels.job_id``, ``labels.rank``, ``labels.node``), the
current training step (``labels.step``) and the ``trace.id``/``span.id`` of the OpenTelemetry
span active when the record was made, so Kibana and Jaeger link to each other. Records from
:func:`trainguard.events.log_event` keep the fields they carry; the filter only fills what is
missing. ``data_stream.*`` fields name the Elasticsearch data stream
``logs-trainguard.<dataset>-<namespace>`` the record belongs in.
"""

from __future__ import annotations

import logging
import logging.handlers
import os
import socket
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import ecs_logging

from trainguard import contract, correlation

DEFAULT_DATASET = "rank"
DEFAULT_NAMESPACE = "default"
DEFAULT_MAX_BYTES = 100 << 20
DEFAULT_BACKUP_COUNT = 5

# Marks the handlers configure_logging installed, so a second call replaces them.
_OWNED = "_trainguard_handler"

SpanIds = Callable[[], "tuple[str, str] | None"]


def _check_name_part(value: str, what: str) -> None:
    # Elasticsearch data stream naming: lowercase, no '-' inside a part, no spaces or '*'.
    bad = set(value) & set('-\\/*?"<>| ,#:')
    if not value or value != value.lower() or bad or len(value) > 100:
        raise ValueError(
            f"invalid data stream {what} {value!r}: lowercase, no '-' or special characters"
        )


def data_stream_name(dataset: str, namespace: str = DEFAULT_NAMESPACE) -> str:
    """``logs-trainguard.<dataset>-<namespace>``, validated against Elasticsearch's rules."""
    _check_name_part(dataset, "dataset")
    _check_name_part(namespace, "namespace")
    return f"{contract.LOG_DATA_STREAM_PREFIX}.{dataset}-{namespace}"


def current_span_ids() -> SpanIds:
    """A function returning (trace id, span id) of the current OpenTelemetry span, else of the
    training step in progress (published by the hook, :mod:`trainguard.correlation`), else
    None."""
    try:
        from opentelemetry import trace
    except ImportError:
        return correlation.current_ids

    def current() -> tuple[str, str] | None:
        context = trace.get_current_span().get_span_context()
        if not context.is_valid:
            return correlation.current_ids()
        return trace.format_trace_id(context.trace_id), trace.format_span_id(context.span_id)

    return current


class ContextFilter(logging.Filter):
    """Adds identity labels, the step and the current span's ids to records lacking them."""

    def __init__(
        self,
        static_fields: dict[str, str],
        span_ids: SpanIds | None = None,
    ) -> None:
        super().__init__()
        self._static = dict(static_fields)
        self._span_ids = span_ids
        self._step: str | None = None

    def set_step(self, step: int | None) -> None:
        """The training step that records made from now on belong to (None: no step)."""
        self._step = None if step is None else str(step)

    def filter(self, record: logging.LogRecord) -> bool:
        fields = record.__dict__
        for name, value in self._static.items():
            fields.setdefault(name, value)
        step = self._step
        if step is not None:
            fields.setdefault(contract.FIELD_STEP, step)
        ids = self._span_ids() if self._span_ids is not None else None
        if ids is not None:
            trace_id = fields.setdefault(contract.FIELD_TRACE_ID, ids[0])
            if trace_id == ids[0]:  # a record naming another trace keeps only its own ids
                fields.setdefault(contract.FIELD_SPAN_ID, ids[1])
        return True


@dataclass
class LoggingSetup:
    """What :func:`configure_logging` installed; ``set_step`` and ``close`` act on it."""

    logger: logging.Logger
    context: ContextFilter
    handlers: list[logging.Handler] = field(default_factory=list)

    def set_step(self, step: int | None) -> None:
        self.context.set_step(step)

    def close(self) -> None:
        for handler in self.handlers:
            self.logger.removeHandler(handler)
            handler.close()
        self.handlers.clear()


def ecs_formatter() -> logging.Formatter:
    """The ECS formatter; ``log.original`` repeats ``message`` and is left out."""
    formatter: logging.Formatter = ecs_logging.StdlibFormatter(exclude_fields=["log.original"])
    return formatter


def configure_logging(
    *,
    service_name: str,
    job_id: str | None = None,
    rank: int | None = None,
    node: str | None = None,
    file: str | Path | None = None,
    stdout: bool = False,
    level: int = logging.INFO,
    dataset: str = DEFAULT_DATASET,
    namespace: str = DEFAULT_NAMESPACE,
    max_bytes: int = DEFAULT_MAX_BYTES,
    backup_count: int = DEFAULT_BACKUP_COUNT,
    extra_handlers: Sequence[logging.Handler] = (),
    logger: logging.Logger | None = None,
) -> LoggingSetup:
    """Send ``logger``'s records (the root logger by default) as ECS JSON.

    ``file`` (default: ``$TRAINGUARD_LOG_FILE``) gets one JSON document per line and rotates at
    ``max_bytes`` keeping ``backup_count`` old files; ``stdout`` writes the same lines to
    standard output. With neither, standard output is used. ``extra_handlers`` (for example
    :class:`trainguard.logs.shipper.ElasticsearchShipper`) get the same context fields. Calling
    it again replaces what the previous call installed.
    """
    target = logger if logger is not None else logging.getLogger()
    job_id = job_id if job_id is not None else os.environ.get(contract.ENV_JOB_ID)
    node = node if node is not None else os.environ.get(contract.ENV_NODE) or socket.gethostname()
    if file is None and os.environ.get(contract.ENV_LOG_FILE):
        file = os.environ[contract.ENV_LOG_FILE]
    static: dict[str, str] = {
        contract.FIELD_SERVICE_NAME: service_name,
        contract.FIELD_HOST_NAME: socket.gethostname(),
        contract.FIELD_NODE: node,
        contract.FIELD_EVENT_DATASET: f"trainguard.{dataset}",
        contract.FIELD_DATA_STREAM_TYPE: "logs",
        contract.FIELD_DATA_STREAM_DATASET: f"trainguard.{dataset}",
        contract.FIELD_DATA_STREAM_NAMESPACE: namespace,
    }
    data_stream_name(dataset, namespace)
    if job_id is not None:
        static[contract.FIELD_JOB_ID] = job_id
    if rank is not None:
        static[contract.FIELD_RANK] = str(rank)
    context = ContextFilter(static, current_span_ids())

    for handler in list(target.handlers):
        if getattr(handler, _OWNED, False):
            target.removeHandler(handler)
            handler.close()

    handlers: list[logging.Handler] = []
    if file is not None:
        path = Path(file)
        path.parent.mkdir(parents=True, exist_ok=True)
        handlers.append(
            logging.handlers.RotatingFileHandler(
                path, maxBytes=max_bytes, backupCount=backup_count, encoding="utf-8"
            )
        )
    if stdout or file is None:
        handlers.append(logging.StreamHandler(sys.stdout))
    formatter = ecs_formatter()
    for handler in handlers:
        handler.setFormatter(formatter)
    handlers.extend(extra_handlers)
    for handler in handlers:
        handler.addFilter(context)
        setattr(handler, _OWNED, True)
        target.addHandler(handler)
    target.setLevel(level)
    return LoggingSetup(target, context, handlers)


LOG_FORMATS = ("ecs", "text")
_TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def configure_process_logging(
    *, service_name: str, dataset: str, level: int | str, log_format: str
) -> None:
    """How a trainguard service process (exporter, remediation) logs: ECS JSON by default, to
    ``$TRAINGUARD_LOG_FILE`` (rotated NDJSON that Filebeat ships) or else standard output, or
    plain text for a human at a terminal (``log_format="text"``, standard error)."""
    if log_format not in LOG_FORMATS:
        raise ValueError(f"log format {log_format!r}: expected one of {', '.join(LOG_FORMATS)}")
    numeric = logging.getLevelName(level.upper()) if isinstance(level, str) else level
    if log_format == "text":
        logging.basicConfig(level=numeric, format=_TEXT_FORMAT)
        return
    configure_logging(service_name=service_name, dataset=dataset, level=numeric)
