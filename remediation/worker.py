"""The executor worker: runs queued actions one at a time, in order, exactly once.

The worker claims an action by committing ``running`` together with the executor's snapshot, then
executes, then commits the outcome. At start-up, actions found ``running`` (the previous process
died between claiming and recording) are executed again from their stored snapshot; executors
are idempotent given a snapshot, so the effect happens once. Queued actions whose alert resolved
in the meantime were cancelled by the webhook and are not claimed. The worker also sweeps firing
alerts for plan steps whose ``after_seconds`` has passed.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from trainguard import contract
from trainguard.events import log_event
from trainguard.remediation import queries
from trainguard.remediation.engine import Engine, set_state
from trainguard.remediation.executors import ActionRecord, ExecutionError, Executor
from trainguard.remediation.metrics import Metrics
from trainguard.remediation.models import ActionState
from trainguard.remediation.store import Store

log = logging.getLogger(__name__)


class Worker:
    def __init__(
        self,
        store: Store,
        engine: Engine,
        executors: Mapping[str, Executor],
        metrics: Metrics,
        *,
        sweep_interval: float = 5.0,
        on_finished: Callable[[ActionRecord], None] | None = None,
    ) -> None:
        self._store = store
        self._engine = engine
        self._executors = executors
        self._metrics = metrics
        self._sweep_interval = sweep_interval
        # Told about every action whose outcome was committed (the diagnose reports).
        self._on_finished = on_finished
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(
                target=self._run, name="trainguard-remediation-worker", daemon=True
            )
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    def wake(self) -> None:
        self._wake.set()

    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def _run(self) -> None:
        next_sweep = 0.0
        resumed = False
        while not self._stop.is_set():
            try:
                if not resumed:
                    for action_id in self._store.read(
                        lambda conn: queries.ids_in_state(conn, ActionState.RUNNING, 10_000)
                    ):
                        self._resume(action_id)
                    resumed = True
                if time.monotonic() >= next_sweep:
                    planned = self._store.write_sync(self._engine.sweep())
                    self._metrics.record_decisions(planned.decisions)
                    next_sweep = time.monotonic() + self._sweep_interval
                self._wake.clear()
                while not self._stop.is_set() and self.run_next():
                    pass
            except Exception:
                # A store or executor failure must not end the worker; it retries after a pause.
                log.exception("remediation worker iteration failed")
                self._stop.wait(1.0)
                continue
            self._wake.wait(timeout=max(0.0, next_sweep - time.monotonic()))

    def run_next(self) -> bool:
        """Claim and execute the oldest queued action; False when there is none."""
        ids = self._store.read(lambda conn: queries.ids_in_state(conn, ActionState.QUEUED))
        if not ids:
            return False
        action_id = ids[0]
        record, _ = self._store.read(lambda conn: queries.action_record(conn, action_id))
        executor = self._executors.get(record.executor)
        try:
            if executor is None or record.action not in executor.actions:
                raise ExecutionError(f"executor {record.executor!r} cannot {record.action}")
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

    def _resume(self, action_id: int) -> None:
        record, snapshot = self._store.read(lambda conn: queries.action_record(conn, action_id))
        executor = self._executors.get(record.executor)
        if executor is None or snapshot is None:
            error = ExecutionError(f"cannot resume: executor {record.executor!r} unavailable")
            self._finish(record, None, error, 0.0, claim=False)
            return
        self._store.write_sync(
            lambda conn: set_state(
                conn,
                action_id,
                ActionState.RUNNING,
                "resumed after restart: re-executing from the stored snapshot",
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
        else:
            self._finish(record, output, None, time.perf_counter() - started, claim=False)

    def _finish(
        self,
        record: ActionRecord,
        output: dict[str, Any] | None,
        error: BaseException | None,
        seconds: float,
        *,
        claim: bool,
    ) -> None:
        expect = (ActionState.QUEUED,) if claim else (ActionState.RUNNING,)
        if error is None:
            state, note, body = ActionState.SUCCEEDED, "done", output or {}
        else:
            detail = str(error) if isinstance(error, ExecutionError) else repr(error)
            state, note, body = ActionState.FAILED, detail, {"error": detail}
        self._store.write_sync(
            lambda conn: set_state(
                conn, record.id, state, note, expect=expect, output=json.dumps(body)
            )
        )
        outcome = contract.EventOutcome.SUCCESS if error is None else contract.EventOutcome.FAILURE
        self._metrics.actions_executed.labels(record.action, record.executor, outcome.value).inc()
        self._metrics.action_duration.labels(record.executor).observe(seconds)
        log_event(
            f"action {record.id} {record.action} on {record.executor}: {state.value}",
            contract.EventKind.ACTION,
            level=logging.INFO if error is None else logging.WARNING,
            logger=log,
            job_id=record.labels.get(contract.LABEL_JOB_ID),
            node=record.labels.get(contract.LABEL_NODE),
            outcome=outcome,
            details={"action_id": record.id, "action": record.action, "output": body},
        )
        if self._on_finished is not None:
            try:
                self._on_finished(record)
            except Exception:
                log.exception("after-action hook failed for action %d", record.id)
