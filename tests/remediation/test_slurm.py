"""The Slurm executor at its boundary: a fake ``scontrol`` on PATH records each call."""

from __future__ import annotations

import os
import stat
import sys
from pathlib import Path

import pytest

from tests.remediation.conftest import AUTH, alert, payload, serve, wait_for
from trainguard.contract import Action
from trainguard.remediation.executors import ActionRecord, ExecutionError
from trainguard.remediation.executors.slurm import SlurmExecutor
from trainguard.remediation.settings import Settings

FAKE_SCONTROL = """#!{python}
import os, sys
from pathlib import Path
state = Path(os.environ["FAKE_SLURM_DIR"])
with (state / "calls").open("a") as log:
    log.write(" ".join(sys.argv[1:]) + "\\n")
restarts = state / "restarts"
count = int(restarts.read_text()) if restarts.exists() else 0
args = sys.argv[1:]
if args[:2] == ["show", "job"]:
    if args[-1] != "4242":
        print(f"slurm_load_jobs error: Invalid job id specified", file=sys.stderr)
        sys.exit(1)
    print(f"JobId=4242 JobName=train JobState=RUNNING Restarts={{count}} NodeList=n[1-2]")
elif args[0] == "requeue":
    restarts.write_text(str(count + 1))
"""


@pytest.fixture
def fake_slurm(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    scontrol = bin_dir / "scontrol"
    scontrol.write_text(FAKE_SCONTROL.format(python=sys.executable))
    scontrol.chmod(scontrol.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_SLURM_DIR", str(tmp_path))
    return tmp_path


def _calls(state: Path) -> list[str]:
    path = state / "calls"
    return path.read_text().splitlines() if path.exists() else []


def _action(action: Action, **labels: str) -> ActionRecord:
    return ActionRecord(
        id=9,
        action=action,
        executor="slurm",
        subject="j1",
        params={},
        alertname="TrainingStraggler",
        labels={"job_id": "j1", "slurm_job_id": "4242", "node": "n2", **labels},
    )


def test_exclude_node_drains_and_requeues_once(fake_slurm: Path) -> None:
    executor = SlurmExecutor()
    action = _action(Action.EXCLUDE_NODE)
    snapshot = executor.prepare(action)
    assert snapshot == {"job": "4242", "node": "n2", "restarts": 0}
    assert executor.execute(action, snapshot) == {"drained": "n2", "requeued": True, "job": "4242"}
    # A retry after a crash drains again (harmless) but sees Restarts=1 and does not requeue.
    assert executor.execute(action, snapshot)["requeued"] is False
    assert _calls(fake_slurm) == [
        "show job --oneliner 4242",
        "update NodeName=n2 State=DRAIN Reason=trainguard action 9: TrainingStraggler",
        "show job --oneliner 4242",
        "requeue 4242",
        "update NodeName=n2 State=DRAIN Reason=trainguard action 9: TrainingStraggler",
        "show job --oneliner 4242",
    ]


def test_restart_annotate_and_drain(fake_slurm: Path) -> None:
    executor = SlurmExecutor()
    restart = _action(Action.RESTART_FROM_CHECKPOINT)
    assert executor.execute(restart, executor.prepare(restart))["requeued"] is True
    annotate = _action(Action.ANNOTATE)
    assert executor.execute(annotate, executor.prepare(annotate)) == {"commented": "4242"}
    drain = _action(Action.DRAIN_NODE)
    assert executor.execute(drain, executor.prepare(drain)) == {"drained": "n2"}
    assert _calls(fake_slurm)[-2:] == [
        "update JobId=4242 Comment=trainguard action 9: TrainingStraggler",
        "update NodeName=n2 State=DRAIN Reason=trainguard action 9: TrainingStraggler",
    ]


def test_scontrol_failures_are_reported(fake_slurm: Path) -> None:
    with pytest.raises(ExecutionError, match="exited 1: slurm_load_jobs error"):
        SlurmExecutor().prepare(_action(Action.RESTART_FROM_CHECKPOINT, slurm_job_id="1"))
    with pytest.raises(ExecutionError, match="No such file"):
        SlurmExecutor(scontrol=str(fake_slurm / "missing")).prepare(_action(Action.EXCLUDE_NODE))


def test_the_service_requeues_the_slurm_job_its_alert_names(
    fake_slurm: Path, settings: Settings
) -> None:
    # What the rules put on an alert of a job whose ranks run under Slurm (rank_info): the
    # scheduler picks this executor, slurm_job_id the job to requeue (not trainguard's job id).
    settings = settings.model_copy(update={"dry_run": False, "require_approval": False})
    labels = {"job_id": "train-7", "rank": "1", "node": "n2"}
    slurm = {"scheduler": "slurm", "slurm_job_id": "4242"}
    with serve(settings) as client:
        sent = payload(alert("TrainingRankDown", **labels, **slurm))
        assert client.post("/v1/alertmanager", json=sent, headers=AUTH).status_code == 200

        def finished() -> bool:
            actions = client.get("/v1/actions", headers=AUTH).json()["actions"]
            return bool(actions) and actions[0]["state"] == "succeeded"

        wait_for(finished)
        (action,) = client.get("/v1/actions", headers=AUTH).json()["actions"]
    assert action["executor"] == "slurm"
    assert _calls(fake_slurm) == [
        "show job --oneliner 4242",
        "show job --oneliner 4242",
        "requeue 4242",
    ]
