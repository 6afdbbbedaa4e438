"""Wakes long-polling ranks when a directive for their job is queued.

The directive executor runs on the worker thread; waiters are coroutines on the event loop. A
per-job version number closes the gap between a waiter's query and its wait: a waiter reads the
version first, queries, and only waits while the version is unchanged.
"""

from __future__ import annotations

import asyncio
import contextlib


class DirectiveHub:
    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._versions: dict[str, int] = {}
        self._events: dict[str, asyncio.Event] = {}

    def notify(self, job_id: str) -> None:
        """Thread-safe: wake every waiter of ``job_id``."""
        # The loop is gone at shutdown; nobody is left waiting then.
        with contextlib.suppress(RuntimeError):
            self._loop.call_soon_threadsafe(self._bump, job_id)

    def _bump(self, job_id: str) -> None:
        self._versions[job_id] = self._versions.get(job_id, 0) + 1
        event = self._events.pop(job_id, None)
        if event is not None:
            event.set()

    def version(self, job_id: str) -> int:
        return self._versions.get(job_id, 0)

    async def wait(self, job_id: str, version: int, timeout: float) -> None:
        """Return when ``job_id``'s version moves past ``version`` or after ``timeout``."""
        if self.version(job_id) != version:
            return
        event = self._events.setdefault(job_id, asyncio.Event())
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(event.wait(), timeout)
