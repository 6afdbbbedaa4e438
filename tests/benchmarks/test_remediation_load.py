"""The webhook load benchmark in a quick mode: it runs, loads both servers, and its last line
is the one the benchmarks page and scripts read. No timing is asserted here (see
docs/benchmarks.md: timing claims come from the benchmark's own runs)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).parents[2] / "benchmarks" / "remediation_load.py"
LAST_LINE = re.compile(
    r"alerts_per_s=(\d+\.\d) p99_ms=(\d+\.\d\d) "
    r"floor_alerts_per_s=(\d+\.\d) floor_p99_ms=(\d+\.\d\d)"
)


def test_a_quick_run_ends_with_ours_and_the_floor_on_one_line() -> None:
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--rounds", "2", "--seconds", "0.3"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    last = LAST_LINE.fullmatch(lines[-1])
    assert last, lines[-1]
    # Both servers answered: every figure is positive.
    assert all(float(value) > 0 for value in last.groups()), lines[-1]
    assert lines[1].startswith("ours: requests_ok=") and " failures=0 " in lines[1]
    assert lines[2].startswith("floor: requests_ok=") and " failures=0 " in lines[2]
    assert any(line.startswith("ratio: alerts_per_s ") for line in lines)
    # Ours answers once a notification is in its inbox: the time to decide them is printed too.
    assert any(line.startswith("ours: decided every accepted notification ") for line in lines)
