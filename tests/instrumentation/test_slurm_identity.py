"""A rank's identity under Slurm: srun alone, srun + torchrun, a batch script, and what wins.

Each case gives resolve_identity a made-up environment, as srun and torchrun would set it; the
last one instruments a model in this process under such an environment.
"""

from __future__ import annotations

import pytest
import torch

import trainguard
from trainguard import contract
from trainguard.instrumentation.config import (
    Identity,
    InstrumentationConfig,
    LaunchedAs,
    launched_as,
)

# srun --nodes=2 --ntasks-per-node=8 python train.py: task 13 of 16, the 6th on gpu-node-07.
SRUN_TASK = {
    "SLURM_JOB_ID": "4242",
    "SLURM_STEP_ID": "0",
    "SLURM_PROCID": "13",
    "SLURM_LOCALID": "5",
    "SLURM_NTASKS": "16",
    "SLURMD_NODENAME": "gpu-node-07",
}
# srun --nodes=2 --ntasks-per-node=1 torchrun --nproc-per-node=8 ...: the second node's torchrun
# task (Slurm's view) and its worker 13 (torchrun's view).
SRUN_TORCHRUN_WORKER = {
    **SRUN_TASK,
    "SLURM_PROCID": "1",
    "SLURM_LOCALID": "0",
    "SLURM_NTASKS": "2",
    "RANK": "13",
    "LOCAL_RANK": "5",
    "WORLD_SIZE": "16",
    "TORCHELASTIC_RUN_ID": "4242",
}


def identity(
    env: dict[str, str],
    *,
    rank: int | None = None,
    world_size: int = 1,
    device_index: int | None = None,
    config: InstrumentationConfig | None = None,
) -> Identity:
    return (config or InstrumentationConfig()).resolve_identity(
        world_size, rank, env=env, device_index=device_index, agree_job_id=lambda p: "agreed"
    )


def test_an_srun_task_without_torchrun_takes_slurms_placement() -> None:
    assert identity(SRUN_TASK) == Identity(
        job_id="4242", rank=13, local_rank=5, world_size=16, node="gpu-node-07"
    )


def test_the_process_group_beats_the_environment_for_rank_and_size() -> None:
    got = identity(SRUN_TASK, rank=3, world_size=4)
    assert (got.rank, got.world_size, got.local_rank) == (3, 4, 5)


def test_under_srun_and_torchrun_torchruns_variables_win() -> None:
    assert identity(SRUN_TORCHRUN_WORKER) == Identity(
        job_id="4242", rank=13, local_rank=5, world_size=16, node="gpu-node-07"
    )
    # Slurm's task variables alone would have said rank 1, local rank 0, 2 ranks:
    assert launched_as(SRUN_TORCHRUN_WORKER) == LaunchedAs(13, 5, 16)


def test_slurms_local_id_beats_the_device_index() -> None:
    # srun --gpus-per-task=1: each task sees its one GPU as cuda:0.
    assert identity(SRUN_TASK, device_index=0).local_rank == 5


def test_a_batch_script_is_not_a_task_of_the_job() -> None:
    batch = {k: v for k, v in SRUN_TASK.items() if k != "SLURM_STEP_ID"}
    got = identity(batch, device_index=None)
    assert (got.rank, got.local_rank, got.world_size) == (0, 0, 1)
    assert (got.job_id, got.node) == ("4242", "gpu-node-07")


@pytest.mark.parametrize(
    ("env", "job_id"),
    [
        ({**SRUN_TASK, contract.ENV_JOB_ID: "llama-7b"}, "llama-7b"),
        ({**SRUN_TASK, "TORCHELASTIC_RUN_ID": "rdzv-1"}, "rdzv-1"),
        ({**SRUN_TASK, "TORCHELASTIC_RUN_ID": "none"}, "4242"),  # torchrun without --rdzv-id
        (SRUN_TASK, "4242"),
        ({"TORCHELASTIC_RUN_ID": "none"}, "none"),  # as before, outside Slurm
        ({}, "agreed"),
    ],
)
def test_job_id_precedence(env: dict[str, str], job_id: str) -> None:
    assert identity(env).job_id == job_id
    assert contract.job_id_from_environment(env) == ("" if job_id == "agreed" else job_id)


def test_arguments_beat_every_launcher() -> None:
    config = InstrumentationConfig(job_id="j", rank=2, local_rank=1, world_size=8, node="n1")
    assert identity(SRUN_TORCHRUN_WORKER, rank=7, world_size=16, config=config) == Identity(
        job_id="j", rank=2, local_rank=1, world_size=8, node="n1"
    )


def test_trainguard_node_beats_slurms_node_name() -> None:
    assert identity({**SRUN_TASK, contract.ENV_NODE: "node-a"}).node == "node-a"


def test_a_malformed_slurm_variable_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="SLURM_PROCID='x' is not an integer"):
        identity({**SRUN_TASK, "SLURM_PROCID": "x"})


def test_instrument_under_srun_reports_slurms_placement(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "TORCHELASTIC_RUN_ID", contract.ENV_JOB_ID):
        monkeypatch.delenv(name, raising=False)
    for name in (contract.ENV_NODE, contract.ENV_SCHEDULER):
        monkeypatch.delenv(name, raising=False)
    for name, value in SRUN_TASK.items():
        monkeypatch.setenv(name, value)
    handle = trainguard.instrument(torch.nn.Linear(2, 2), metrics_port=-1)
    try:
        assert handle.identity == Identity("4242", 13, 5, 16, "gpu-node-07")
        assert handle.placement.slurm_job_id == "4242"
        assert handle.placement.scheduler == contract.SCHEDULER_SLURM
    finally:
        handle.uninstrument()
