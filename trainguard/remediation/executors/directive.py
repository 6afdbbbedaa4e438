"""The directive executor: queues an instruction for the ranks of a job, then waits for them.

Ranks long-poll ``GET /v1/directives`` and acknowledge each directive; the queue is a table of
the same store, and the directive's unique ``action_id`` makes queueing idempotent.

A directive action is done only when the ranks say so, so that the next step of its plan (a
restart after ``dump_diagnostics``) cannot kill the workers before they dumped anything. It
succeeds once every targeted rank acknowledged success, and fails as soon as one acknowledges a
failure, or when ``ack_timeout`` passes first (the plan then goes on without it). The targeted
ranks are the alert's rank (``target: alert_rank``) or the ranks polling when the directive was
queued; once one of them acknowledged, a targeted rank that stopped polling (its process died,
its node was excluded) is no longer waited for. When no rank was polling, the targets are
unknown, and the first acknowledgement plus a short ``settle`` for the others' ends the wait.
Every clock starts at the directive's stored ``created_at``, so a restarted service resumes the
wait where it was.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from sqlalchemy import Connection, RowMapping, text

from trainguard import contract
from trainguard.contract import Action
from trainguard.remediation.actions import CATALOG, ActionKind
from trainguard.remediation.executors import ActionRecord, ExecutionError, Finished, Waiting
from trainguard.remediation.models import AckOutcome
from trainguard.remediation.store import Store

# A directive goes to every rank unless the policy step says ``target: alert_rank``.
TARGET_PARAM = "target"
# Queued once per action even when a restarted worker executes it again.
_QUEUE_DIRECTIVE = text("""
    INSERT INTO directives (action_id, job_id, rank, kind, params, created_at)
    VALUES (:action_id, :job_id, :rank, :kind, :params, :created_at)
    ON CONFLICT (action_id) DO NOTHING
    """)
_DIRECTIVE_OF_ACTION = text("SELECT id FROM directives WHERE action_id = :action_id")
_CREATED_AT = text("SELECT created_at FROM directives WHERE id = :id")
_ACKS = text(
    "SELECT rank, outcome, detail, at FROM directive_acks WHERE directive_id = :id ORDER BY at"
)


def _ranks(ranks: Iterable[int]) -> str:
    return ", ".join(str(rank) for rank in sorted(ranks)) or "none"


class DirectiveExecutor:
    name = "directive"
    actions: frozenset[Action] = frozenset(
        name for name, spec in CATALOG.items() if spec.kind is ActionKind.DIRECTIVE
    )

    def __init__(
        self,
        store: Store,
        notify: Callable[[str], None],
        listening: Callable[[str], list[int]],
        *,
        ack_timeout: float,
        settle: float,
    ) -> None:
        self._store = store
        self._notify = notify
        self._listening = listening
        self._ack_timeout = ack_timeout
        self._settle = settle

    def prepare(self, action: ActionRecord) -> dict[str, Any]:
        job_id = action.labels.get(contract.LABEL_JOB_ID, "")
        if not job_id:
            raise ExecutionError("the alert has no job_id label")
        rank: int | None = None
        if action.params.get(TARGET_PARAM) == "alert_rank":
            try:
                rank = int(action.labels.get(contract.LABEL_RANK, ""))
            except ValueError as exc:
                raise ExecutionError("target alert_rank but the alert has no numeric rank") from exc
        ranks = [rank] if rank is not None else self._listening(job_id)
        return {"job_id": job_id, "rank": rank, "ranks": ranks}

    def execute(self, action: ActionRecord, snapshot: Mapping[str, Any]) -> dict[str, Any]:
        params = {k: v for k, v in action.params.items() if k != TARGET_PARAM}
        job_id = str(snapshot["job_id"])

        def unit(conn: Connection) -> int:
            conn.execute(
                _QUEUE_DIRECTIVE,
                {
                    "action_id": action.id,
                    "job_id": job_id,
                    "rank": snapshot["rank"],
                    "kind": action.action.value,
                    "params": json.dumps(params),
                    "created_at": time.time(),
                },
            )
            return int(conn.execute(_DIRECTIVE_OF_ACTION, {"action_id": action.id}).scalar_one())

        directive_id = self._store.write_sync(unit)
        self._notify(job_id)
        return {
            "directive_id": directive_id,
            "job_id": job_id,
            "rank": snapshot["rank"],
            # Snapshots stored before the service knew the polling ranks have none: unknown.
            "ranks": list(snapshot.get("ranks") or []),
        }

    def progress(
        self, action: ActionRecord, output: Mapping[str, Any], now: float
    ) -> Waiting | Finished:
        directive_id = int(output["directive_id"])

        def query(conn: Connection) -> tuple[float, list[RowMapping]]:
            created = conn.execute(_CREATED_AT, {"id": directive_id}).scalar_one()
            acks = conn.execute(_ACKS, {"id": directive_id}).mappings().all()
            return float(created), list(acks)

        created_at, acks = self._store.read(query)
        acked = [int(ack["rank"]) for ack in acks]
        result = {**output, "acknowledged_by": sorted(acked)}
        timeout_at = created_at + self._ack_timeout

        def finished(succeeded: bool, note: str) -> Finished:
            return Finished(succeeded, note, result, max(0.0, now - created_at))

        failure = next((a for a in acks if a["outcome"] == AckOutcome.FAILURE.value), None)
        if failure is not None:
            detail = f": {failure['detail']}" if failure["detail"] else ""
            return finished(
                False, f"rank {failure['rank']} could not carry out {action.action.value}{detail}"
            )
        targets = {int(rank) for rank in output.get("ranks") or []}
        if targets:
            missing = targets.difference(acked)
            # A targeted rank that stopped polling is gone (its process died, or its node was
            # excluded and the job re-formed without it): it will never acknowledge.
            gone = missing.difference(self._listening(str(output["job_id"]))) if acked else set()
            if not missing.difference(gone):
                left = f"; rank(s) {_ranks(gone)} stopped polling" if gone else ""
                return finished(True, f"acknowledged by rank(s) {_ranks(acked)}{left}")
            if now >= timeout_at:
                return finished(
                    False,
                    f"timed out after {self._ack_timeout:g}s: rank(s) {_ranks(missing)} did not "
                    f"acknowledge directive {directive_id} (acknowledged by {_ranks(acked)})",
                )
            # Look again soon: a targeted rank may stop polling before the timeout.
            return Waiting(
                min(timeout_at, now + max(self._settle, 1.0)),
                f"directive {directive_id} queued for rank(s) {_ranks(targets)}; waiting up to "
                f"{self._ack_timeout:g}s for their acknowledgements",
            )
        if acks:
            # Which ranks it reaches is unknown: the others get ``settle`` after the first.
            settled_at = min(float(acks[0]["at"]) + self._settle, timeout_at)
            if now >= settled_at:
                return finished(True, f"acknowledged by rank(s) {_ranks(acked)}")
            return Waiting(settled_at, f"acknowledged by rank(s) {_ranks(acked)}; settling")
        if now >= timeout_at:
            return finished(
                False,
                f"timed out after {self._ack_timeout:g}s: no rank acknowledged directive "
                f"{directive_id} (none of job {output['job_id']}'s ranks was polling)",
            )
        return Waiting(
            timeout_at,
            f"directive {directive_id} queued for every rank of job {output['job_id']} (none "
            f"polling yet); waiting up to {self._ack_timeout:g}s for a first acknowledgement",
        )
