"""trainguard: monitoring, alerting and remediation for distributed PyTorch training.

This module is the package's façade for training scripts: ``trainguard.instrument(model,
optimizer)``. It belongs to no layer (docs/design.md#layers): the hook is imported lazily, so that
``import trainguard`` never pulls torch into a process that does not train (the exporter, the
remediation service), and no part of trainguard imports this module.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from trainguard.version import VERSION

__version__ = VERSION

if TYPE_CHECKING:
    from trainguard.instrumentation import Instrumentation, InstrumentationConfig, instrument

__all__ = ["Instrumentation", "InstrumentationConfig", "__version__", "instrument"]


def __getattr__(name: str) -> Any:
    if name in ("instrument", "Instrumentation", "InstrumentationConfig"):
        from trainguard import instrumentation

        return getattr(instrumentation, name)
    raise AttributeError(f"module 'trainguard' has no attribute {name!r}")
