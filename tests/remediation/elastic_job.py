"""A tiny elastic gloo training job for the local executor's test (run by torchrun).

Each worker appends a JSON line to EVENTS when it starts (restart count, world size, node, the
step it resumed from) and rank 0 checkpoints the step after every all-reduce. The job ends
when the STOP file appears.
"""

from __future__ import annotations

import json
import os
import sys
import time
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist


def main(workdir: Path) -> int:
    events, checkpoint, stop = workdir / "events.jsonl", workdir / "step", workdir / "STOP"
    dist.init_process_group("gloo", timeout=timedelta(seconds=20))
    rank, world = dist.get_rank(), dist.get_world_size()
    step = int(checkpoint.read_text()) if checkpoint.exists() else 0
    record = {
        "pid": os.getpid(),
        "rank": rank,
        "world": world,
        "node": os.environ["TRAINGUARD_NODE"],
        "restart": int(os.environ["TORCHELASTIC_RESTART_COUNT"]),
        "resumed_from": step,
    }
    with events.open("a") as out:
        out.write(json.dumps(record) + "\n")
    while True:
        flag = torch.tensor([1.0 if stop.exists() else 0.0])
        dist.all_reduce(flag)
        if flag.item() > 0:
            break
        step += 1
        if rank == 0:
            tmp = checkpoint.with_suffix(".tmp")
            tmp.write_text(str(step))
            tmp.replace(checkpoint)
        time.sleep(0.1)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1])))
