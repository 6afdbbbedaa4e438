"""The local executor against a real torchrun elastic job on CPU (gloo).

Two torchrun agents on this host stand for two nodes (``TRAINGUARD_NODE``) of one job with
``--nnodes 1:2``. The service restarts the worker group from its checkpoint, then excludes a
node, and the remaining agent carries on alone.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from tests.remediation.conftest import AUTH, alert, notify, payload, serve, wait_for
from trainguard.remediation.settings import Settings

pytest.importorskip("torch")
JOB_SCRIPT = Path(__file__).with_name("elastic_job.py")


def _agent(
    workdir: Path, job_id: str, node: str, port: int, *, host: bool
) -> subprocess.Popen[bytes]:
    env = {
        **os.environ,
        "TRAINGUARD_JOB_ID": job_id,
        "TRAINGUARD_NODE": node,
        "OMP_NUM_THREADS": "1",
        # torch 2.13's shared rendezvous TCP store deadlocks when a node joins a running job
        # (the new node waits for a master address the old rank 0 never republishes).
        "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1",
    }
    command = [
        sys.executable, "-m", "torch.distributed.run",
        "--nnodes", "1:2", "--nproc-per-node", "1", "--max-restarts", "3",
        "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", job_id,
        "--rdzv-conf", ",".join((
            "last_call_timeout=1", "join_timeout=60", f"is_host={int(host)}",
            # A stopped agent drops out of the rendezvous after 5 s instead of 15 s.
            "keep_alive_interval=1", "keep_alive_max_attempt=5",
        )),
        "--monitor-interval", "0.2",
        str(JOB_SCRIPT), str(workdir),
    ]  # fmt: skip
    log = (workdir / f"{node}.log").open("wb")
    return subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT)


def _events(workdir: Path) -> list[dict[str, Any]]:
    path = workdir / "events.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _state(client: TestClient, action_id: int) -> str:
    return str(client.get(f"/v1/actions/{action_id}", headers=AUTH).json()["state"])


def _fire(client: TestClient, name: str, **labels: str) -> dict[str, Any]:
    body = payload(alert(name, fingerprint=uuid.uuid4().hex, **labels))
    (action_id,) = notify(client, body)["planned_actions"]
    wait_for(lambda: _state(client, action_id) in ("succeeded", "failed"), timeout=30)
    view = client.get(f"/v1/actions/{action_id}", headers=AUTH).json()
    assert view["state"] == "succeeded", view
    return dict(view)


def test_restart_and_exclude_node_of_a_real_elastic_job(tmp_path: Path, settings: Settings) -> None:
    from tests.ports import free_port

    job_id = f"elastic-{uuid.uuid4().hex[:8]}"
    port = free_port()
    live = settings.model_copy(update={"dry_run": False, "require_approval": False})
    node_a = _agent(tmp_path, job_id, "node-a", port, host=True)
    agents = [node_a]
    try:
        wait_for(lambda: any(e["node"] == "node-a" for e in _events(tmp_path)), timeout=60)
        agents.append(
            _agent(tmp_path, job_id, "node-b", port, host=False)
        )  # node-a hosts the rendezvous
        wait_for(
            lambda: (
                {e["node"] for e in _events(tmp_path) if e["world"] == 2} == {"node-a", "node-b"}
            ),
            timeout=60,
        )
        with serve(live) as client:
            step_before = int((tmp_path / "step").read_text())
            seen = len(_events(tmp_path))
            # TrainingRankDown -> restart_from_checkpoint (local executor).
            view = _fire(client, "TrainingRankDown", job_id=job_id, node="node-a")
            assert len(view["output"]["signalled"]) == 2  # both workers of the job
            wait_for(
                lambda: len([e for e in _events(tmp_path)[seen:] if e["world"] == 2]) == 2,
                timeout=60,
            )
            restarted = _events(tmp_path)[seen:]
            assert all(e["restart"] >= 1 for e in restarted)
            assert all(e["resumed_from"] >= step_before for e in restarted)
            assert min(e["resumed_from"] for e in restarted) > 0

            # TrainingStraggler on node-b, persisting -> exclude_node stops node-b's agent.
            seen = len(_events(tmp_path))
            long_ago = "2026-01-01T00:00:00Z"
            body = payload(
                alert(
                    "TrainingStraggler",
                    fingerprint="s",
                    starts_at=long_ago,
                    job_id=job_id,
                    node="node-b",
                    rank="1",
                )
            )
            actions = notify(client, body)["planned_actions"]
            exclude = max(actions)
            wait_for(lambda: _state(client, exclude) in ("succeeded", "failed"), timeout=30)
            view = client.get(f"/v1/actions/{exclude}", headers=AUTH).json()
            assert view["action"] == "exclude_node" and view["state"] == "succeeded", view
            assert view["output"]["signalled"] == [agents[1].pid]
            agents[1].wait(timeout=60)
            wait_for(lambda: any(e["world"] == 1 for e in _events(tmp_path)[seen:]), timeout=60)
            survivor = [e for e in _events(tmp_path)[seen:] if e["world"] == 1]
            assert [e["node"] for e in survivor] == ["node-a"]
            assert survivor[0]["resumed_from"] > 0
            step = int((tmp_path / "step").read_text())
            wait_for(lambda: int((tmp_path / "step").read_text()) > step + 3, timeout=30)
        (tmp_path / "STOP").touch()
        assert node_a.wait(timeout=60) == 0
    finally:
        for agent in agents:
            if agent.poll() is None:
                agent.kill()
                agent.wait()
