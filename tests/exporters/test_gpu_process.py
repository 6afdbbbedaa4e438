"""GPU -> training rank mapping, and the simulated provider that follows local ranks."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

from tests.exporters.conftest import (
    StaticProcesses,
    make_context,
    rank_env,
    registry_of,
    scrape,
    values,
)
from trainguard.exporters.collectors.gpu_process import GpuProcessCollector
from trainguard.exporters.fake import FakeProvider
from trainguard.exporters.procs import TrainingProcess
from trainguard.exporters.provider import GpuSample
from trainguard.exporters.simulated import SimulatedProvider


def test_processes_on_each_gpu_are_mapped_to_their_rank() -> None:
    provider = FakeProvider(gpus=4)
    # GPU 1: rank 9, its second CUDA process (forked helper) and a process that is no rank.
    provider.processes = {0: (3001,), 1: (3002, 3012, 9999), 3: (3004,)}
    processes = StaticProcesses(
        [
            TrainingProcess(3001, rank_env(8, 0)),
            TrainingProcess(3002, rank_env(9, 1, TRAINGUARD_JOB_ID="job-a")),
            TrainingProcess(3012, rank_env(9, 1, TRAINGUARD_JOB_ID="job-a")),
            TrainingProcess(3004, rank_env(11, 3)),
        ]
    )
    context = make_context(provider, processes)
    registry, _ = registry_of({"gpu_process": GpuProcessCollector(context)})
    info = values(scrape(registry), "trainguard_gpu_process_info")
    rows = sorted(dict(labels)["gpu"] + ":" + dict(labels)["rank"] for labels in info)
    assert rows == ["0:8", "1:", "1:9", "3:11"]  # one series per GPU and rank, not per pid
    assert all("pid" not in dict(labels) for labels in info)
    by_rank = {dict(k)["rank"]: dict(k) for k in info}
    assert by_rank["9"] == {
        "gpu": "1",
        "uuid": provider.identity(1).uuid,
        "job_id": "job-a",
        "rank": "9",
        "local_rank": "1",
    }
    assert by_rank["8"]["job_id"] == "llama-7b-run-42"
    assert by_rank[""]["job_id"] == ""  # not a torchrun rank


def test_a_restarted_rank_keeps_its_series() -> None:
    provider = FakeProvider(gpus=1)
    provider.processes = {0: (4001,)}
    processes = StaticProcesses([TrainingProcess(4001, rank_env(2, 0))])
    registry, _ = registry_of(
        {"gpu_process": GpuProcessCollector(make_context(provider, processes))}
    )
    before = values(scrape(registry), "trainguard_gpu_process_info")
    provider.processes = {0: (4777,)}  # torchrun restarted the worker: a new pid
    processes.processes = [TrainingProcess(4777, rank_env(2, 0))]
    after = values(scrape(registry), "trainguard_gpu_process_info")
    assert before == after and len(after) == 1


@pytest.fixture
def busy_rank() -> Iterator[subprocess.Popen[bytes]]:
    """A real process with torchrun's variables (LOCAL_RANK=1) spinning on the CPU."""
    env = {**os.environ, **rank_env(1, 1)}
    child = subprocess.Popen([sys.executable, "-c", "while True: pass"], env=env)
    yield child
    child.kill()
    child.wait()


def _gpus(provider: SimulatedProvider) -> list[GpuSample]:
    samples = provider.sample()
    assert all(isinstance(s, GpuSample) for s in samples)
    return [s for s in samples if isinstance(s, GpuSample)]


def test_simulated_gpus_follow_local_training_processes(
    busy_rank: subprocess.Popen[bytes],
) -> None:
    # Only this child: other people's training processes on this machine must not count.
    only_child = StaticProcesses([TrainingProcess(busy_rank.pid, rank_env(1, 1))])
    provider = SimulatedProvider(2, only_child)
    provider.sample()  # starts the CPU measurement
    for _ in range(100):
        time.sleep(0.05)
        idle, loaded = _gpus(provider)
        if busy_rank.pid in loaded.process_ids and loaded.utilization_ratio > 0.2:
            break
    assert busy_rank.pid in loaded.process_ids
    assert loaded.utilization_ratio > 0.2
    assert idle.utilization_ratio < loaded.utilization_ratio
    assert (loaded.power_watts or 0) > (idle.power_watts or 0)
    assert loaded.memory_used_bytes > 0
    assert {s.identity.name for s in (idle, loaded)} == {"Simulated GPU"}
    assert all(s.identity.uuid.startswith("GPU-SIMULATED") for s in (idle, loaded))


def test_simulated_provider_needs_a_gpu() -> None:
    with pytest.raises(ValueError, match="at least 1"):
        SimulatedProvider(0, StaticProcesses())
