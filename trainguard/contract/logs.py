"""ECS log fields and data streams (``trainguard.logs``; Filebeat and the direct shipper)."""

from __future__ import annotations

# --- logs (trainguard.logs; Filebeat and the direct Elasticsearch shipper) --------------------
# ECS fields every trainguard log record carries besides the event fields above.
FIELD_HOST_NAME = "host.name"
FIELD_DATA_STREAM_TYPE = "data_stream.type"
FIELD_DATA_STREAM_DATASET = "data_stream.dataset"
FIELD_DATA_STREAM_NAMESPACE = "data_stream.namespace"
# Logs land in the data streams logs-trainguard.<dataset>-<namespace>.
LOG_DATA_STREAM_PREFIX = "logs-trainguard"
# Where configure_logging writes its rotated NDJSON file when no path is given.
ENV_LOG_FILE = "TRAINGUARD_LOG_FILE"
# A folder for per-process ECS NDJSON logs (the demo trainer writes rank<N>.ndjson there).
ENV_LOG_DIR = "TRAINGUARD_LOG_DIR"
