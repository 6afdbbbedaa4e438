"""The labels and annotations every alert carries, and its severities (alert names are
the catalogue's, in :mod:`trainguard.contract.failures`)."""

from __future__ import annotations

import enum

# Labels and annotations every alert carries.
LABEL_SEVERITY = "severity"
ANNOTATION_SUMMARY = "summary"
ANNOTATION_DESCRIPTION = "description"
ANNOTATION_RUNBOOK_URL = "runbook_url"


class Severity(str, enum.Enum):
    """``severity`` of an alert: critical pages a human, warning goes to chat and remediation."""

    CRITICAL = "critical"
    WARNING = "warning"
