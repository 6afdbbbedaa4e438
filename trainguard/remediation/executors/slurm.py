"""The Slurm executor, through ``scontrol``.

- ``restart_from_checkpoint``: ``scontrol requeue <job>``; the batch script resumes from its
  last checkpoint when Slurm starts it again.
- ``exclude_node``: drain the node (``scontrol update NodeName=... State=DRAIN``) and requeue the
  job, which Slurm then places on other nodes.
- ``drain_node``: drain the node.
- ``annotate``: set the job's comment.

The Slurm job id is the alert's ``slurm_job_id`` label, else its ``job_id``. A requeue is not
idempotent by itself, so the snapshot records the job's ``Restarts`` count and a retried
execution that finds it already higher does not requeue again. Draining and commenting converge.
"""

from __future__ import annotations

import re
import subprocess
from collections.abc import Mapping
from typing import Any

from trainguard import contract
from trainguard.contract import Action
from trainguard.remediation.executors import ActionRecord, ExecutionError

_RESTARTS = re.compile(r"\bRestarts=(\d+)\b")


class SlurmExecutor:
    name = "slurm"
    actions: frozenset[Action] = frozenset(
        {Action.RESTART_FROM_CHECKPOINT, Action.EXCLUDE_NODE, Action.DRAIN_NODE, Action.ANNOTATE}
    )

    def __init__(self, scontrol: str = "scontrol", timeout: float = 60.0) -> None:
        self._scontrol = scontrol
        self._timeout = timeout

    def _run(self, *args: str) -> str:
        try:
            done = subprocess.run(
                [self._scontrol, *args],
                capture_output=True,
                text=True,
                timeout=self._timeout,
                check=False,
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise ExecutionError(f"scontrol {' '.join(args)}: {exc}") from exc
        if done.returncode != 0:
            raise ExecutionError(
                f"scontrol {' '.join(args)} exited {done.returncode}: {done.stderr.strip()}"
            )
        return done.stdout

    def _restarts(self, job: str) -> int:
        shown = self._run("show", "job", "--oneliner", job)
        match = _RESTARTS.search(shown)
        if match is None:
            raise ExecutionError(f"scontrol show job {job}: no Restarts field in {shown[:200]!r}")
        return int(match.group(1))

    def prepare(self, action: ActionRecord) -> dict[str, Any]:
        job = action.labels.get(contract.LABEL_SLURM_JOB_ID) or action.labels.get(
            contract.LABEL_JOB_ID, ""
        )
        snapshot: dict[str, Any] = {"job": job, "node": action.labels.get(contract.LABEL_NODE, "")}
        if action.action in (Action.RESTART_FROM_CHECKPOINT, Action.EXCLUDE_NODE):
            snapshot["restarts"] = self._restarts(job)
        return snapshot

    def execute(self, action: ActionRecord, snapshot: Mapping[str, Any]) -> dict[str, Any]:
        job, node = str(snapshot["job"]), str(snapshot["node"])
        output: dict[str, Any] = {}
        if action.action in (Action.EXCLUDE_NODE, Action.DRAIN_NODE):
            reason = f"trainguard action {action.id}: {action.alertname}"
            self._run("update", f"NodeName={node}", "State=DRAIN", f"Reason={reason}")
            output["drained"] = node
        if action.action in (Action.RESTART_FROM_CHECKPOINT, Action.EXCLUDE_NODE):
            if self._restarts(job) > int(snapshot["restarts"]):
                output["requeued"] = False  # an earlier attempt already requeued it
            else:
                self._run("requeue", job)
                output["requeued"] = True
            output["job"] = job
        if action.action == Action.ANNOTATE:
            comment = f"trainguard action {action.id}: {action.alertname}"
            self._run("update", f"JobId={job}", f"Comment={comment}")
            output["commented"] = job
        return output
