"""The detectors of ``trainguard triage``, one module each, and the registry that builds them.

Importing a detector's module registers it (``base.register``); :data:`REPORT_ORDER` fixes the
order findings are reported in.
"""

from __future__ import annotations

import dataclasses

from trainguard.contract import Failure
from trainguard.thresholds import Thresholds, load_default
from trainguard.triage.detectors import (  # noqa: F401  (imported to register)
    elastic,
    nccl_error,
    nccl_timeout,
    oom,
    straggler,
    xid,
)
from trainguard.triage.detectors.base import REGISTRY, Detector, DetectorType, Source

# The order findings are reported in: what a rank hit before what its peers saw of it.
REPORT_ORDER = (
    Failure.OOM,
    Failure.NCCL_TIMEOUT,
    Failure.NCCL_ERROR,
    Failure.GPU_FAULT,
    Failure.RANK_FAILURE,
    Failure.STRAGGLER,
)
DETECTORS: tuple[DetectorType, ...] = tuple(
    sorted(REGISTRY, key=lambda d: REPORT_ORDER.index(d.failure))
)

__all__ = [
    "DETECTORS",
    "REPORT_ORDER",
    "Detector",
    "DetectorType",
    "Source",
    "default_detectors",
]


def default_detectors(
    thresholds: Thresholds | None = None, *, straggler_factor: float | None = None
) -> list[Detector]:
    """One of each registered detector, judging by ``thresholds`` (default: the packaged
    thresholds.yml); ``straggler_factor`` overrides its ``straggler_factor``."""
    t = thresholds if thresholds is not None else load_default()
    if straggler_factor is not None:
        t = dataclasses.replace(t, straggler_factor=straggler_factor)
    return [detector.from_thresholds(t) for detector in DETECTORS]
