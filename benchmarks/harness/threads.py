"""Per-thread CPU clocks and context switches: what a benchmark charges to the thread it
measures, apart from the rest of the process."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from pathlib import Path


def python_threads() -> set[int]:
    return {t.ident for t in threading.enumerate() if t.ident is not None}


# -- CPU clocks -----------------------------------------------------------------------------------
def thread_clocks() -> dict[int, int]:
    """CPU time (ns) of every Python thread but the main (training) one."""
    main = threading.main_thread()
    clocks: dict[int, int] = {}
    for thread in threading.enumerate():
        if thread is main or thread.ident is None:
            continue
        try:
            clocks[thread.ident] = time.clock_gettime_ns(time.pthread_getcpuclockid(thread.ident))
        except (OSError, OverflowError):  # it ended meanwhile
            continue
    return clocks


@dataclass
class Clocks:
    process: int
    main: int
    threads: dict[int, int]

    @staticmethod
    def now() -> Clocks:
        return Clocks(time.process_time_ns(), time.thread_time_ns(), thread_clocks())

    def since(self, earlier: Clocks) -> tuple[int, int, dict[int, int]]:
        """(process, training thread, each Python thread present both times) CPU ns between."""
        threads = {
            ident: max(0, ns - earlier.threads[ident])
            for ident, ns in self.threads.items()
            if ident in earlier.threads
        }
        return self.process - earlier.process, self.main - earlier.main, threads


def context_switches() -> int:
    """The calling thread's context switches so far, voluntary and not (Linux)."""
    try:
        status = Path("/proc/thread-self/status").read_text()
    except OSError:
        return 0
    return sum(int(line.split()[1]) for line in status.splitlines() if "ctxt_switches:" in line)
