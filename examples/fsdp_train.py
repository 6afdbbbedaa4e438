"""The smallest instrumented FSDP2 training script, beside ``ddp_train.py``.

Run it under torchrun (two CPU ranks on gloo here; NCCL on GPUs):

    torchrun --nproc-per-node 2 examples/fsdp_train.py --steps 40

The model is sharded the way torchtitan shards one: ``fully_shard`` on every block, then on the
root. ``trainguard.instrument`` needs nothing else: it sees an FSDP2 model, times its
all-gathers and reduce-scatters from the collective timeline, and splits each step into local
compute and time blocked on peers. Each rank prints what trainguard measured at the end.
"""

from __future__ import annotations

import argparse
import os
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

import trainguard
from trainguard import contract


class Block(nn.Module):
    def __init__(self, width: int, delay: float) -> None:
        super().__init__()
        self.linear = nn.Linear(width, width)
        self.delay = delay  # simulated extra compute on the slow rank

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.delay:
            time.sleep(self.delay)
        out: torch.Tensor = torch.relu(self.linear(x))
        return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--slow-rank", type=int, default=1, help="rank given extra work")
    parser.add_argument("--slow-ms", type=float, default=5.0, help="extra ms per block")
    args = parser.parse_args()

    cuda = torch.cuda.is_available()
    dist.init_process_group("cuda:nccl,cpu:gloo" if cuda else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0))) if cuda else None
    mesh = init_device_mesh("cuda" if cuda else "cpu", (world,))
    torch.manual_seed(0)
    delay = args.slow_ms / 1000 if rank == args.slow_rank else 0.0
    model = nn.Sequential(*[Block(512, delay) for _ in range(8)])
    if device is not None:
        model = model.to(device)
    for block in model:
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    handle = trainguard.instrument(model, optimizer, job_id=os.environ.get("TORCHELASTIC_RUN_ID"))

    for _ in range(args.steps):
        optimizer.zero_grad()
        model(torch.randn(64, 512, device=device)).square().mean().backward()
        optimizer.step()

    handle.flush()
    labels = handle.identity.labels()
    registry = handle.registry

    def mean(spec: contract.MetricSpec) -> float:
        total = registry.get_sample_value(spec.sum_name, labels) or 0.0
        count = registry.get_sample_value(spec.count_name, labels) or 1.0
        return 1000 * total / count

    print(
        f"rank {rank} ({handle.parallelism.value}, {handle.timing_source.value}): "
        f"step {mean(contract.STEP_DURATION):.1f} ms, "
        f"compute {mean(contract.STEP_COMPUTE_DURATION):.1f} ms, "
        f"waiting on peers {mean(contract.SYNC_WAIT_DURATION):.1f} ms, "
        f"all-gathers {mean(contract.PARAM_GATHER_DURATION):.1f} ms, "
        f"reduce-scatters {mean(contract.GRAD_SYNC_DURATION):.1f} ms per step",
        flush=True,
    )
    handle.uninstrument()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
