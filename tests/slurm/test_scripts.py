"""deploy/slurm: the prolog and epilog run as slurmd would run them, with a fake Slurm
environment, a temporary state directory and a fake trainguard-exporter on PATH; the sbatch
example with fake srun, scontrol and torchrun; bash -n and shellcheck on every script.

No Slurm ran here: slurmd's side (when it runs the scripts, with which variables) is taken from
Slurm's prolog and epilog documentation.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.exporters.conftest import require_binary
from tests.polling import wait_for
from tests.ports import free_port
from trainguard import contract
from trainguard.exporters.registry import registered

SLURM = Path(__file__).parents[2] / "deploy" / "slurm"
SCRIPTS = sorted(SLURM.glob("*.sh")) + sorted(SLURM.glob("*.sbatch"))
FAKE_EXPORTER = """#!/usr/bin/env bash
# A stand-in for trainguard-exporter: says when it starts (with its flags and how many SLURM_*
# variables it inherited) and stops, and otherwise waits for SIGTERM.
record={record}
trap 'echo "stop $$" >>"$record"; exit 0' TERM
slurm_vars=$(env | grep -c '^SLURM_')
echo "start $$ slurm_vars=$slurm_vars listen=$TRAINGUARD_EXPORTER_LISTEN_ADDRESS $*" >>"$record"
while :; do sleep 0.1; done
"""


def alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"  # a zombie has stopped


@dataclass
class Node:
    """One compute node's view: where the scripts keep state, what the fake exporter did."""

    root: Path
    env: dict[str, str]

    @property
    def state(self) -> Path:
        return self.root / "state"

    @property
    def file_sd(self) -> Path:
        return self.root / "file_sd"

    @property
    def log(self) -> Path:
        return self.root / "trainguard-slurm.log"

    def records(self) -> list[str]:
        path = self.root / "exporter-record"
        return path.read_text().splitlines() if path.exists() else []

    def run(self, script: str, job: str | None, **extra: str) -> subprocess.CompletedProcess[str]:
        env = {**self.env, **extra}
        if job is not None:
            env["SLURM_JOB_ID"] = job
        return subprocess.run(
            ["bash", str(SLURM / script)],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )

    def exporter_pid(self) -> int | None:
        path = self.state / "exporter.pid"
        return int(path.read_text()) if path.exists() else None


@pytest.fixture
def node(tmp_path: Path) -> Iterator[Node]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    exporter = bin_dir / "trainguard-exporter"
    exporter.write_text(FAKE_EXPORTER.format(record=tmp_path / "exporter-record"))
    exporter.chmod(0o755)
    conf = tmp_path / "slurm.env"
    conf.write_text("TRAINGUARD_EXPORTER_ARGS='--nccl.log-glob /var/log/nccl/*.log'\n")
    env = {
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        # What slurmd gives a prolog and an epilog (Slurm's prolog_epilog documentation).
        "SLURMD_NODENAME": "gpu-node-07",
        "SLURM_JOB_USER": "alice",
        "SLURM_JOB_UID": "1000",
        "SLURM_CLUSTER_NAME": "test",
        "TRAINGUARD_SLURM_CONF": str(conf),
        "TRAINGUARD_SLURM_STATE_DIR": str(tmp_path / "state"),
        "TRAINGUARD_SLURM_LOG": str(tmp_path / "trainguard-slurm.log"),
        contract.ENV_FILE_SD_DIR: str(tmp_path / "file_sd"),
    }
    made = Node(tmp_path, env)
    yield made
    pid = made.exporter_pid()
    if pid is not None and alive(pid):
        os.kill(pid, signal.SIGKILL)


def rank_targets(node: Node, job: str, ranks: range) -> list[Path]:
    """The file_sd files the hook writes for a job's ranks (server.write_file_sd's names)."""
    node.file_sd.mkdir(exist_ok=True)
    paths = [node.file_sd / f"{job}-rank{rank}.json" for rank in ranks]
    for path in paths:
        path.write_text("[]")
    return paths


def test_prolog_and_epilog_run_one_exporter_for_the_jobs_of_a_node(node: Node) -> None:
    assert node.run("prolog.sh", "101").returncode == 0
    wait_for("the exporter to start", lambda: len(node.records()) == 1)
    pid = node.exporter_pid()
    assert pid is not None and alive(pid)
    (start,) = node.records()
    assert start.startswith(f"start {pid} ")
    # Its own flags and the site's, slurmd's variables left behind.
    assert "--collector.slurm_job --nccl.log-glob /var/log/nccl/*.log" in start
    assert "slurm_vars=0" in start and "listen=:9835" in start
    assert (node.state / "jobs" / "101").exists()
    announced = json.loads((node.file_sd / "exporters" / "gpu-node-07.json").read_text())
    assert announced == [{"targets": ["gpu-node-07:9835"], "labels": {"node": "gpu-node-07"}}]

    # Again for the same job (slurmd retried it), and a second job on the node: one exporter.
    assert node.run("prolog.sh", "101").returncode == 0
    assert node.run("prolog.sh", "102").returncode == 0
    assert node.exporter_pid() == pid and len(node.records()) == 1

    # The first job ends: its rank targets go, the exporter stays for the second job.
    finished = rank_targets(node, "101", range(8))
    running = rank_targets(node, "102", range(2))
    assert node.run("epilog.sh", "101").returncode == 0
    assert not any(path.exists() for path in finished)
    assert all(path.exists() for path in running)
    assert not (node.state / "jobs" / "101").exists()
    assert alive(pid)

    # The last job ends: the exporter is stopped with SIGTERM and withdrawn.
    assert node.run("epilog.sh", "102").returncode == 0
    assert node.records() == [start, f"stop {pid}"]
    assert not alive(pid)
    assert node.exporter_pid() is None
    assert not (node.file_sd / "exporters" / "gpu-node-07.json").exists()
    assert not any(path.exists() for path in running)

    # Once more, and for a job this node never saw: nothing to do, nothing fails.
    assert node.run("epilog.sh", "102").returncode == 0
    assert node.run("epilog.sh", "999").returncode == 0
    assert node.records() == [start, f"stop {pid}"]


def test_a_dead_exporter_is_started_again_and_a_reused_pid_is_left_alone(node: Node) -> None:
    stranger = subprocess.Popen(["sleep", "300"])
    try:
        node.state.mkdir()
        (node.state / "exporter.pid").write_text(f"{stranger.pid}\n")  # the pid was reused
        assert node.run("prolog.sh", "7").returncode == 0
        wait_for("a new exporter", lambda: len(node.records()) == 1)
        pid = node.exporter_pid()
        assert pid is not None and pid != stranger.pid
        os.kill(pid, signal.SIGKILL)  # the exporter crashed between jobs
        wait_for("the exporter to die", lambda: not alive(pid))
        assert node.run("prolog.sh", "8").returncode == 0
        wait_for("the exporter to be started again", lambda: len(node.records()) == 2)
        assert node.run("epilog.sh", "7").returncode == 0
        assert node.run("epilog.sh", "8").returncode == 0
        assert stranger.poll() is None, "the epilog killed a process that was not its exporter"
    finally:
        stranger.kill()
        stranger.wait()


@pytest.mark.parametrize(
    ("job", "extra", "logged"),
    [
        ("5", {"TRAINGUARD_EXPORTER_BIN": "no-such-exporter"}, "'no-such-exporter' not found"),
        (None, {}, "is not a job id"),
        ("../../etc", {}, "is not a job id"),
        ("5", {"TRAINGUARD_SLURM_STATE_DIR": "/proc/version/state"}, "cannot use state directory"),
        ("5", {contract.ENV_FILE_SD_DIR: "/proc/version/file_sd"}, "cannot write"),
    ],
)
def test_a_monitoring_failure_never_fails_the_job(
    node: Node, job: str | None, extra: dict[str, str], logged: str
) -> None:
    for script in ("prolog.sh", "epilog.sh"):
        result = node.run(script, job, **extra)
        assert result.returncode == 0, result.stderr
    assert logged in node.log.read_text()


def test_an_exporter_run_by_the_site_is_left_to_it(node: Node) -> None:
    finished = rank_targets(node, "55", range(2))
    assert node.run("prolog.sh", "55", TRAINGUARD_SLURM_MANAGE_EXPORTER="0").returncode == 0
    assert (node.state / "jobs" / "55").exists()
    assert node.run("epilog.sh", "55", TRAINGUARD_SLURM_MANAGE_EXPORTER="0").returncode == 0
    assert not (node.state / "jobs" / "55").exists()
    assert not any(path.exists() for path in finished)
    assert node.records() == [] and node.exporter_pid() is None


def test_the_scripts_use_the_contracts_names() -> None:
    shared = (SLURM / "common.sh").read_text()
    assert "slurm_job" in registered()
    assert "--collector.slurm_job" in shared
    assert contract.ENV_EXPORTER_LISTEN_ADDRESS in shared
    assert contract.ENV_FILE_SD_DIR in shared


def test_the_sbatch_example_runs_one_torchrun_per_node_on_one_rendezvous(tmp_path: Path) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fakes = {
        "scontrol": 'printf "gpu-node-07\\ngpu-node-08\\n"',  # show hostnames <nodelist>
        "srun": 'exec "${@:2}"',  # one task here stands for one per node
        "torchrun": f'env | grep ^TRAINGUARD_ >{tmp_path}/env; echo "$@" >{tmp_path}/args',
    }
    for name, body in fakes.items():
        (bin_dir / name).write_text(f"#!/usr/bin/env bash\n{body}\n")
        (bin_dir / name).chmod(0o755)
    env = {
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "SLURM_JOB_ID": "4242",
        "SLURM_JOB_NODELIST": "gpu-node-[07-08]",
        "SLURM_JOB_NUM_NODES": "2",
    }
    result = subprocess.run(
        ["bash", str(SLURM / "train.sbatch"), "train.py", "--lr", "3e-4"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    args = (tmp_path / "args").read_text().split()
    assert args == [
        "--nnodes=2",
        "--nproc-per-node=8",
        "--rdzv-backend=c10d",
        "--rdzv-endpoint=gpu-node-07:29500",
        "--rdzv-id=4242",
        "--max-restarts=3",
        "train.py",
        "--lr",
        "3e-4",
    ]
    exported = (tmp_path / "env").read_text()
    assert f"{contract.ENV_FILE_SD_DIR}=/shared/trainguard/file_sd" in exported
    assert f"{contract.ENV_DUMP_DIR}=/shared/trainguard/dumps" in exported


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_every_script_parses(script: Path) -> None:
    result = subprocess.run(
        ["bash", "-n", str(script)], capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 0, result.stderr


def test_shellcheck_finds_nothing() -> None:
    shellcheck = require_binary("shellcheck")
    result = subprocess.run(
        [shellcheck, "-x", *(p.name for p in SCRIPTS)],
        cwd=SLURM,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_prolog_starts_the_real_exporter_which_maps_a_rank_to_its_job(tmp_path: Path) -> None:
    """The installed trainguard-exporter, started by the prolog with simulated GPUs, finds an
    srun task's job through this machine's real /proc (its environment: this machine's cgroups
    are not Slurm's), and the epilog stops it with SIGTERM."""
    exporter = Path(sys.executable).parent / "trainguard-exporter"
    assert exporter.exists(), "install the package: pip install -e '.[dev]'"
    port = free_port()
    task_env = {
        **os.environ,
        "RANK": "0",
        "LOCAL_RANK": "0",
        "SLURM_JOB_ID": "4242",
        "SLURM_STEP_ID": "0",
        "SLURM_PROCID": "0",
    }
    rank = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"], env=task_env)
    env = {
        "PATH": os.environ["PATH"],
        "SLURM_JOB_ID": "4242",
        "SLURMD_NODENAME": "gpu-node-07",
        "TRAINGUARD_SLURM_CONF": str(tmp_path / "absent.env"),
        "TRAINGUARD_SLURM_STATE_DIR": str(tmp_path / "state"),
        "TRAINGUARD_SLURM_LOG": str(tmp_path / "log"),
        "TRAINGUARD_EXPORTER_BIN": str(exporter),
        "TRAINGUARD_EXPORTER_ARGS": "--simulate-gpus 1 --log-format text",
        contract.ENV_EXPORTER_LISTEN_ADDRESS: f"127.0.0.1:{port}",
    }
    pidfile = tmp_path / "state" / "exporter.pid"
    try:
        assert (
            subprocess.run(["bash", str(SLURM / "prolog.sh")], env=env, timeout=60).returncode == 0
        )
        pid = int(pidfile.read_text())
        info = 'trainguard_gpu_slurm_job_info{gpu="0"'
        text = ""

        def mapped() -> bool:
            nonlocal text
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
                    text = r.read().decode()
            except OSError:
                return False
            return info in text

        wait_for("the exporter to map the rank to its job", mapped, 90)
        line = next(line for line in text.splitlines() if line.startswith(info))
        assert 'slurm_job_id="4242"' in line and 'slurm_step_id="0"' in line
        assert (
            subprocess.run(["bash", str(SLURM / "epilog.sh")], env=env, timeout=60).returncode == 0
        )
        assert not alive(pid)
        assert (
            "INFO trainguard.exporter: stopped" in (tmp_path / "state" / "exporter.log").read_text()
        )
    finally:
        rank.kill()
        rank.wait()
        if pidfile.exists() and alive(int(pidfile.read_text())):
            os.kill(int(pidfile.read_text()), signal.SIGKILL)
