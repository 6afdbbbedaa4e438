"""The event schema: ECS field names and the kinds of event (see ``trainguard.events``)."""

from __future__ import annotations

import enum

from trainguard.contract.failures import Failure
from trainguard.contract.labels import LABEL_JOB_ID, LABEL_NODE, LABEL_RANK

# --- event schema (ECS fields; see trainguard.events) --------------------------------------


class EventKind(str, enum.Enum):
    """What happened (``event.action``)."""

    OOM = "oom"
    OOM_RECOVERED = "oom_recovered"
    COLLECTIVE_STALLED = "collective_stalled"
    COLLECTIVE_TIMEOUT = "collective_timeout"
    STRAGGLER = "straggler"
    CHECKPOINT = "checkpoint"
    DIRECTIVE = "directive"
    INSTRUMENTED = "instrumented"
    UNINSTRUMENTED = "uninstrumented"
    INSTRUMENTATION_ERROR = "instrumentation_error"
    ALERT_RECEIVED = "alert_received"
    DECISION = "decision"
    ACTION = "action"


# Events that report a failure name it (``labels.failure``); decisions and actions name the
# failure of the alert they answer.
EVENT_FAILURE: dict[EventKind, Failure] = {
    EventKind.OOM: Failure.OOM,
    EventKind.OOM_RECOVERED: Failure.OOM,
    EventKind.COLLECTIVE_STALLED: Failure.HANG,
    EventKind.COLLECTIVE_TIMEOUT: Failure.NCCL_TIMEOUT,
    EventKind.STRAGGLER: Failure.STRAGGLER,
}


class EventOutcome(str, enum.Enum):
    SUCCESS = "success"
    FAILURE = "failure"
    UNKNOWN = "unknown"


# ECS field names used by events; labels.* carry our identity labels.
FIELD_EVENT_KIND = "event.kind"
FIELD_EVENT_CATEGORY = "event.category"
FIELD_EVENT_ACTION = "event.action"
FIELD_EVENT_OUTCOME = "event.outcome"
FIELD_EVENT_DATASET = "event.dataset"
FIELD_SERVICE_NAME = "service.name"
# service.name of trainguard's own service processes.
SERVICE_EXPORTER = "trainguard-exporter"
SERVICE_REMEDIATION = "trainguard-remediation"
FIELD_TRACE_ID = "trace.id"
FIELD_SPAN_ID = "span.id"
FIELD_LABELS_PREFIX = "labels."
FIELD_JOB_ID = FIELD_LABELS_PREFIX + LABEL_JOB_ID
FIELD_RANK = FIELD_LABELS_PREFIX + LABEL_RANK
FIELD_NODE = FIELD_LABELS_PREFIX + LABEL_NODE
FIELD_STEP = FIELD_LABELS_PREFIX + "step"
FIELD_FAILURE = FIELD_LABELS_PREFIX + "failure"
FIELD_DETAILS = "trainguard"  # event-specific details live under this object
