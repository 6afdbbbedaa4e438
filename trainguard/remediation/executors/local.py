"""The local executor: jobs launched with ``torchrun`` (elastic) on this host.

torchrun's elastic agent already knows how to recover: when a worker dies it stops the worker
group, re-rendezvouses and starts it again (up to ``--max-restarts``); when a whole agent goes
away, the surviving agents' workers fail, and they re-rendezvous with the nodes that are left as
long as at least the minimum of ``--nnodes MIN:MAX`` remain. The executor only gives the push:

- ``restart_from_checkpoint`` terminates the job's worker processes on this host, so their agents
  restart the worker group; the training script resumes from its last checkpoint.
- ``exclude_node`` terminates the agent of the alert's node (which takes its workers with it).

Processes are found by their environment: workers carry ``TRAINGUARD_JOB_ID`` and torchrun's
``LOCAL_RANK``/``TORCHELASTIC_RUN_ID``; their parent is the agent; ``TRAINGUARD_NODE`` (or the
host name) says which node an agent stands for. A snapshot records each target's pid and start
time, so a retried execution never signals a process that merely reused a pid.
"""

from __future__ import annotations

import os
import signal
import socket
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import psutil

from trainguard import contract
from trainguard.contract import Action
from trainguard.remediation.executors import ActionRecord, ExecutionError


@dataclass(frozen=True)
class _Worker:
    pid: int
    create_time: float
    agent_pid: int
    node: str


def _workers(job_id: str) -> list[_Worker]:
    found = []
    for proc in psutil.process_iter(["pid", "ppid", "create_time", "environ"]):
        env = proc.info.get("environ")
        if not env or env.get(contract.ENV_JOB_ID) != job_id:
            continue
        if "LOCAL_RANK" not in env or "TORCHELASTIC_RUN_ID" not in env:
            continue
        node = env.get(contract.ENV_NODE) or socket.gethostname()
        found.append(_Worker(proc.info["pid"], proc.info["create_time"], proc.info["ppid"], node))
    return found


def _signal_if_same(pid: int, create_time: float, signum: int) -> bool:
    """Signal the process if it is still the one the snapshot saw; False if it is gone."""
    try:
        proc = psutil.Process(pid)
        if abs(proc.create_time() - create_time) > 0.01:
            return False
        proc.send_signal(signum)
    except (psutil.NoSuchProcess, ProcessLookupError):
        return False
    return True


class LocalExecutor:
    name = "local"
    actions: frozenset[Action] = frozenset({Action.RESTART_FROM_CHECKPOINT, Action.EXCLUDE_NODE})

    def prepare(self, action: ActionRecord) -> dict[str, Any]:
        job_id = action.labels.get(contract.LABEL_JOB_ID, "")
        workers = _workers(job_id)
        if not workers:
            raise ExecutionError(f"no torchrun worker of job {job_id!r} runs on this host")
        if action.action == Action.RESTART_FROM_CHECKPOINT:
            return {"targets": [[w.pid, w.create_time] for w in workers], "signal": "SIGTERM"}
        node = action.labels.get(contract.LABEL_NODE, "")
        agents = sorted({w.agent_pid for w in workers if w.node == node})
        if not agents:
            nodes = sorted({w.node for w in workers})
            raise ExecutionError(f"job {job_id!r} has no agent for node {node!r} (nodes: {nodes})")
        targets = [[pid, psutil.Process(pid).create_time()] for pid in agents]
        return {"targets": targets, "signal": "SIGTERM", "node": node}

    def execute(self, action: ActionRecord, snapshot: Mapping[str, Any]) -> dict[str, Any]:
        signum = signal.Signals[str(snapshot["signal"])]
        signalled: list[int] = []
        gone: list[int] = []
        for pid, create_time in snapshot["targets"]:
            if pid == os.getpid():
                raise ExecutionError("refusing to signal the remediation service itself")
            (signalled if _signal_if_same(int(pid), float(create_time), signum) else gone).append(
                int(pid)
            )
        return {"signal": signum.name, "signalled": signalled, "already_gone": gone}
