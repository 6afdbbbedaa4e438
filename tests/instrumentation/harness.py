"""Run a scenario function on N real gloo ranks (separate processes) and collect results.

Each scenario runs as ``fn(rank, world_size, out_dir, **kwargs)`` in a spawned process with
the process group initialised; it writes ``rank<N>.json`` into ``out_dir`` and the harness
returns them in rank order.
"""

from __future__ import annotations

import datetime
import faulthandler
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from torch.multiprocessing.spawn import start_processes

from tests.ports import free_port

Scenario = Callable[..., dict[str, Any]]


def _entry(
    rank: int,
    world_size: int,
    port: int,
    scenario: Scenario,
    out_dir: str,
    env: dict[str, str],
    kwargs: dict[str, Any],
) -> None:
    import torch
    import torch.distributed as dist

    # A rank killed by a signal (an abort inside torch's C++ at teardown, say) then prints
    # every thread's Python stack into the test's captured output.
    faulthandler.enable(all_threads=True)
    os.environ.update(env)
    os.environ.update(
        {
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port),
            "RANK": str(rank),
            "LOCAL_RANK": str(rank),
            "WORLD_SIZE": str(world_size),
        }
    )
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo", rank=rank, world_size=world_size, timeout=datetime.timedelta(seconds=120)
    )
    try:
        result = scenario(rank, world_size, Path(out_dir), **kwargs)
        (Path(out_dir) / f"rank{rank}.json").write_text(json.dumps(result))
        # Rank 0 hosts the job's store: it must not exit while a peer still uses it (a peer's
        # watchdog polling the store then sat in C++ as the process exited, and aborted it:
        # "terminate called without an active exception").
        dist.monitored_barrier(timeout=datetime.timedelta(seconds=60))
    finally:
        dist.destroy_process_group()


def run_ranks(
    scenario: Scenario,
    world_size: int,
    out_dir: Path,
    env: dict[str, str] | None = None,
    **kwargs: Any,
) -> list[dict[str, Any]]:
    out_dir.mkdir(parents=True, exist_ok=True)
    start_processes(
        _entry,
        args=(world_size, free_port(), scenario, str(out_dir), env or {}, kwargs),
        nprocs=world_size,
        join=True,
        start_method="spawn",
    )
    return [json.loads((out_dir / f"rank{r}.json").read_text()) for r in range(world_size)]
