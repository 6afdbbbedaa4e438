"""The demo trainer's faults: what each does, and the fault plan of a run (which, where, when).

Each fault kind is registered, in the module named after the failure it causes (``straggler``,
``hang``, ``rank_failure``, ``oom``), under :data:`FAULT_KINDS`: what it does to the rank it
fires on (through the :class:`Knobs` the trainer turns), the alerts it must set off, and the runs
the fault matrix (``benchmarks/fault_matrix.py``) makes of it. :func:`fault_kinds` lists them in
the catalogue's order; a fault plan names them.

``straggler:rank=2,at=20s,factor=1.5;hang:rank=1,at=60s;oom:rank=0,at=90s`` injects a slow
rank, a rank that stops joining collectives and an out-of-memory error. Times count from the
job's first start (kept in the checkpoint folder, so a restarted job does not replay its
faults); each fault fires once, and the file that records it also says when and where, which is
what the drill and the matrix measure detection and recovery from.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from trainguard.contract import FAILURES, Alert, Catalogue, Failure, Role

DEFAULT_PLAN = "straggler:rank=2,at=20s,factor=1.5;hang:rank=1,at=60s;oom:rank=0,at=90s"


class Knobs(Protocol):
    """What a fault can turn on the rank it fires on (the demo trainer's ``Sabotage``)."""

    base_work_seconds: float  # a healthy step's compute
    base_data_seconds: float  # a healthy batch's data wait
    batch_size: int
    work_seconds: float  # this step's compute
    data_seconds: float  # each batch's data wait
    comm_delay_seconds: float  # how late the rank enters each gradient sync
    comm_error: bool  # the process group fails the next gradient sync
    leak_bytes_per_step: int  # memory the rank keeps each step
    oom_above: int | None  # batch sizes above this run out of memory

    def stall(self) -> None:
        """Stop joining collectives (for far longer than the job waits)."""

    def kill(self) -> None:
        """End this rank's process at once, as SIGKILL does."""


@dataclass(frozen=True)
class FaultKind:
    """One kind of fault: its name in a plan, the failure it causes, what it does.

    ``fire`` runs once, on its rank, when it is due (at the next checkpoint if
    ``at_checkpoint``); ``sustain`` runs every step after it fired, with the slowdown factor
    on the rank and node it fired on (1.0 elsewhere, or once that rank moved). ``alerts`` are
    what must catch it; ``also_explains`` the alerts of other failures it rightly sets off
    where it is (a rank whose data loader slows is a straggler and is bound by its data
    loader): neither what catches it nor false. ``matrix`` the factors the fault matrix runs
    it at (see :meth:`matrix_runs`).
    """

    name: str
    failure: Failure
    description: str
    alerts: tuple[Alert, ...]
    fire: Callable[[Knobs], None] | None = None
    sustain: Callable[[Knobs, float], None] | None = None
    at_checkpoint: bool = False
    matrix: tuple[float, ...] = (1.0,)
    also_explains: tuple[Alert, ...] = ()

    @property
    def slows(self) -> bool:
        """Whether a factor says how much it slows its rank."""
        return self.sustain is not None

    def matrix_runs(self) -> list[tuple[str, float]]:
        """(run name, factor) of each of the fault matrix's runs of this kind: the kind's name,
        suffixed with the factor where it runs at several (``straggler_1.5x``)."""
        if len(self.matrix) == 1:
            return [(self.name, self.matrix[0])]
        return [(f"{self.name}_{factor:g}x", factor) for factor in self.matrix]


# What a failure's module in this package registers: the fault kinds that cause it.
FAULT_KINDS: Role[tuple[FaultKind, ...]] = Role("demo fault kinds", "trainguard.demo.faults")


def fault_kinds(catalogue: Catalogue = FAILURES) -> list[FaultKind]:
    """Every registered fault kind, failure by failure in the catalogue's order."""
    return [kind for _, kinds in catalogue.implementations(FAULT_KINDS) for kind in kinds]


def fault_kind(name: str, catalogue: Catalogue = FAILURES) -> FaultKind:
    """The fault kind a plan calls ``name``; ``FaultPlanError`` names the known ones."""
    known = fault_kinds(catalogue)
    for kind in known:
        if kind.name == name:
            return kind
    raise FaultPlanError(f"unknown fault {name!r} (known: {', '.join(k.name for k in known)})")


@dataclass(frozen=True)
class Fault:
    kind: FaultKind
    rank: int
    at_seconds: float
    factor: float = 1.5  # slowdowns: how much longer the rank's step work takes


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
        try:
            kind = fault_kind(kind_text.strip())
        except FaultPlanError as error:
            raise FaultPlanError(f"{error} in {part!r}") from None
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
        kind = fault_kind(str(data["kind"]))
        return cls(kind, int(data["rank"]), str(data["node"]), float(data["at"]))


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
        return self.folder / f"fault-{kind.name}.json"

    def fired(self, kind: FaultKind) -> FiredFault | None:
        path = self.path(kind)
        return FiredFault.load(path) if path.exists() else None

    def fire(self, fault: Fault, node: str) -> FiredFault:
        fired = FiredFault(fault.kind, fault.rank, node, time.time())
        tmp = self.path(fault.kind).with_suffix(".tmp")
        tmp.write_text(
            json.dumps({"kind": fired.kind.name, "rank": fired.rank, "node": node, "at": fired.at})
        )
        tmp.replace(self.path(fault.kind))
        return fired
