"""Child processes, free ports and waiting for a condition, for the benchmarks that run a stack."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable
from contextlib import suppress
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")
POLL_SECONDS = 1.0


class RunError(RuntimeError):
    """A benchmark run could not go on (a child exited, a condition never came)."""


class Children:
    """Every child process of the run, each in a process group of its own, stopped together."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._procs: list[subprocess.Popen[bytes]] = []

    def start(
        self, command: list[str], log_path: Path, cwd: Path | None = None
    ) -> subprocess.Popen[bytes]:
        with self._lock, log_path.open("ab") as out:
            proc = subprocess.Popen(
                command, stdout=out, stderr=subprocess.STDOUT, start_new_session=True, cwd=cwd
            )
            self._procs.append(proc)
        return proc

    def stop(self, *procs: subprocess.Popen[bytes]) -> None:
        """Stop ``procs`` (all children when none is named): SIGTERM, then SIGKILL after 30 s."""
        with self._lock:
            chosen = list(procs) or list(self._procs)
            self._procs = [p for p in self._procs if p not in chosen]
        for proc in chosen:
            if proc.poll() is None:
                _signal_group(proc, signal.SIGTERM)
        for proc in chosen:
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                _signal_group(proc, signal.SIGKILL)
                proc.wait()


def _signal_group(proc: subprocess.Popen[bytes], sig: signal.Signals) -> None:
    with suppress(ProcessLookupError):
        os.killpg(proc.pid, sig)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def wait_for(what: str, probe: Callable[[], T | None], timeout: float, *alive: Any) -> T:
    """Poll ``probe`` until it returns something truthy; ``RunError`` when ``timeout`` passes or
    a process of ``alive`` exits."""
    deadline = time.monotonic() + timeout
    while True:
        for proc in alive:
            if proc.poll() is not None:
                raise RunError(f"{proc.args[0]} exited ({proc.returncode}) waiting for {what}")
        found = probe()
        if found:
            return found
        if time.monotonic() > deadline:
            raise RunError(f"not in {timeout:g} s: {what}")
        time.sleep(POLL_SECONDS)


def read_json(path: Path) -> dict[str, Any] | None:
    """A JSON file a child writes when it is ready; None until it is there and whole."""
    try:
        data: dict[str, Any] = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data
