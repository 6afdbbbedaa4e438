"""The directive client: how a training rank receives instructions from the remediation service.

A :class:`DirectiveClient` long-polls ``GET /v1/directives?job_id=&rank=`` on a daemon thread,
hands each directive to a callback and acknowledges it (``POST /v1/directives/{id}/ack``) with
the callback's outcome. It never raises into the training process: network and server errors are
logged and retried with capped exponential back-off, and a callback that raises is acknowledged
as a failure. A directive whose acknowledgement could not be delivered is not handed to the
callback a second time when the service offers it again; only the acknowledgement is retried.

Only the standard library is used, so the hook adds no dependency for it.
"""

from __future__ import annotations

import json
import logging
import os
import random
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from trainguard import contract
from trainguard.background import BackgroundThread

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Directive:
    """One instruction: ``kind`` is a directive action of the remediation catalogue
    (``contract.Action``: checkpoint now, dump diagnostics, set gradient compression, split
    micro-batches, set the collective timeout). On the wire it is the action's value."""

    id: int
    kind: contract.Action
    params: Mapping[str, Any] = field(default_factory=dict)


DirectiveCallback = Callable[[Directive], None]


class DirectiveClient(BackgroundThread):
    """Receives directives for one rank of one job; ``start``/``stop`` are idempotent."""

    def __init__(
        self,
        url: str,
        job_id: str,
        rank: int,
        callback: DirectiveCallback,
        *,
        token: str | None = None,
        poll_seconds: float = 25.0,
        backoff_initial: float = 1.0,
        backoff_max: float = 60.0,
    ) -> None:
        super().__init__(f"trainguard-directives-rank{rank}")
        self._base = url.rstrip("/")
        self._job_id = job_id
        self._rank = rank
        self._callback = callback
        self._token = token
        self._poll_seconds = poll_seconds
        self._backoff_initial = backoff_initial
        self._backoff_max = backoff_max
        # Directives handled whose ack has not reached the service yet.
        self._unacked: dict[int, tuple[str, str]] = {}
        self.handled = 0
        self.errors = 0

    @classmethod
    def from_env(
        cls, callback: DirectiveCallback, environ: Mapping[str, str] | None = None
    ) -> DirectiveClient | None:
        """A client configured from torchrun's and trainguard's variables; None when
        ``TRAINGUARD_REMEDIATION_URL`` is unset."""
        env = os.environ if environ is None else environ
        url = env.get(contract.ENV_REMEDIATION_URL)
        if not url:
            return None
        return cls(
            url,
            env.get(contract.ENV_JOB_ID) or env.get("TORCHELASTIC_RUN_ID", "unknown"),
            int(env.get("RANK", "0")),
            callback,
            token=env.get(contract.ENV_REMEDIATION_TOKEN) or None,
        )

    @property
    def running(self) -> bool:
        return self.alive

    def stop(self, timeout: float | None = None) -> None:
        """Stop polling. A long-poll in flight is abandoned (the thread is a daemon); the
        thread is joined for at most ``timeout`` seconds (default: one poll plus a margin)."""
        super().stop(self._poll_seconds + 5.0 if timeout is None else timeout)

    # --- the polling thread ----------------------------------------------------------------
    def run(self) -> None:
        delay = self._backoff_initial
        while not self.stopping:
            try:
                for offered in self._poll():
                    if self.stopping:
                        return
                    self._handle(offered)
            except Exception as exc:
                self.errors += 1
                if self.errors == 1 or self.errors % 100 == 0:
                    log.warning("directive poll failed (%d so far): %r", self.errors, exc)
                # Jitter keeps thousands of ranks from retrying in lockstep after an outage.
                self.sleep(delay * random.uniform(0.5, 1.0))
                delay = min(delay * 2, self._backoff_max)
            else:
                delay = self._backoff_initial

    def _request(self, method: str, path: str, body: Any = None, timeout: float = 10.0) -> Any:
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(self._base + path, data=data, method=method)
        request.add_header("Accept", "application/json")
        if data is not None:
            request.add_header("Content-Type", "application/json")
        if self._token:
            request.add_header("Authorization", f"Bearer {self._token}")
        with urllib.request.urlopen(request, timeout=timeout) as response:
            raw = response.read()
        return json.loads(raw) if raw else None

    def _poll(self) -> list[Mapping[str, Any]]:
        """The directives offered to this rank, as the service sent them."""
        query = urllib.parse.urlencode(
            {"job_id": self._job_id, "rank": self._rank, "wait": self._poll_seconds}
        )
        document = self._request("GET", f"/v1/directives?{query}", timeout=self._poll_seconds + 10)
        return list(document["directives"])

    def _carry_out(self, directive_id: int, offered: Mapping[str, Any]) -> tuple[str, str]:
        """Hand the directive to the callback; its acknowledgement's outcome and detail."""
        try:
            kind = contract.Action(str(offered["kind"]))
        except ValueError:
            # A service newer than this rank's trainguard: refuse it rather than stall on it.
            detail = f"unknown directive kind {offered['kind']!r} on this rank"
            log.warning("directive %s: %s", directive_id, detail)
            return "failure", detail
        directive = Directive(directive_id, kind, dict(offered.get("params") or {}))
        try:
            self._callback(directive)
        except Exception as exc:
            log.warning("directive %s (%s) failed: %r", directive_id, kind.value, exc)
            return "failure", repr(exc)[:4000]
        return "success", ""

    def _handle(self, offered: Mapping[str, Any]) -> None:
        directive_id = int(offered["id"])
        if directive_id not in self._unacked:
            self._unacked[directive_id] = self._carry_out(directive_id, offered)
            self.handled += 1
        outcome, detail = self._unacked[directive_id]
        body = {"rank": self._rank, "outcome": outcome, "detail": detail}
        try:
            self._request("POST", f"/v1/directives/{directive_id}/ack", body)
        except urllib.error.HTTPError as exc:
            if exc.code != 404:
                raise
        del self._unacked[directive_id]
