"""Waiting in tests: poll a condition until it holds, never assert how long it took.

A failure names what was awaited and ends with the tail of the logs given (files, or folders
whose ``*.log`` files are read), so a server that never came up says why.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

T = TypeVar("T")


def _tails(logs: tuple[Path, ...], lines: int = 20) -> str:
    files = [p for log in logs for p in (sorted(log.rglob("*.log")) if log.is_dir() else [log])]
    return "\n".join(
        f"--- {path}\n" + "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
        for path in files
        if path.exists()
    )


def wait_for(what: str, probe: Callable[[], T | None], timeout: float = 30.0, *logs: Path) -> T:
    """Poll ``probe`` until it returns something truthy, and return that."""
    deadline = time.monotonic() + timeout
    while True:
        found = probe()
        if found:
            return found
        if time.monotonic() > deadline:
            raise AssertionError(f"not in {timeout:g} s: {what}\n{_tails(logs)}")
        time.sleep(0.1)
