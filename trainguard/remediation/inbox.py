"""The webhook's inbox: a notification is committed as received, answered, and decided after.

``POST /v1/alertmanager`` validates the notification and commits it, byte for byte, to the
``inbox`` table; its 200 means that commit happened. The store's writer commits every request
waiting at that moment in one transaction, so a burst shares its fsyncs. The policy, the guards
and the incidents decide the notification afterwards on the :class:`Decider`'s thread: deciding
a notification of ten alerts costs several times what accepting it does, and on the request path
it held Alertmanager (and every notification behind it) for all of that.

The decider takes undecided entries in id order, which is commit order (one writer per process;
on Postgres every writer takes the writers' lock first and holds it to the commit), so the
notifications of an alert group are decided in the order they were accepted. Each is decided in
one unit of work: its alerts stored, its actions decided as at its acceptance (``accepted_at`` is
the decision's moment, so cooldowns and ``after_seconds`` count from when Alertmanager sent it,
however long it waited) and the entry marked decided, all committed together or not at all. At
start-up the decider begins with whatever a previous process left undecided.

A notification whose unit fails (a bug, data the database refuses) is tried ``_ATTEMPTS`` times
and then marked failed: kept with its body and the error, counted by the
``..._inbox_failed`` gauge, and no longer holding back those behind it. A batch that did not
commit (the database unreachable) is no fault of the notification: the decider waits and tries
it again for as long as that lasts.

Accepting comes first: while notifications keep arriving, the decider pauses after each
decision (:func:`pause`), so a storm is accepted at the rate the store commits and decided
behind it. Within ``decide_within`` seconds of lag (the age of the oldest undecided entry) it
all but stops; past that it takes a fifth of the time, so the lag of a long storm grows no
faster than it must. The inbox's depth, its oldest entry's age and the accepted-to-decided
histogram show how far behind.

Replicas sharing a Postgres database each drain the inbox; a unit marks its entry decided only
while it is undecided, else it is rolled back, so each notification is decided once.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError
from sqlalchemy import Connection, text

from trainguard import contract
from trainguard.background import BackgroundThread
from trainguard.events import log_event
from trainguard.remediation.decisions import Planned
from trainguard.remediation.engine import Engine
from trainguard.remediation.models import (
    NotificationView,
    WebhookPayload,
    WebhookResult,
)
from trainguard.remediation.sql import Statement
from trainguard.remediation.store import CommitError, Store, StoreError

if TYPE_CHECKING:  # the metrics read the inbox's lag from here
    from trainguard.remediation.metrics import Metrics

log = logging.getLogger(__name__)

# Entries read per query; each is still decided (and committed) on its own.
_READ_BATCH = 64
# How often the decider looks for entries nobody woke it for (another replica's, on Postgres).
_POLL_SECONDS = 1.0
_RETRY_SECONDS = 1.0
# While notifications keep arriving, the decider pauses after each decision for a multiple of
# the decision's duration: accepting (what Alertmanager waits for) gets the CPU, the interpreter
# and the store's writer first; with no notification arriving it decides flat out. Within the
# lag allowed (decide_within) deciding takes 1 / (1 + _DEFER) of the time: its units hold the
# writer for milliseconds, and every answer queued behind one waits that long (measured with
# benchmarks/remediation_load.py on an idle machine, rounds against the floor: deciding at a
# fifth throughout, 0.64-0.72 of its alerts/s and p99 1.68-1.93x; at 1/51, 0.72-0.87 and
# 1.18-1.62x). Past it, 1 / (1 + _YIELD), so the inbox keeps draining however long a storm
# lasts.
_DEFER = 50.0
_YIELD = 4.0
# Tries of a notification whose unit fails before it is marked failed.
_ATTEMPTS = 3

_APPEND = Statement(
    "INSERT INTO inbox (body, group_key, alerts, accepted_at) "
    "VALUES (:body, :group_key, :alerts, :accepted_at) RETURNING id"
)
_DECIDED = Statement(
    "UPDATE inbox SET decided_at = :at, result = :result, body = NULL "
    "WHERE id = :id AND decided_at IS NULL"
)
_FAILED = Statement(
    "UPDATE inbox SET decided_at = :at, error = :error WHERE id = :id AND decided_at IS NULL"
)
_LAST = text("SELECT COALESCE(MAX(id), 0) FROM inbox")
_UNDECIDED = text(
    "SELECT id, body, accepted_at FROM inbox WHERE decided_at IS NULL ORDER BY id LIMIT :limit"
)
_LAG = text("SELECT COUNT(*), MIN(accepted_at) FROM inbox WHERE decided_at IS NULL")
_FAILED_COUNT = text("SELECT COUNT(*) FROM inbox WHERE error IS NOT NULL")
_VIEW = text(
    "SELECT id, group_key, alerts, accepted_at, decided_at, result, error FROM inbox WHERE id = :id"
)


class _TakenError(Exception):
    """Another replica decided the entry first: this unit's work is rolled back."""


def accept(body: bytes, payload: WebhookPayload, at: float) -> Callable[[Connection], int]:
    """The unit that commits a notification to the inbox; it returns the entry's id."""

    def unit(conn: Connection) -> int:
        row = _APPEND.first(
            conn,
            {
                "body": body,
                "group_key": payload.group_key,
                "alerts": len(payload.alerts),
                "accepted_at": at,
            },
        )
        assert row is not None  # RETURNING of one inserted row
        return int(row[0])

    return unit


def decide(
    engine: Engine, entry_id: int, payload: WebhookPayload, accepted_at: float
) -> Callable[[Connection], tuple[WebhookResult, Planned, float]]:
    """The unit that decides an inbox entry as at its acceptance and marks it decided; it
    returns the decision and when it was made. Raises _TakenError when it was decided already."""
    ingest = engine.ingest(payload, now=accepted_at)

    def unit(conn: Connection) -> tuple[WebhookResult, Planned, float]:
        result, planned = ingest(conn)
        at = time.time()
        marked = _DECIDED.run(conn, {"id": entry_id, "at": at, "result": result.model_dump_json()})
        if not marked:
            raise _TakenError(entry_id)
        return result, planned, at

    return unit


def has_nul(payload: WebhookPayload) -> bool:
    """Whether any text of the notification holds a NUL character (Postgres stores none)."""

    def strings(value: Any) -> Iterator[str]:
        if isinstance(value, str):
            yield value
        elif isinstance(value, dict):
            for key, item in value.items():
                yield from strings(key)
                yield from strings(item)
        elif isinstance(value, list):
            for item in value:
                yield from strings(item)

    return any("\x00" in text for text in strings(payload.model_dump(mode="json")))


def lag(conn: Connection, now: float) -> tuple[int, float]:
    """Undecided entries, and how long the oldest of them has waited (0 when none)."""
    count, oldest = conn.execute(_LAG).one()
    return int(count), 0.0 if oldest is None else max(0.0, now - float(oldest))


def failed_count(conn: Connection) -> int:
    return int(conn.execute(_FAILED_COUNT).scalar_one())


def view(conn: Connection, entry_id: int) -> NotificationView | None:
    row = conn.execute(_VIEW, {"id": entry_id}).mappings().first()
    if row is None:
        return None
    return NotificationView(
        id=row["id"],
        group_key=row["group_key"],
        alerts=row["alerts"],
        accepted_at=_time(row["accepted_at"]),
        decided_at=None if row["decided_at"] is None else _time(row["decided_at"]),
        result=None if row["result"] is None else WebhookResult.model_validate_json(row["result"]),
        error=row["error"],
    )


def _time(seconds: float) -> datetime:
    return datetime.fromtimestamp(seconds, tz=timezone.utc)


def pause(took: float, behind: float, decide_within: float) -> float:
    """Seconds the decider waits, while notifications keep arriving, after a decision that
    took ``took`` seconds, of an entry accepted ``behind`` seconds ago."""
    return took * (_DEFER if behind < decide_within else _YIELD)


class Decider(BackgroundThread):
    """Drains the inbox in order on a thread of its own; see the module's docstring."""

    def __init__(
        self,
        store: Store,
        engine: Engine,
        metrics: Metrics,
        *,
        wake_worker: Callable[[], None],
        decide_within: float,
    ) -> None:
        super().__init__("trainguard-remediation-decider")
        self._store = store
        self._decide_within = decide_within
        self._engine = engine
        self._metrics = metrics
        self._wake_worker = wake_worker
        # The highest id this process accepted, and the id every entry up to which is decided
        # (or failed): what drain() and wait() compare.
        self._progress = threading.Condition()
        self._accepted = 0
        self._through = 0

    def accepted(self, entry_id: int) -> None:
        """Thread-safe: ``entry_id`` was committed to the inbox; decide it."""
        with self._progress:
            self._accepted = max(self._accepted, entry_id)
        self.wake()

    def wait(self, entry_id: int, timeout: float) -> bool:
        """Block until ``entry_id`` and every entry before it are decided; False on timeout."""
        with self._progress:
            return self._progress.wait_for(lambda: self._through >= entry_id, timeout)

    def drain(self, timeout: float) -> bool:
        """Block until every notification this process accepted so far is decided (tests and
        shutdown-free checks use it rather than sleeping); False on timeout."""
        with self._progress:
            target = self._accepted
        return self.wait(target, timeout)

    def _advance(self, entry_id: int) -> None:
        with self._progress:
            if entry_id > self._through:
                self._through = entry_id
                self._progress.notify_all()

    def run(self) -> None:
        while not self.stopping:
            try:
                last, entries = self._store.read(self._pending)
            except StoreError:
                log.exception("cannot read the inbox")
                self.sleep(_RETRY_SECONDS)
                continue
            if not entries:
                # Read before the undecided ones, and ids are in commit order: every entry up to
                # it is decided.
                self._advance(last)
                self.wait_for_work(_POLL_SECONDS)
                continue
            for entry_id, body, accepted_at in entries:
                intake = self._accepted
                took = self._decide(entry_id, bytes(body), accepted_at)
                if took is None:
                    return  # stopping: the entry stays undecided for the next start
                self._advance(entry_id)
                if self._accepted != intake:
                    # Notifications arrived meanwhile: the intake comes first.
                    self.sleep(pause(took, time.time() - accepted_at, self._decide_within))

    @staticmethod
    def _pending(conn: Connection) -> tuple[int, list[tuple[int, Any, float]]]:
        last = int(conn.execute(_LAST).scalar_one())
        entries = conn.execute(_UNDECIDED, {"limit": _READ_BATCH}).all()
        return last, [(int(i), body, float(at)) for i, body, at in entries]

    def _decide(self, entry_id: int, body: bytes, accepted_at: float) -> float | None:
        """Decide one entry, or mark it failed; the seconds that took (the waits between
        tries left out), None when stopped before either."""
        started = time.monotonic()
        try:
            payload = WebhookPayload.model_validate_json(body)
        except ValidationError as exc:
            # Validated on its way in: only a model changed across an upgrade refuses it now.
            failed = self._fail(entry_id, f"no longer a valid notification: {exc}")
            return time.monotonic() - started if failed else None
        attempts = 0
        while not self.stopping:
            started = time.monotonic()
            try:
                result, planned, at = self._store.write_sync(
                    decide(self._engine, entry_id, payload, accepted_at)
                )
            except _TakenError:
                return time.monotonic() - started  # another replica decided it
            except CommitError:
                log.warning("inbox entry %d: the store did not commit; retrying", entry_id)
                self.sleep(_RETRY_SECONDS)
                continue
            except Exception as exc:
                attempts += 1
                if attempts < _ATTEMPTS:
                    log.warning("inbox entry %d: deciding failed (%r); retrying", entry_id, exc)
                    self.sleep(_RETRY_SECONDS)
                    continue
                failed = self._fail(entry_id, repr(exc))
                return time.monotonic() - started if failed else None
            self._decided(payload, result, planned, at - accepted_at)
            return time.monotonic() - started
        return None

    def _decided(
        self, payload: WebhookPayload, result: WebhookResult, planned: Planned, lag: float
    ) -> None:
        metrics = self._metrics
        if planned.queued:
            self._wake_worker()
        if result.duplicates:
            metrics.alerts_deduplicated.inc(result.duplicates)
        metrics.record_decisions(planned.decisions)
        metrics.decision_lag.observe(lag)
        # Built only when logged: a notification of ten alerts makes twenty decisions.
        for decided in planned.decided if log.isEnabledFor(logging.INFO) else ():
            action, state = decided.action.value, decided.state.value
            log_event(
                f"decision: {action} -> {state}",
                contract.EventKind.DECISION,
                level=logging.INFO,
                logger=log,
                failure=decided.failure,
                details={"action": action, "state": state, "group_key": payload.group_key},
            )

    def _fail(self, entry_id: int, error: str) -> bool:
        """Keep the entry, with its error, out of the way of those behind it; False when
        stopped before that was committed."""
        log.error("inbox entry %d could not be decided and is kept: %s", entry_id, error)
        while not self.stopping:
            try:
                self._store.write_sync(
                    lambda conn: _FAILED.run(
                        conn, {"id": entry_id, "at": time.time(), "error": error}
                    )
                )
                return True
            except StoreError:
                self.sleep(_RETRY_SECONDS)
        return False
