"""The demo's settings: ports, timings and where its files go (standard library only)."""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field
from pathlib import Path

DEMO_JOB_ID = "demo"
NODES = ("node-a", "node-b")


@dataclass
class Ports:
    prometheus: int = 9090
    alertmanager: int = 9093
    alertmanager_cluster: int = 9094
    remediation: int = 9095
    exporter: int = 9835
    rendezvous: int = 29500
    metrics: int = 9400


@dataclass
class DemoConfig:
    workdir: Path
    ports: Ports = field(default_factory=Ports)
    steps: int = 700
    step_seconds: float = 0.1
    # Share of each step's compute done as real matmuls (the rest a sleep): the trainer's
    # --compute-share. 0 by default: on a busy machine real arithmetic makes a healthy rank
    # a straggler at the demo's 20-second windows (docs/demo.md).
    compute_share: float = 0.0
    faults: str = ""
    straggler_exclude_after_seconds: float = 3.0
    spans: bool = True

    @property
    def checkpoint_dir(self) -> Path:
        return self.workdir / "checkpoints"

    @property
    def logs(self) -> Path:
        return self.workdir / "logs"

    @property
    def file_sd(self) -> Path:
        return self.workdir / "file_sd"

    @property
    def dumps(self) -> Path:
        return self.workdir / "dumps"

    @property
    def spans_dir(self) -> Path:
        return self.workdir / "spans"

    @property
    def token_file(self) -> Path:
        return self.workdir / "secrets" / "remediation-token"

    def url(self, service: str) -> str:
        return f"http://127.0.0.1:{getattr(self.ports, service)}"


def compute_share(text: str) -> float:
    """A ``--compute-share`` argument: a share between 0 and 1."""
    share = float(text)
    if not 0.0 <= share <= 1.0:
        raise argparse.ArgumentTypeError(f"{text} is not between 0 and 1")
    return share
