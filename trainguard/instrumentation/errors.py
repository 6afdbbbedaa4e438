"""Failure accounting for the hook: nothing inside instrumentation may crash or stall training.

Every piece of instrumentation code that runs on behalf of training goes through
:class:`ErrorBudget`: a failure is caught, counted in
``trainguard_instrumentation_errors_total{component}`` and logged once per
(component, exception type) as an ``instrumentation_error`` event (the traceback at DEBUG), so
a broken exporter cannot flood the training log either.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import ParamSpec, TypeVar

from prometheus_client import Counter

from trainguard import contract
from trainguard.events import log_event

logger = logging.getLogger("trainguard.instrumentation")

P = ParamSpec("P")
R = TypeVar("R")


# The hook's parts that report failures; their series exist (at 0) from the start, so that
# rate() and increase() over them have data before the first failure.
COMPONENTS = (
    "bucket_timer",
    "collective_progress",
    "events",
    "file_sd",
    "flight_recorder_dump",
    "memory",
    "metrics_server",
    "oom_guard",
    "rank_info",
    "reducer_stats",
    "spans",
    "stack_dump",
    "timeline",
    "tracing",
    "watchdog",
    "watchdog_store",
    "worker",
)


def _int_or_none(value: str | None) -> int | None:
    return int(value) if value is not None and value.isdigit() else None


class ErrorBudget:
    """Catches, counts and logs-once the failures of one instrumentation instance."""

    def __init__(self, counter: Counter, identity: dict[str, str]) -> None:
        self._counter = counter
        self._identity = identity
        self._logged: set[tuple[str, type[BaseException]]] = set()
        self._lock = threading.Lock()
        for component in COMPONENTS:
            counter.labels(**identity, component=component)

    def record(self, component: str, error: BaseException) -> None:
        """Count ``error`` against ``component``; log it the first time this kind is seen."""
        try:
            self._counter.labels(**self._identity, component=component).inc()
            key = (component, type(error))
            with self._lock:
                first = key not in self._logged
                self._logged.add(key)
            if first:
                log_event(
                    f"trainguard {component} failed (training continues; further "
                    f"{type(error).__name__} errors are only counted in "
                    f"{contract.INSTRUMENTATION_ERRORS.name}): {error!r}",
                    contract.EventKind.INSTRUMENTATION_ERROR,
                    job_id=self._identity.get(contract.LABEL_JOB_ID),
                    rank=_int_or_none(self._identity.get(contract.LABEL_RANK)),
                    node=self._identity.get(contract.LABEL_NODE),
                    outcome=contract.EventOutcome.FAILURE,
                    details={"component": component, "error": type(error).__name__},
                )
                logger.debug("trainguard %s failure", component, exc_info=error)
        except Exception:
            return

    @contextmanager
    def guard(self, component: str) -> Iterator[None]:
        """Run a block; a failure inside it is recorded instead of raised."""
        try:
            yield
        except Exception as error:
            self.record(component, error)

    def wrap(self, component: str, func: Callable[P, R], default: R) -> Callable[P, R]:
        """``func`` that returns ``default`` instead of raising."""

        def guarded(*args: P.args, **kwargs: P.kwargs) -> R:
            try:
                return func(*args, **kwargs)
            except Exception as error:
                self.record(component, error)
                return default

        return guarded
