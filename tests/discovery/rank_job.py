"""One rank of the discovery tests' job: DDP on gloo with the hook, training until told to stop.

Run as ``python rank_job.py STOP_FILE`` with torchrun's variables (``MASTER_ADDR``,
``MASTER_PORT``, ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``) and the hook's
(``TRAINGUARD_DISCOVERY_URL``, ...). Every step the ranks agree (an all-reduce) whether
``STOP_FILE`` exists, so that they leave the loop together and exit cleanly:
``uninstrument()`` withdraws the registration. ``READY`` on stdout means instrumented.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

import trainguard


def main(stop: Path) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    model = DistributedDataParallel(torch.nn.Linear(8, 8))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    handle = trainguard.instrument(model, optimizer)
    print("READY", flush=True)
    try:
        while True:
            flag = torch.tensor([1.0 if stop.exists() else 0.0])
            dist.all_reduce(flag, op=dist.ReduceOp.MAX)
            if flag.item() > 0:
                break
            model(torch.randn(4, 8)).sum().backward()
            optimizer.step()
            optimizer.zero_grad()
            time.sleep(0.1)
    finally:
        handle.uninstrument()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(Path(sys.argv[1]))
