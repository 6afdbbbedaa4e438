"""A real 3-rank gloo hang with the hook, writing ECS logs, for the diagnosis to read.

Rank 2 sleeps inside a step (``tests.instrumentation.scenarios.hang``); the others' watchdogs
see the stalled all-reduce, every rank writes its Flight Recorder dump and stacks, and the
events go to ``rank<N>.ndjson`` through trainguard's ECS logging.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.instrumentation import scenarios
from trainguard.logs import configure_logging

JOB_ID = "job-hang"  # the job id scenarios.hang instruments with
SLEEPER = 2


def hang_with_logs(rank: int, world: int, out: Path, sleep_s: float) -> dict[str, Any]:
    (out / "logs").mkdir(parents=True, exist_ok=True)
    setup = configure_logging(
        service_name="trainer", job_id=JOB_ID, rank=rank, file=out / "logs" / f"rank{rank}.ndjson"
    )
    try:
        return scenarios.hang(rank, world, out, sleeper=SLEEPER, sleep_s=sleep_s)
    finally:
        setup.close()
