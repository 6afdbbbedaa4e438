"""Registering a ``/metrics`` target with the remediation service's HTTP service discovery.

A :class:`Registration` keeps one target (``host:port``) and its labels in one of the service's
target lists (``contract.DiscoveryKind``; ``POST /v1/discovery/<kind>``) from :meth:`start` to
:meth:`stop`. A daemon thread registers it at once and renews it about every third of its TTL,
so the service, and Prometheus through ``http_sd_configs``, drops a process that died without
deregistering once its TTL has passed; :meth:`stop` deregisters at once
(``DELETE /v1/discovery/<kind>?target=``). Every failure is handed to ``on_error`` and retried,
sooner than the next heartbeat; nothing raises into the caller.

The standard library only: the training hook and the node exporter both use it, and neither
takes a dependency for it.
"""

from __future__ import annotations

import json
import logging
import random
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Mapping

from trainguard import contract
from trainguard.background import BackgroundThread

log = logging.getLogger(__name__)

DEFAULT_TTL_SECONDS = 60.0
# The service refuses shorter registrations (trainguard.remediation.discovery).
MIN_TTL_SECONDS = 1.0
# A failed attempt is retried after 1 s, then 2, 4, ... up to one heartbeat.
_RETRY_INITIAL_SECONDS = 1.0
# The most a request may take; less when the heartbeat is shorter.
_REQUEST_TIMEOUT_SECONDS = 10.0
# What the deregistration may still take once stop's timeout is spent.
_LAST_REQUEST_SECONDS = 0.5

ErrorCallback = Callable[[BaseException], None]


# How long stop() may take by default (a deregistration that times out is left to the TTL).
_STOP_SECONDS = 2.0


class RegistrationError(RuntimeError):
    """The service answered with an error status; the message carries its explanation."""


def heartbeat_seconds(ttl_seconds: float) -> float:
    """How often a registration of ``ttl_seconds`` is renewed: a third of it, so that two
    renewals in a row may fail before it expires."""
    return ttl_seconds / 3


class Registration(BackgroundThread):
    """One target kept registered; ``start`` and ``stop`` are idempotent and never raise."""

    def __init__(
        self,
        url: str,
        kind: contract.DiscoveryKind,
        target: str,
        labels: Mapping[str, str],
        *,
        token: str | None = None,
        ttl_seconds: float = DEFAULT_TTL_SECONDS,
        on_error: ErrorCallback | None = None,
    ) -> None:
        if not MIN_TTL_SECONDS <= ttl_seconds < float("inf"):  # also refuses nan
            raise ValueError(
                f"a discovery TTL of {ttl_seconds} s: expected at least {MIN_TTL_SECONDS:g} s"
            )
        super().__init__("trainguard-discovery")
        self._endpoint = f"{url.rstrip('/')}{contract.DISCOVERY_PATH}/{kind.value}"
        self.target = target
        self._body = json.dumps(
            {"target": target, "labels": dict(labels), "ttl_seconds": ttl_seconds}
        ).encode()
        self._token = token
        self._interval = heartbeat_seconds(ttl_seconds)
        self._timeout = min(_REQUEST_TIMEOUT_SECONDS, self._interval)
        self._on_error = on_error
        # Held around each request, so that a renewal in flight cannot land after the
        # deregistration and bring the target back.
        self._request_lock = threading.Lock()
        self._lock = threading.Lock()
        self._started = self._stopped = False
        self.renewals = 0
        self.failures = 0

    def start(self) -> None:
        """Register and keep renewing; once stopped, a registration stays withdrawn."""
        with self._lock:
            if self._started or self._stopped:
                return
            self._started = True
        super().start()

    def stop(self, timeout: float | None = None) -> None:
        """Stop renewing and deregister, within about ``timeout`` seconds (2 by default; a
        deregistration that fails or times out leaves the target to expire with its TTL)."""
        timeout = _STOP_SECONDS if timeout is None else timeout
        with self._lock:
            if self._stopped:
                return
            self._stopped = True
        # The heartbeat is not waited for: the request lock below waits for a renewal in
        # flight, and the thread leaves at its next look at the flag.
        super().stop(timeout=0)
        if not self._started:  # nothing was registered
            return
        deadline = time.monotonic() + timeout
        # A renewal in flight holds the request lock; one still running at the deadline may
        # land after the deregistration, which the TTL then bounds.
        got_lock = self._request_lock.acquire(timeout=timeout)
        try:
            query = urllib.parse.urlencode({"target": self.target})
            remaining = max(_LAST_REQUEST_SECONDS, deadline - time.monotonic())
            self._request("DELETE", f"{self._endpoint}?{query}", None, remaining)
        except Exception as error:
            self._failed(error)
        finally:
            if got_lock:
                self._request_lock.release()

    # --- the heartbeat thread ------------------------------------------------------------------
    def run(self) -> None:
        retry = _RETRY_INITIAL_SECONDS
        while True:
            with self._request_lock:
                if self.stopping:
                    return
                try:
                    self._request("POST", self._endpoint, self._body, self._timeout)
                except Exception as error:
                    self._failed(error)
                    wait = min(retry, self._interval)
                    retry = min(retry * 2, self._interval)
                else:
                    self.renewals += 1
                    retry = _RETRY_INITIAL_SECONDS
                    wait = self._interval
            # Jitter keeps the ranks of a large job from renewing in lockstep.
            if self.sleep(wait * random.uniform(0.8, 1.0)):
                return

    def _failed(self, error: BaseException) -> None:
        self.failures += 1
        if self._on_error is None:
            return
        try:
            self._on_error(error)
        except Exception:
            log.debug("discovery error callback failed", exc_info=True)

    def _request(self, method: str, url: str, body: bytes | None, timeout: float) -> None:
        request = urllib.request.Request(url, data=body, method=method)
        request.add_header("Accept", "application/json")
        if body is not None:
            request.add_header("Content-Type", "application/json")
        if self._token:
            request.add_header("Authorization", f"Bearer {self._token}")
        try:
            with urllib.request.urlopen(request, timeout=timeout) as response:
                response.read()
        except urllib.error.HTTPError as error:
            detail = error.read()[:1000].decode(errors="replace")
            raise RegistrationError(
                f"{method} {self._endpoint} answered {error.code}: {detail}"
            ) from None
