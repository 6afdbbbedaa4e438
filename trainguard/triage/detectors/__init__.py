"""The detectors of ``trainguard triage``, one module per failure, and how triage builds them.

Each module is named after the failure it finds (``oom``, ``nccl_timeout``, ``rank_failure``,
...) and registers its detector class under ``base.DETECTORS``; :func:`default_detectors`
builds one of each, in the catalogue's order (causes before what they cause), which is the
order findings are reported in.
"""

from __future__ import annotations

import dataclasses

from trainguard.contract import FAILURES, Catalogue
from trainguard.thresholds import Thresholds
from trainguard.triage.detectors.base import DETECTORS, Detector, DetectorType, Source

__all__ = [
    "DETECTORS",
    "Detector",
    "DetectorType",
    "Source",
    "default_detectors",
    "detector_types",
]


def detector_types(catalogue: Catalogue = FAILURES) -> list[DetectorType]:
    """Every registered detector class, in the catalogue's order."""
    return [detector for _, detector in catalogue.implementations(DETECTORS)]


def default_detectors(
    thresholds: Thresholds,
    *,
    straggler_factor: float | None = None,
    catalogue: Catalogue = FAILURES,
) -> list[Detector]:
    """One of each registered detector, judging by ``thresholds``; ``straggler_factor``
    overrides its ``straggler_factor``."""
    t = thresholds
    if straggler_factor is not None:
        t = dataclasses.replace(t, straggler_factor=straggler_factor)
    return [detector.from_thresholds(t) for detector in detector_types(catalogue)]
