"""``trainguard triage``: find OOMs, NCCL timeouts and errors, Xids, torchrun failures and
stragglers in raw training logs. Standard library and the core's PyYAML only (for the
thresholds every judgement shares), so it runs wherever the logs are."""

from __future__ import annotations

from trainguard.triage.findings import Finding, Location
from trainguard.triage.scanner import Scanner, ScanStats

__all__ = ["Finding", "Location", "ScanStats", "Scanner"]
