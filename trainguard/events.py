"""The event schema: structured log records for what happened (an OOM, a stall, a decision).

Events are ordinary ``logging`` records whose ``extra`` holds ECS field names from
:mod:`trainguard.contract`, so any handler works and the ``ecs-logging`` formatter turns them
into ECS JSON for Elasticsearch (dotted keys become nested objects). Only the standard library
is used here: every component, with or without torch, emits the same shape.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from trainguard import contract

EVENTS_LOGGER = "trainguard.events"

# ECS event.category per kind (ECS allows a fixed set: process, host, configuration, ...).
_CATEGORY: dict[contract.EventKind, str] = {
    contract.EventKind.OOM: "process",
    contract.EventKind.OOM_RECOVERED: "process",
    contract.EventKind.COLLECTIVE_STALLED: "network",
    contract.EventKind.COLLECTIVE_TIMEOUT: "network",
    contract.EventKind.STRAGGLER: "host",
    contract.EventKind.CHECKPOINT: "process",
    contract.EventKind.DIRECTIVE: "configuration",
    contract.EventKind.INSTRUMENTED: "configuration",
    contract.EventKind.UNINSTRUMENTED: "configuration",
    contract.EventKind.INSTRUMENTATION_ERROR: "process",
    contract.EventKind.ALERT_RECEIVED: "host",
    contract.EventKind.DECISION: "configuration",
    contract.EventKind.ACTION: "process",
}


def event_fields(
    kind: contract.EventKind,
    *,
    job_id: str | None = None,
    rank: int | None = None,
    node: str | None = None,
    step: int | None = None,
    trace_id: str | None = None,
    outcome: contract.EventOutcome = contract.EventOutcome.UNKNOWN,
    failure: contract.Failure | None = None,
    details: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The ECS fields of one event, as a flat mapping of dotted names.

    ``failure`` defaults to the failure the kind reports (``contract.EVENT_FAILURE``).
    """
    fields: dict[str, Any] = {
        contract.FIELD_EVENT_KIND: "event",
        contract.FIELD_EVENT_CATEGORY: _CATEGORY[kind],
        contract.FIELD_EVENT_ACTION: kind.value,
        contract.FIELD_EVENT_OUTCOME: outcome.value,
    }
    if job_id is not None:
        fields[contract.FIELD_JOB_ID] = job_id
    if rank is not None:
        fields[contract.FIELD_RANK] = str(rank)
    if node is not None:
        fields[contract.FIELD_NODE] = node
    if step is not None:
        fields[contract.FIELD_STEP] = str(step)
    if trace_id is not None:
        fields[contract.FIELD_TRACE_ID] = trace_id
    failure = failure or contract.EVENT_FAILURE.get(kind)
    if failure is not None:
        fields[contract.FIELD_FAILURE] = failure.value
    if details:
        fields[contract.FIELD_DETAILS] = dict(details)
    return fields


def log_event(
    message: str,
    kind: contract.EventKind,
    *,
    level: int = logging.WARNING,
    logger: logging.Logger | None = None,
    **fields: Any,
) -> dict[str, Any]:
    """Log one event and return its fields (tests and callers may keep them)."""
    record_fields = event_fields(kind, **fields)
    (logger or logging.getLogger(EVENTS_LOGGER)).log(level, message, extra=record_fields)
    return record_fields
