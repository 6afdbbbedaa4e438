"""The smallest instrumented DDP training script: read it as the integration example.

Run it under torchrun (``make demo`` does, with two CPU ranks on gloo):

    torchrun --nproc-per-node 2 examples/ddp_train.py --steps 40

Each rank serves its metrics on /metrics (port 9400 + local rank, or the next free one) and
prints a one-line summary of what trainguard measured at the end.
"""

from __future__ import annotations

import argparse
import os
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

import trainguard
from trainguard import contract


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--slow-rank", type=int, default=1, help="rank given extra work")
    parser.add_argument("--slow-factor", type=float, default=1.5)
    args = parser.parse_args()

    dist.init_process_group("cuda:nccl,cpu:gloo" if torch.cuda.is_available() else "gloo")
    rank = dist.get_rank()
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
    if not torch.cuda.is_available():
        device = torch.device("cpu")
    torch.manual_seed(0)
    model = DistributedDataParallel(
        nn.Sequential(*[nn.Linear(512, 512) for _ in range(8)]).to(device)
    )
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    handle = trainguard.instrument(model, optimizer, job_id=os.environ.get("TORCHELASTIC_RUN_ID"))

    extra = args.slow_factor - 1 if rank == args.slow_rank else 0.0
    for _ in range(args.steps):
        optimizer.zero_grad()
        started = time.perf_counter()
        loss = model(torch.randn(64, 512, device=device)).square().mean()
        if extra:
            # A straggler: this rank's forward takes longer (simulated extra compute).
            time.sleep((time.perf_counter() - started) * extra + 0.01)
        loss.backward()
        optimizer.step()

    handle.flush()
    labels = handle.identity.labels()
    registry = handle.registry

    def mean(spec: contract.MetricSpec) -> float:
        total = registry.get_sample_value(f"{spec.name}_sum", labels) or 0.0
        count = registry.get_sample_value(f"{spec.name}_count", labels) or 1.0
        return 1000 * total / count

    print(
        f"rank {rank}: /metrics on port {handle.metrics_port}; "
        f"step {mean(contract.STEP_DURATION):.1f} ms, "
        f"compute {mean(contract.STEP_COMPUTE_DURATION):.1f} ms, "
        f"waiting on peers {mean(contract.SYNC_WAIT_DURATION):.1f} ms",
        flush=True,
    )
    handle.uninstrument()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
