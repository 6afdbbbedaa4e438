"""The directive executor: queues an instruction for the ranks of a job.

Ranks long-poll ``GET /v1/directives`` and acknowledge each directive; the queue is a table of
the same store, and the directive's unique ``action_id`` makes queueing idempotent.
"""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Callable, Mapping
from typing import Any

from trainguard import contract
from trainguard.remediation.actions import CATALOG, ActionKind
from trainguard.remediation.executors import ActionRecord, ExecutionError
from trainguard.remediation.store import Store

# A directive goes to every rank unless the policy step says ``target: alert_rank``.
TARGET_PARAM = "target"


class DirectiveExecutor:
    name = "directive"
    actions = frozenset(name for name, spec in CATALOG.items() if spec.kind is ActionKind.DIRECTIVE)

    def __init__(self, store: Store, notify: Callable[[str], None]) -> None:
        self._store = store
        self._notify = notify

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
        return {"job_id": job_id, "rank": rank}

    def execute(self, action: ActionRecord, snapshot: Mapping[str, Any]) -> dict[str, Any]:
        params = {k: v for k, v in action.params.items() if k != TARGET_PARAM}
        job_id = str(snapshot["job_id"])

        def unit(conn: sqlite3.Connection) -> int:
            conn.execute(
                """
                INSERT OR IGNORE INTO directives (action_id, job_id, rank, kind, params, created_at)
                VALUES (?, ?, ?, ?, ?, ?)
                """,
                (
                    action.id,
                    job_id,
                    snapshot["rank"],
                    action.action,
                    json.dumps(params),
                    time.time(),
                ),
            )
            row = conn.execute(
                "SELECT id FROM directives WHERE action_id = ?", (action.id,)
            ).fetchone()
            return int(row["id"])

        directive_id = self._store.write_sync(unit)
        self._notify(job_id)
        return {"directive_id": directive_id, "job_id": job_id, "rank": snapshot["rank"]}
