"""CUDA/NCCL paths of the hook; marked ``gpu`` and skipped where there is no GPU."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from prometheus_client import CollectorRegistry
from torch import nn
from torch.nn.parallel import DistributedDataParallel

import trainguard
from tests.ports import free_port
from trainguard.instrumentation.memory import MemorySampler

pytestmark = pytest.mark.gpu


def labels(handle: trainguard.Instrumentation) -> dict[str, str]:
    return handle.identity.labels()


def test_cuda_memory_comes_from_the_caching_allocator() -> None:
    device = torch.device("cuda", 0)
    held = torch.empty(64 * 2**20, dtype=torch.uint8, device=device)
    sample = MemorySampler(device).sample()
    assert sample.allocated_bytes >= held.numel()
    assert sample.reserved_bytes >= sample.allocated_bytes
    assert sample.capacity_bytes == torch.cuda.get_device_properties(device).total_memory


@pytest.fixture
def nccl_single_rank(tmp_path: Path) -> object:
    os.environ.update({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()), "RANK": "0"})
    dist.init_process_group("nccl", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def test_per_bucket_mode_times_buckets_with_cuda_events(nccl_single_rank: object) -> None:
    torch.manual_seed(0)
    model = DistributedDataParallel(
        nn.Sequential(*[nn.Linear(1024, 1024) for _ in range(8)]).cuda(), bucket_cap_mb=4
    )
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    registry = CollectorRegistry()
    handle = trainguard.instrument(
        model, optimizer, job_id="gpu", registry=registry, metrics_port=-1, per_bucket=True
    )
    for _ in range(4):
        optimizer.zero_grad()
        model(torch.randn(64, 1024, device="cuda")).square().mean().backward()
        optimizer.step()
    handle.flush()
    count = registry.get_sample_value("trainguard_grad_sync_duration_seconds_count", labels(handle))
    total = registry.get_sample_value("trainguard_grad_sync_duration_seconds_sum", labels(handle))
    reserved = registry.get_sample_value("trainguard_memory_reserved_bytes", labels(handle))
    assert count is not None and count >= 4
    assert total is not None and 0 < total < 10
    assert reserved is not None and reserved > 0
    handle.uninstrument()


def test_a_real_cuda_oom_in_backward_is_counted_from_the_allocator(
    nccl_single_rank: object,
) -> None:
    model = DistributedDataParallel(nn.Linear(16, 16).cuda())
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    registry = CollectorRegistry()
    handle = trainguard.instrument(
        model, optimizer, job_id="gpu-oom", registry=registry, metrics_port=-1
    )
    free, _ = torch.cuda.mem_get_info()
    with pytest.raises(torch.OutOfMemoryError):
        torch.empty(free * 2, dtype=torch.uint8, device="cuda")
    optimizer.zero_grad()
    model(torch.randn(4, 16, device="cuda")).sum().backward()
    optimizer.step()
    handle.flush()
    assert registry.get_sample_value("trainguard_oom_events_total", labels(handle)) == 1
    handle.uninstrument()
