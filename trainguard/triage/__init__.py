"""``trainguard triage``: find OOMs, NCCL timeouts and errors, Xids, torchrun failures and
stragglers in raw training logs. Standard library only, so it runs wherever the logs are."""

from __future__ import annotations

from trainguard.triage.findings import Category, Finding, Location
from trainguard.triage.scanner import Scanner, ScanStats

__all__ = ["Category", "Finding", "Location", "ScanStats", "Scanner"]
