"""``BackgroundThread``: the one way trainguard runs a worker beside the main thread.

Every long-lived worker (the hook's step worker, watchdog and directive client, a rank's or an
exporter's discovery heartbeat, the exporter's sampler and Xid waiter, the remediation
service's executor worker, verifier, decider and SQLite checkpointer, the log shipper) is a
daemon thread with a name, started and stopped from outside, that sleeps between turns and must
wake at once when it is stopped. This base holds that plumbing, so each worker is only its loop
(:meth:`run`, or a ``target`` given the thread, as ``threading.Thread`` takes one):

- :meth:`start` starts the thread (again after a :meth:`stop`); a second call while it runs
  does nothing;
- :meth:`stop` sets the stop flag, wakes the thread and joins it (for ``timeout`` seconds at
  most, never from the thread itself); calling it again, or before :meth:`start`, is harmless;
- inside :meth:`run`, :meth:`sleep` waits a while or until the stop, :meth:`wait_for_work` a
  while or until :meth:`wake` or the stop, and :attr:`stopping` says whether to leave.

A thread abandoned by a timed-out :meth:`stop` (one blocked in a long poll) keeps its own stop
flag: a later :meth:`start` gives the new thread a fresh one and never revives the old.
"""

from __future__ import annotations

import threading
from collections.abc import Callable


class BackgroundThread:
    """A named daemon thread running :meth:`run` until :meth:`stop`. Its own attributes are
    private to it (name-mangled), so a subclass may use any name."""

    def __init__(self, name: str, target: Callable[[BackgroundThread], None] | None = None) -> None:
        self.thread_name = name
        self.__target = target
        self.__lock = threading.Lock()
        self.__thread: threading.Thread | None = None
        self.__stop = threading.Event()
        self.__wake = threading.Event()
        self.__own = threading.local()

    # --- from outside ------------------------------------------------------------------------
    def start(self) -> None:
        with self.__lock:
            if self.__stop.is_set():
                # Stopped: a thread still in a long call is left to end on its own flag.
                self.__stop = threading.Event()
            elif self.__thread is not None and self.__thread.is_alive():
                return
            thread = threading.Thread(
                target=self._main, args=(self.__stop,), name=self.thread_name, daemon=True
            )
            self.__thread = thread
        thread.start()

    def stop(self, timeout: float | None = None) -> None:
        """Stop the loop, wake it, and wait ``timeout`` seconds (None: as long as it takes)
        for it to end."""
        with self.__lock:
            self.__stop.set()
            self.__wake.set()
        self.join(timeout)

    def join(self, timeout: float | None = None) -> bool:
        """Wait ``timeout`` seconds at most for the thread to end; True once it has (or never
        ran). Never waits from the thread itself."""
        thread = self.__thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)
        return not self.alive

    def wake(self) -> None:
        """Have :meth:`wait_for_work` return now."""
        self.__wake.set()

    @property
    def alive(self) -> bool:
        thread = self.__thread
        return thread is not None and thread.is_alive()

    @property
    def ident(self) -> int | None:
        """The running thread's identifier (``threading.get_ident()`` on it), else None."""
        thread = self.__thread
        return thread.ident if thread is not None else None

    # --- on the thread -------------------------------------------------------------------------
    def run(self) -> None:
        """The worker's loop; return when :attr:`stopping`. By default, ``target(self)``."""
        if self.__target is None:
            raise NotImplementedError("give a target or override run()")
        self.__target(self)

    @property
    def stopping(self) -> bool:
        """Whether this thread was asked to stop."""
        return self._flag().is_set()

    def sleep(self, seconds: float) -> bool:
        """Wait ``seconds`` or until stopped; True when stopped."""
        return self._flag().wait(max(0.0, seconds))

    def wait_for_work(self, seconds: float) -> bool:
        """Wait until :meth:`wake` or the stop (True) or ``seconds`` (False). A wake that came
        while the loop was busy is not lost: it returns at once."""
        woken = self.__wake.wait(max(0.0, seconds))
        self.__wake.clear()
        return woken

    def _flag(self) -> threading.Event:
        flag: threading.Event | None = getattr(self.__own, "stop", None)
        return flag if flag is not None else self.__stop

    def _main(self, stop: threading.Event) -> None:
        self.__own.stop = stop
        self.run()
