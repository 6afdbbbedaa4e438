"""Where the nccl collector gets its data: a follower polled at each scrape, or a child process.

Parsing a log is CPU work that holds the GIL. Done on a thread of the exporter, reading a large
backlog (a 1 GB log found at start-up) stalls the HTTP thread: the scrape benchmark measured a
p99 near 45 ms while reading against 8-10 ms after. So the exporter follows logs in a child
process (``spawn``: no state shared with the parent's threads) running at a lower CPU priority
(nice 10), which sends a :class:`NcclSnapshot` through a pipe whenever something changed, at
least every 64 MB while catching up. A scrape only drains the pipe and keeps the latest
snapshot. The child exits when the pipe closes (the exporter exited, even by SIGKILL); if it
dies, the next scrape restarts it and reports the collector as failed.
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing
import os
import threading
from collections.abc import Sequence
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from typing import Protocol

from trainguard.exporters.nccl_log import LogFollower, NcclLogState, NcclSnapshot

log = logging.getLogger(__name__)

PROGRESS_BYTES = 64 * 1024 * 1024
_NICENESS = 10


class SnapshotSource(Protocol):
    def snapshot(self) -> NcclSnapshot: ...

    def close(self) -> None: ...


class PollingSource:
    """Polls the follower at each scrape, in the caller's thread (tests, tools)."""

    def __init__(self, follower: LogFollower) -> None:
        self.follower = follower

    def snapshot(self) -> NcclSnapshot:
        self.follower.poll()
        return self.follower.snapshot()

    def close(self) -> None:
        self.follower.close()


def follow(globs: Sequence[str], interval: float, conn: Connection) -> None:
    """The child process: poll, send what changed, wait; until the parent goes away."""
    follower = LogFollower(globs, NcclLogState())
    last: NcclSnapshot | None = None
    try:
        while True:
            try:
                read = follower.poll(max_bytes=PROGRESS_BYTES)
            except OSError as error:
                log.warning("following NCCL logs failed, retrying: %s", error)
                read = 0
            snapshot = follower.snapshot()
            if snapshot != last:
                conn.send(snapshot)
                last = snapshot
            # Still catching up: go on at once; else wait for the next period (or a stop).
            if conn.poll(0 if read >= PROGRESS_BYTES else interval):
                return
    except (EOFError, BrokenPipeError, ConnectionResetError, KeyboardInterrupt):
        return
    finally:
        follower.close()


class ChildProcessSource:
    """Follows the logs in a child process started at the first snapshot."""

    def __init__(self, globs: Sequence[str], interval: float) -> None:
        self._globs = list(globs)
        self._interval = interval
        self._lock = threading.Lock()
        self._process: BaseProcess | None = None
        self._conn: Connection | None = None
        self._latest = NcclSnapshot([], {}, 0, 0, 0)

    @property
    def pid(self) -> int | None:
        return None if self._process is None else self._process.pid

    def _start(self) -> None:
        context = multiprocessing.get_context("spawn")
        parent, child = context.Pipe()
        process = context.Process(
            target=follow,
            args=(self._globs, self._interval, child),
            name="trainguard-nccl-follower",
            daemon=True,
        )
        process.start()
        # Reading a backlog is background work: on a busy node the scrapes should get the CPU.
        # Lowered from here, at once, because the child's own interpreter start-up (imports)
        # already competed with the first scrape when it reniced itself.
        with contextlib.suppress(OSError):  # it already exited; the next snapshot restarts it
            assert process.pid is not None
            os.setpriority(
                os.PRIO_PROCESS, process.pid, os.getpriority(os.PRIO_PROCESS, 0) + _NICENESS
            )
        child.close()
        self._process, self._conn = process, parent

    def snapshot(self) -> NcclSnapshot:
        with self._lock:
            died = self._process is not None and not self._process.is_alive()
            if died:
                assert self._process is not None
                exit_code = self._process.exitcode
                self._stop()
                self._start()
                raise RuntimeError(f"the NCCL log follower exited ({exit_code}); restarted it")
            if self._process is None:
                self._start()
            assert self._conn is not None
            try:
                while self._conn.poll():
                    self._latest = self._conn.recv()
            except (EOFError, OSError):
                pass  # it just exited; the next scrape notices and restarts it
            return self._latest

    def _stop(self) -> None:
        if self._conn is not None:
            with contextlib.suppress(OSError):  # already gone
                self._conn.send(None)  # any message means stop
            self._conn.close()
        if self._process is not None:
            self._process.join(timeout=5)
            if self._process.is_alive():
                self._process.kill()
                self._process.join(timeout=5)
        self._process, self._conn = None, None

    def close(self) -> None:
        with self._lock:
            self._stop()
