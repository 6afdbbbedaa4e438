"""Which trace the records logged right now belong to, when no OpenTelemetry span is current.

The hook builds its spans after the fact, off the training thread, from recorded timestamps, so
no span is ever current while training code (or the hook itself) logs. Instead the hook
publishes here a function naming the step in progress: the trace id every rank's spans of that
step share, and this rank's span of it. The ECS logging filter (``trainguard.logs``) asks
:func:`current_ids` for records that carry no ids of their own, so a log line in Kibana links to
its step's trace in Jaeger. Standard library only: the hook and the logs import it alike.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

TraceIds = tuple[str, str]  # (trace id, span id), lowercase hex as ECS and Jaeger write them
IdsProvider = Callable[[], TraceIds | None]

_lock = threading.Lock()
_provider: IdsProvider | None = None


def publish(provider: IdsProvider) -> None:
    """Make ``provider`` the source of the current step's ids (the latest publisher wins)."""
    global _provider
    with _lock:
        _provider = provider


def withdraw(provider: IdsProvider) -> None:
    """Stop using ``provider``, if it is still the one published."""
    global _provider
    with _lock:
        if _provider is provider:
            _provider = None


def current_ids() -> TraceIds | None:
    """The ids of the step in progress, or None when nothing publishes them (or it fails)."""
    provider = _provider
    if provider is None:
        return None
    try:
        return provider()
    except Exception:  # a logging filter must never raise into the caller's log call
        return None
