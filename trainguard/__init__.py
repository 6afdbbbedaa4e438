"""trainguard: monitoring, alerting and remediation for distributed PyTorch training.

The top-level package is the small shared core (names, event schema, CLI) and needs only the
standard library. ``trainguard.instrument`` is imported lazily so that ``import trainguard``
never pulls torch into a process that does not train (the exporter, the remediation service).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

if TYPE_CHECKING:
    from trainguard.instrumentation import Instrumentation, InstrumentationConfig, instrument

__all__ = ["Instrumentation", "InstrumentationConfig", "__version__", "instrument"]


def __getattr__(name: str) -> Any:
    if name in ("instrument", "Instrumentation", "InstrumentationConfig"):
        from trainguard import instrumentation

        return getattr(instrumentation, name)
    raise AttributeError(f"module 'trainguard' has no attribute {name!r}")
