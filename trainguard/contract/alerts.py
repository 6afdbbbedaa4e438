"""Alert names, and the labels and annotations every alert carries."""

from __future__ import annotations

import enum


# --- alerts ---------------------------------------------------------------------------------
class Alert(str, enum.Enum):
    """Alert names (CamelCase); each has ``severity`` and summary/description/runbook_url."""

    TRAINING_OOM = "TrainingOOM"
    TRAINING_OOM_RISK = "TrainingOOMRisk"
    TRAINING_STRAGGLER = "TrainingStraggler"
    TRAINING_COLLECTIVE_STALLED = "TrainingCollectiveStalled"
    TRAINING_NCCL_TIMEOUT = "TrainingNCCLTimeout"
    TRAINING_STALLED = "TrainingStalled"
    TRAINING_RANK_DOWN = "TrainingRankDown"
    TRAINING_RANK_RESTARTED = "TrainingRankRestarted"
    TRAINING_DATALOADER_BOUND = "TrainingDataLoaderBound"
    TRAINING_MEMORY_FRAGMENTATION = "TrainingMemoryFragmentation"
    GPU_XID_ERROR = "GpuXidError"
    GPU_THERMAL_THROTTLING = "GpuThermalThrottling"
    GPU_NVML_DOWN = "GpuNvmlDown"
    NCCL_SOCKET_TRANSPORT_FALLBACK = "NcclSocketTransportFallback"


# Labels and annotations every alert carries.
LABEL_SEVERITY = "severity"
ANNOTATION_SUMMARY = "summary"
ANNOTATION_DESCRIPTION = "description"
ANNOTATION_RUNBOOK_URL = "runbook_url"


class Severity(str, enum.Enum):
    """``severity`` of an alert: critical pages a human, warning goes to chat and remediation."""

    CRITICAL = "critical"
    WARNING = "warning"
