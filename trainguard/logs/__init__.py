"""trainguard's logs: ECS JSON records with job/rank/step labels and trace ids.

:func:`configure_logging` is all a process needs for the default path (rotated NDJSON files that
Filebeat ships). The direct path lives in :mod:`trainguard.logs.shipper` (disk-spooled
``streaming_bulk`` into data streams) and :mod:`trainguard.logs.install` (ILM policy, index
template, Kibana data view). Names are imported lazily so that ``trainguard --help`` (which loads
the ``logs-setup`` subcommand) works where the ``logs`` extra is not installed.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from trainguard.logs.config import (
        ContextFilter,
        LoggingSetup,
        configure_logging,
        configure_process_logging,
        data_stream_name,
        ecs_formatter,
    )

__all__ = [
    "ContextFilter",
    "LoggingSetup",
    "configure_logging",
    "configure_process_logging",
    "data_stream_name",
    "ecs_formatter",
]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from trainguard.logs import config

        return getattr(config, name)
    raise AttributeError(f"module 'trainguard.logs' has no attribute {name!r}")
