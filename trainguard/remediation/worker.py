"""The executor worker: runs queued actions one at a time, in order, exactly once.

The worker claims an action by committing ``running`` together with the executor's snapshot, then
executes, then commits the outcome. At start-up, actions found ``running`` (the previous process
died between claiming and recording) are executed again from their stored snapshot; executors
are idempotent given a snapshot, so the effect happens once. Queued actions whose alert resolved
in the meantime were cancelled by the webhook and are not claimed. The worker also sweeps firing
alerts for plan steps whose ``after_seconds`` has passed.

An action of an :class:`~trainguard.remediation.executors.AwaitingExecutor` (a directive) stays
``running`` after its execution, which is stored with it, until its executor reports it finished
(the ranks acknowledged it, or it timed out). The worker does not block on it: it looks again
when an acknowledgement arrives or the executor's next deadline passes, and meanwhile runs other
plans' actions. Later steps of the same plan wait for it. A restarted worker finds the stored
execution and resumes the wait instead of executing again.

Replicas sharing one Postgres database all accept webhooks, but only one worker executes: it
holds the store's advisory lock (:meth:`Store.hold_worker_lock`) and checks that it still does
before each claim; the others stand by and look again every second. Claims are compare-and-set
updates, so no two workers claim one action. The actions left ``running`` are a take-over's
danger: the replica that lost the lock (its session dropped, its process alive) may still be
executing one. So a worker that takes the lock resumes them only after ``takeover_grace``
seconds, longer than an execution may take plus the time a lost session takes to notice; new
actions run meanwhile. A worker that keeps the lock resumes at once after a failure of its own
(a claim or an outcome whose commit failed leaves its action ``running``).
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from sqlalchemy import Connection, text

from trainguard import contract
from trainguard.background import BackgroundThread
from trainguard.events import log_event
from trainguard.remediation import incidents, queries
from trainguard.remediation.decisions import record_transition, set_state
from trainguard.remediation.engine import Engine
from trainguard.remediation.executors import (
    ActionRecord,
    AwaitingExecutor,
    ExecutionError,
    Executor,
    Finished,
    Waiting,
)
from trainguard.remediation.metrics import Metrics
from trainguard.remediation.models import ActionState
from trainguard.remediation.store import Store

log = logging.getLogger(__name__)

# The audit trail's entry for an action carried out that now waits for others to report back.
WAITING = "waiting"
_RETRY_SECONDS = 1.0
# How often a standby replica's worker tries to take the lock over.
_STANDBY_SECONDS = 1.0
_RECORD_WAIT = text(
    "UPDATE actions SET output = :output, updated_at = :updated_at "
    "WHERE id = :id AND state = :running"
)


class Worker(BackgroundThread):
    """Executes the queued actions, one at a time, on its own thread (on Postgres, in the one
    replica that holds the workers' lock)."""

    def __init__(
        self,
        store: Store,
        engine: Engine,
        executors: Mapping[str, Executor],
        metrics: Metrics,
        *,
        sweep_interval: float = 5.0,
        takeover_grace: float = 0.0,
        on_finished: Callable[[ActionRecord], None] | None = None,
    ) -> None:
        super().__init__("trainguard-remediation-worker")
        self._store = store
        self._engine = engine
        self._executors = executors
        self._metrics = metrics
        self._sweep_interval = sweep_interval
        self._takeover_grace = takeover_grace
        # Told about every action whose outcome was committed (the diagnose reports).
        self._on_finished = on_finished
        # Waiting actions -> when (time.time()) to look at them again; the store holds their
        # state, this only saves looking at each one on every turn of the loop.
        self._recheck_at: dict[int, float] = {}
        # Waiting actions that got an acknowledgement since the worker last looked.
        self._acknowledged: set[int] = set()
        self._acknowledged_lock = threading.Lock()

    def acknowledged(self, action_id: int) -> None:
        """Thread-safe: a rank acknowledged the directive of ``action_id``; look at it now."""
        with self._acknowledged_lock:
            self._acknowledged.add(action_id)
        self.wake()

    def run(self) -> None:
        next_sweep = 0.0
        holding = False
        # When to look for actions left running (monotonic); None: nothing to look for.
        resume_at: float | None = None
        while not self.stopping:
            try:
                if not self._store.hold_worker_lock():
                    # Another replica's worker executes; when it dies, this one takes over.
                    holding = False
                    self._recheck_at.clear()
                    self.sleep(_STANDBY_SECONDS)
                    continue
                if not holding:
                    holding = True
                    resume_at = time.monotonic() + self._takeover_grace
                if resume_at is not None and time.monotonic() >= resume_at:
                    for action_id in self._store.read(
                        lambda conn: queries.ids_in_state(conn, ActionState.RUNNING, 10_000)
                    ):
                        self._resume(action_id)
                    resume_at = None
                if time.monotonic() >= next_sweep:
                    planned = self._store.write_sync(self._engine.sweep())
                    self._metrics.record_decisions(planned.decisions)
                    next_sweep = time.monotonic() + self._sweep_interval
                while not self.stopping:
                    self.check_waiting()
                    if not self._store.hold_worker_lock() or not self.run_next():
                        break
            except Exception:
                # A store or executor failure must not end the worker; it retries after a pause
                # and looks again for an action it may have left running.
                log.exception("remediation worker iteration failed")
                if resume_at is None:
                    resume_at = time.monotonic()
                self.sleep(1.0)
                continue
            timeout = next_sweep - time.monotonic()
            if resume_at is not None:
                timeout = min(timeout, resume_at - time.monotonic())
            if self._recheck_at:
                timeout = min(timeout, min(self._recheck_at.values()) - time.time())
            self.wait_for_work(timeout)

    def run_next(self) -> bool:
        """Claim and execute the oldest runnable queued action; False when there is none."""
        action_id = self._store.read(queries.next_runnable)
        if action_id is None:
            return False
        record, _ = self._store.read(lambda conn: queries.action_record(conn, action_id))
        executor = self._executors.get(record.executor)
        try:
            if executor is None or record.action not in executor.actions:
                raise ExecutionError(f"executor {record.executor!r} cannot {record.action.value}")
            snapshot = executor.prepare(record)
        except Exception as exc:
            self._finish(record, None, exc, 0.0, claim=True)
            return True
        claimed = self._store.write_sync(
            lambda conn: set_state(
                conn,
                action_id,
                ActionState.RUNNING,
                f"executing on {record.executor}",
                expect=(ActionState.QUEUED,),
                snapshot=json.dumps(snapshot),
            )
        )
        if claimed:
            self._execute(executor, record, snapshot)
        return True

    def check_waiting(self) -> None:
        """Finish the waiting actions whose executor says they are done."""
        now = time.time()
        with self._acknowledged_lock:
            due, self._acknowledged = self._acknowledged, set()
        due.update(action_id for action_id, at in self._recheck_at.items() if at <= now)
        for action_id in sorted(due):
            self._recheck_at.pop(action_id, None)
            try:
                self._check(action_id)
            except Exception:
                # Looked at again shortly: a waiting action must never be forgotten.
                log.exception("checking on waiting action %d failed", action_id)
                self._recheck_at[action_id] = now + _RETRY_SECONDS

    def _resume(self, action_id: int) -> None:
        if action_id in self._recheck_at:
            return  # a wait this worker follows already
        record, snapshot = self._store.read(lambda conn: queries.action_record(conn, action_id))
        executor = self._executors.get(record.executor)
        if executor is None or snapshot is None:
            error = ExecutionError(f"cannot resume: executor {record.executor!r} unavailable")
            self._finish(record, None, error, 0.0, claim=False)
            return
        output = self._store.read(lambda conn: queries.awaited_output(conn, action_id))
        if output is not None and isinstance(executor, AwaitingExecutor):
            # Carried out before the restart: wait on, from the stored execution.
            self._store.write_sync(
                lambda conn: record_transition(
                    conn,
                    action_id,
                    WAITING,
                    "resumed (restart, take-over or failed commit): still waiting, not re-executed",
                )
            )
            self._recheck_at[action_id] = 0.0
            return
        self._store.write_sync(
            lambda conn: set_state(
                conn,
                action_id,
                ActionState.RUNNING,
                "resumed (restart, take-over or failed commit): re-executing from the "
                "stored snapshot",
                expect=(ActionState.RUNNING,),
            )
        )
        self._execute(executor, record, snapshot)

    def _execute(
        self, executor: Executor, record: ActionRecord, snapshot: Mapping[str, Any]
    ) -> None:
        started = time.perf_counter()
        try:
            output = executor.execute(record, snapshot)
        except Exception as exc:
            self._finish(record, None, exc, time.perf_counter() - started, claim=False)
            return
        if not isinstance(executor, AwaitingExecutor):
            self._finish(record, output, None, time.perf_counter() - started, claim=False)
            return
        try:
            progress: Waiting | Finished | None = executor.progress(record, output, time.time())
        except Exception:
            log.exception("action %d: cannot tell what it waits for", record.id)
            progress = None
        note = progress.note if isinstance(progress, Waiting) else "carried out; waiting"

        def wait(conn: Connection) -> bool:
            updated = conn.execute(
                _RECORD_WAIT,
                {
                    "output": json.dumps(output),
                    "updated_at": time.time(),
                    "id": record.id,
                    "running": ActionState.RUNNING.value,
                },
            ).rowcount
            if updated:
                record_transition(conn, record.id, WAITING, note)
            return bool(updated)

        if self._store.write_sync(wait):
            self._recheck_at[record.id] = 0.0  # on the loop's next turn, before the next action

    def _check(self, action_id: int) -> None:
        """Finish a waiting action if it is done, else remember when to look again."""
        output = self._store.read(lambda conn: queries.awaited_output(conn, action_id))
        if output is None:
            return  # finished already (an acknowledgement that came after the outcome)
        record, _ = self._store.read(lambda conn: queries.action_record(conn, action_id))
        executor = self._executors.get(record.executor)
        if not isinstance(executor, AwaitingExecutor):
            unavailable = ExecutionError(f"cannot wait: executor {record.executor!r} unavailable")
            self._finish(record, None, unavailable, 0.0, claim=False)
            return
        progress = executor.progress(record, output, time.time())
        if not isinstance(progress, Finished):
            self._recheck_at[action_id] = progress.until
            return
        error = None if progress.succeeded else ExecutionError(progress.note)
        self._finish(
            record, progress.output, error, progress.seconds, claim=False, note=progress.note
        )

    def _finish(
        self,
        record: ActionRecord,
        output: dict[str, Any] | None,
        error: BaseException | None,
        seconds: float,
        *,
        claim: bool,
        note: str = "done",
    ) -> None:
        expect = (ActionState.QUEUED,) if claim else (ActionState.RUNNING,)
        if error is None:
            state, body = ActionState.SUCCEEDED, output or {}
        else:
            note = str(error) if isinstance(error, ExecutionError) else repr(error)
            state, body = ActionState.FAILED, {**(output or {}), "error": note}

        def unit(conn: Connection) -> None:
            if set_state(conn, record.id, state, note, expect=expect, output=json.dumps(body)):
                # A node removed from its job, an incident paged: with the outcome, or not at all.
                incidents.action_finished(conn, record, state, time.time())

        self._store.write_sync(unit)
        outcome = contract.EventOutcome.SUCCESS if error is None else contract.EventOutcome.FAILURE
        action = record.action.value
        self._metrics.actions_executed.labels(action, record.executor, outcome.value).inc()
        self._metrics.action_duration.labels(record.executor).observe(seconds)
        log_event(
            f"action {record.id} {action} on {record.executor}: {state.value}",
            contract.EventKind.ACTION,
            level=logging.INFO if error is None else logging.WARNING,
            logger=log,
            job_id=record.labels.get(contract.LABEL_JOB_ID),
            node=record.labels.get(contract.LABEL_NODE),
            outcome=outcome,
            failure=record.failure,
            details={"action_id": record.id, "action": action, "output": body},
        )
        if self._on_finished is not None:
            try:
                self._on_finished(record)
            except Exception:
                log.exception("after-action hook failed for action %d", record.id)
