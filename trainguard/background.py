"""``BackgroundThread``: the one way trainguard runs a worker beside the main thread.

Every long-lived worker (the hook's step worker, watchdog and directive client, a rank's or an
exporter's discovery heartbeat, the exporter's sampler, the remediation service's executor
worker, verifier and decider, the log shipper) is a daemon thread with a name, started and
stopped from outside, that sleeps between turns and must wake at once when it is stopped. This
base holds that plumbing, so each worker is only its loop (:meth:`run`):

- :meth:`start` starts the thread (again after a :meth:`stop`); a second call while it runs
  does nothing;
- :meth:`stop` sets the stop flag, wakes the thread and joins it (for ``timeout`` seconds at
  most, never from the thread itself); calling it again, or before :meth:`start`, is harmless;
- inside :meth:`run`, :meth:`sleep` waits until a deadline or the stop, :meth:`wait_for_work`
  until :meth:`wake` is called or the stop, and :attr:`stopping` says whether to leave.

A thread abandoned by a timed-out :meth:`stop` (one blocked in a long poll) keeps its own stop
flag: a later :meth:`start` gives the new thread a fresh one and never revives the old.
"""

from __future__ import annotations

import threading


class BackgroundThread:
    """A named daemon thread running :meth:`run` until :meth:`stop`."""

    def __init__(self, name: str) -> None:
        self.thread_name = name
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._own = threading.local()

    # --- from outside ------------------------------------------------------------------------
    def start(self) -> None:
        with self._lock:
            if self._thread is not None and self._thread.is_alive():
                return
            if self._stop.is_set():
                self._stop = threading.Event()
            thread = threading.Thread(
                target=self._main, args=(self._stop,), name=self.thread_name, daemon=True
            )
            self._thread = thread
        thread.start()

    def stop(self, timeout: float | None = None) -> None:
        """Stop the loop, wake it, and wait ``timeout`` seconds (None: as long as it takes)
        for it to end."""
        with self._lock:
            thread, self._thread = self._thread, None
            self._stop.set()
            self._wake.set()
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)

    def wake(self) -> None:
        """Have :meth:`wait_for_work` return now."""
        self._wake.set()

    @property
    def alive(self) -> bool:
        thread = self._thread
        return thread is not None and thread.is_alive()

    # --- on the thread -------------------------------------------------------------------------
    def run(self) -> None:
        """The worker's loop; return when :attr:`stopping`."""
        raise NotImplementedError

    @property
    def stopping(self) -> bool:
        """Whether this thread was asked to stop."""
        return self._flag().is_set()

    def sleep(self, seconds: float) -> bool:
        """Wait ``seconds`` or until stopped; True when stopped."""
        return self._flag().wait(max(0.0, seconds))

    def wait_for_work(self, seconds: float) -> bool:
        """Wait until :meth:`wake`, ``seconds`` or the stop; True when stopped. A wake that came
        while the loop was busy is not lost: it returns at once."""
        self._wake.wait(max(0.0, seconds))
        self._wake.clear()
        return self.stopping

    def _flag(self) -> threading.Event:
        flag: threading.Event | None = getattr(self._own, "stop", None)
        return flag if flag is not None else self._stop

    def _main(self, stop: threading.Event) -> None:
        self._own.stop = stop
        self.run()
