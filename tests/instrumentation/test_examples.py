"""The integration examples run as documented: under torchrun, two CPU ranks on gloo."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.ports import free_port

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


@pytest.mark.parametrize(
    ("script", "expected"),
    [
        ("ddp_train.py", r"rank {rank}: /metrics on port \d+; step .*? waiting on peers"),
        ("fsdp_train.py", r"rank {rank} \(fsdp2, collective_timeline\): step .*? reduce-scatters"),
    ],
)
def test_an_example_trains_and_reports_what_trainguard_measured(
    tmp_path: Path, script: str, expected: str
) -> None:
    env = {
        **os.environ,
        "TRAINGUARD_METRICS_PORT": "0",
        "TRAINGUARD_METRICS_ADDR": "127.0.0.1",
        "TRAINGUARD_DUMP_DIR": str(tmp_path / "dumps"),
    }
    completed = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nproc-per-node",
            "2",
            "--master-addr",
            "127.0.0.1",
            "--master-port",
            str(free_port()),
            str(EXAMPLES / script),
            "--steps",
            "6",
        ],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert completed.returncode == 0, completed.stderr[-3000:]
    # The ranks print to one pipe: their lines may run into each other.
    for rank in (0, 1):
        assert re.search(expected.format(rank=rank), completed.stdout), completed.stdout
