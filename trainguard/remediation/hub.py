"""Wakes long-polling ranks when a directive for their job is queued, and knows who listens.

The directive executor runs on the worker thread; waiters are coroutines on the event loop. A
per-job version number closes the gap between a waiter's query and its wait: a waiter reads the
version first, queries, and only waits while the version is unchanged.

The hub also remembers which ranks of a job polled lately: those are the ranks a directive for
every rank reaches, and so the acknowledgements its action waits for.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time


class DirectiveHub:
    def __init__(self, loop: asyncio.AbstractEventLoop, *, listening_seconds: float) -> None:
        self._loop = loop
        self._versions: dict[str, int] = {}
        self._events: dict[str, asyncio.Event] = {}
        # A rank that polls continuously is seen at least once per long-poll: one that has not
        # been seen for ``listening_seconds`` stopped listening.
        self._listening_seconds = listening_seconds
        self._seen: dict[str, dict[int, float]] = {}
        self._seen_lock = threading.Lock()
        self._pruned_at = time.monotonic()

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

    def seen(self, job_id: str, rank: int) -> None:
        """Thread-safe: ``rank`` of ``job_id`` is polling for directives now."""
        now = time.monotonic()
        with self._seen_lock:
            self._seen.setdefault(job_id, {})[rank] = now
            if now - self._pruned_at > self._listening_seconds:
                # Jobs that ended leave nothing behind for long.
                self._pruned_at = now
                for job in list(self._seen):
                    self._drop_silent(job, now)

    def listening(self, job_id: str) -> list[int]:
        """Thread-safe: the ranks of ``job_id`` that polled lately, in order."""
        with self._seen_lock:
            self._drop_silent(job_id, time.monotonic())
            return sorted(self._seen.get(job_id, {}))

    def _drop_silent(self, job_id: str, now: float) -> None:
        ranks = self._seen.get(job_id)
        if ranks is None:
            return
        for rank in [r for r, at in ranks.items() if now - at > self._listening_seconds]:
            del ranks[rank]
        if not ranks:
            del self._seen[job_id]
