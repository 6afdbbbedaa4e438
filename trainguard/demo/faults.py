"""The fault plan of the demo trainer: which fault, on which rank, when.

``straggler:rank=2,at=20s,factor=1.5;hang:rank=1,at=60s;oom:rank=0,at=90s`` injects a slow
rank, a rank that stops joining collectives and an out-of-memory error; :class:`FaultKind` is
the whole catalogue the trainer can inject (the fault matrix, ``benchmarks/fault_matrix.py``,
draws from it), each with the failure it causes. Times count from the job's first start (kept
in the checkpoint folder, so a restarted job does not replay its faults); each fault fires
once, and the file that records it also says when and where, which is what the drill and the
matrix measure detection and recovery from.
"""

from __future__ import annotations

import enum
import json
import re
import time
from dataclasses import dataclass
from pathlib import Path

from trainguard.contract import Failure

DEFAULT_PLAN = "straggler:rank=2,at=20s,factor=1.5;hang:rank=1,at=60s;oom:rank=0,at=90s"


class FaultKind(str, enum.Enum):
    """What the demo trainer can inject; ``factor`` scales the slowdowns."""

    STRAGGLER = Failure.STRAGGLER.value  # the rank's compute takes factor x as long
    DATA_SLOW = "data_slow"  # the rank's data loading adds (factor - 1) x a step's compute
    COMM_SLOW = "comm_slow"  # the rank enters each gradient sync (factor - 1) x compute late
    HANG = Failure.HANG.value  # the rank stops joining collectives
    BARRIER_HANG = "barrier_hang"  # the rank stops before the barrier around a checkpoint
    KILL = "kill"  # the rank's process is killed (SIGKILL)
    PG_ERROR = "pg_error"  # the rank's process group fails its next gradient sync
    OOM = Failure.OOM.value  # a whole batch no longer fits on the rank
    MEMORY_CREEP = "memory_creep"  # the rank's memory grows towards its capacity
    DATA_STALL = "data_stall"  # the rank's data loader blocks

    @property
    def failure(self) -> Failure:
        """The failure the fault causes: what detection and diagnosis should name."""
        return CAUSES[self]


CAUSES: dict[FaultKind, Failure] = {
    FaultKind.STRAGGLER: Failure.STRAGGLER,
    FaultKind.DATA_SLOW: Failure.STRAGGLER,
    FaultKind.COMM_SLOW: Failure.STRAGGLER,
    FaultKind.HANG: Failure.HANG,
    FaultKind.BARRIER_HANG: Failure.HANG,
    FaultKind.KILL: Failure.RANK_FAILURE,
    FaultKind.PG_ERROR: Failure.RANK_FAILURE,
    FaultKind.OOM: Failure.OOM,
    FaultKind.MEMORY_CREEP: Failure.OOM,
    FaultKind.DATA_STALL: Failure.HANG,
}


@dataclass(frozen=True)
class Fault:
    kind: FaultKind
    rank: int
    at_seconds: float
    factor: float = 1.5  # stragglers: how much longer the rank's step work takes


class FaultPlanError(ValueError):
    """A fault plan that cannot be parsed; the message says which part and why."""


_DURATION = re.compile(r"^(\d+(?:\.\d+)?)(ms|s|m)?$")


def _seconds(text: str) -> float:
    match = _DURATION.match(text.strip())
    if match is None:
        raise FaultPlanError(f"{text!r} is not a duration (e.g. 20s, 1.5m, 500ms)")
    value, unit = float(match.group(1)), match.group(2) or "s"
    return value * {"ms": 0.001, "s": 1.0, "m": 60.0}[unit]


def parse_plan(text: str) -> list[Fault]:
    """Parse ``kind:key=value,...;...``; an empty plan injects nothing."""
    faults = []
    for part in filter(None, (p.strip() for p in text.split(";"))):
        kind_text, _, options = part.partition(":")
        kind = next((k for k in FaultKind if k.value == kind_text.strip()), None)
        if kind is None:
            known = ", ".join(k.value for k in FaultKind)
            raise FaultPlanError(f"unknown fault {kind_text!r} in {part!r} (known: {known})")
        values: dict[str, str] = {}
        for option in filter(None, (o.strip() for o in options.split(","))):
            key, sep, value = option.partition("=")
            if not sep or not value:
                raise FaultPlanError(f"{option!r} in {part!r} is not key=value")
            values[key.strip()] = value.strip()
        unknown = set(values) - {"rank", "at", "factor"}
        if unknown:
            raise FaultPlanError(f"unknown option(s) {sorted(unknown)} in {part!r}")
        if "rank" not in values or "at" not in values:
            raise FaultPlanError(f"{part!r} needs rank= and at=")
        try:
            rank = int(values["rank"])
            factor = float(values.get("factor", "1.5"))
        except ValueError as error:
            raise FaultPlanError(f"{part!r}: {error}") from None
        if rank < 0 or factor < 1.0:
            raise FaultPlanError(f"{part!r}: rank must be >= 0 and factor >= 1")
        faults.append(Fault(kind, rank, _seconds(values["at"]), factor))
    return faults


@dataclass(frozen=True)
class FiredFault:
    """What the job recorded when a fault fired: the drill's zero point for it."""

    kind: FaultKind
    rank: int
    node: str
    at: float  # Unix time

    @classmethod
    def load(cls, path: Path) -> FiredFault:
        data = json.loads(path.read_text())
        return cls(FaultKind(data["kind"]), int(data["rank"]), str(data["node"]), float(data["at"]))


class FaultLedger:
    """Job-wide fault state in the checkpoint folder: when the job started, what has fired."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        folder.mkdir(parents=True, exist_ok=True)

    def job_started_at(self) -> float:
        """The job's first start; the first caller records it (atomically, first one wins)."""
        path = self.folder / "job-started-at"
        try:
            with path.open("x") as out:
                out.write(repr(time.time()))
        except FileExistsError:
            pass
        return float(path.read_text() or time.time())

    def path(self, kind: FaultKind) -> Path:
        return self.folder / f"fault-{kind.value}.json"

    def fired(self, kind: FaultKind) -> FiredFault | None:
        path = self.path(kind)
        return FiredFault.load(path) if path.exists() else None

    def fire(self, fault: Fault, node: str) -> FiredFault:
        fired = FiredFault(fault.kind, fault.rank, node, time.time())
        tmp = self.path(fault.kind).with_suffix(".tmp")
        tmp.write_text(
            json.dumps({"kind": fired.kind.value, "rank": fired.rank, "node": node, "at": fired.at})
        )
        tmp.replace(self.path(fault.kind))
        return fired
