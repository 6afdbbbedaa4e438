"""A simulated fleet: one process serving N synthetic training ranks as N Prometheus targets.

Used by ``benchmarks/scale.py`` (and its quick test) to load a real Prometheus with the series
and the rules of a job of thousands of ranks on one machine.

What a rank serves is a real rank's exposition: at start the fleet runs the hook
(``trainguard.instrument``) on a tiny model for a few steps in a child process (a one-process
gloo DDP job: only a rank with a process group serves the collective counters) and takes the
registry's exposition as Prometheus negotiates it (OpenMetrics for the ``Accept`` header
Prometheus sends). Every sample line of it becomes a template line: the rank identity labels
(``rank``, ``local_rank``, ``node``) are replaced per rank and each value is a slot, so the fleet
serves exactly the families, labels, buckets (or summaries) the hook emits today, whatever they
become. The values of the families below are simulated (histograms and summaries alike); every
other sample keeps its captured value.

The simulation is one synchronous data-parallel job stepping on the wall clock (``--step-seconds``
per step, lognormal jitter per rank and phase): each rank's data wait, forward, backward and
optimizer times, its compute time (data + forward + backward), its wait on the slowest rank at
the gradient sync, the step time (equal on every rank: the slowest rank's compute plus the
exposed communication), gradient sync time and bytes, collectives launched and completed, the
odd collective caught in flight, ``trainguard_step`` and the last step's timestamp, and memory
gauges of a GPU with 80 GiB. Counters and histograms start at zero, as in fresh processes.

Two faults start together on ``POST /faults``: the slowed rank's forward and backward take
``--slow-factor`` times longer (so its compute time does, and every rank's step time follows
it), and the hung rank stops: none of its series moves again except the age of the collective
it launched and never completed, which grows, and the watchdog's stall counter, which counts
once that age passes the hook's stall floor. The other ranks keep stepping, which a real job
would not (its ranks block in the collective the hung rank never completes): that keeps the
straggler measurable in the same run as the hang.

The state of all ranks is one matrix (rank x slot) updated once per job step with numpy; a
scrape formats one row into the template (0.03 ms for a rank of 80 series, 0.1 ms for 288), so
4,096 targets cost about 0.1 s of CPU per scrape interval (``python benchmarks/fleet.py bench``).

One HTTP server (uvicorn) serves every rank, each at its own path ``/ranks/<i>/metrics``; the
file_sd file gives each target its ``__metrics_path__``, an ``instance`` of its own and the rank
identity as target labels, as a rank's own file_sd entry does. One port rather than one per rank:
4,096 listening sockets would need raised file limits, and Prometheus' keep-alive connections
are shared by the targets of one address instead of one per rank.

    python benchmarks/fleet.py serve --ranks 4096 --file-sd targets.json --ready-file ready.json
    python benchmarks/fleet.py bench --ranks 4096     # rendering cost, no server
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import re
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable
from dataclasses import dataclass
from operator import itemgetter
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from trainguard import contract

# The labels a rank's identity is made of besides its job's id (shared by every rank).
PER_RANK_LABELS = (contract.LABEL_RANK, contract.LABEL_LOCAL_RANK, contract.LABEL_NODE)
_IDENTITY = frozenset(contract.RANK_IDENTITY_LABELS)
GPUS_PER_NODE = 8
GIB = 1024.0**3
# Environment the capture's child must not inherit: it would announce or export the rank.
_INHERITED_PREFIXES = ("TRAINGUARD_", "OTEL_")
_LABEL_PAIR = re.compile(r'([A-Za-z_][A-Za-z0-9_]*)="((?:[^"\\]|\\.)*)"')
_SAMPLE_NAME = re.compile(r"[A-Za-z_:][A-Za-z0-9_:]*")

Matrix = npt.NDArray[np.float64]


class FleetError(RuntimeError):
    """The capture or its exposition could not be turned into a fleet."""


# --- the capture ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Capture:
    """A real rank's exposition as Prometheus would receive it, and the hook's stall floor."""

    exposition: str
    content_type: str
    stall_floor_seconds: float


def rank_identity(job_id: str, rank: int) -> dict[str, str]:
    """The identity labels of simulated rank ``rank`` (8 GPUs per node)."""
    return {
        contract.LABEL_JOB_ID: job_id,
        contract.LABEL_RANK: str(rank),
        contract.LABEL_LOCAL_RANK: str(rank % GPUS_PER_NODE),
        contract.LABEL_NODE: f"node-{rank // GPUS_PER_NODE:04d}",
    }


def capture(world_size: int, job_id: str, timeout: float = 300.0) -> Capture:
    """Run the hook on a tiny model in a child process and return rank 0's exposition."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(_INHERITED_PREFIXES)}
    done = subprocess.run(
        [sys.executable, str(Path(__file__).resolve()), "capture",
         "--world-size", str(world_size), "--job-id", job_id],
        capture_output=True, text=True, env=env, timeout=timeout, check=False,
    )  # fmt: skip
    if done.returncode != 0:
        raise FleetError(f"capturing a rank's exposition failed:\n{done.stderr[-4000:]}")
    data = json.loads(done.stdout)
    return Capture(data["exposition"], data["content_type"], float(data["stall_floor_seconds"]))


def _capture_main(args: argparse.Namespace) -> int:
    """The child: rank 0 of a one-process gloo DDP job, instrumented as rank 0 of ``world_size``
    ranks; a few steps, then the exposition. DDP rather than a plain module: only a rank with a
    process group serves the collective counters (Flight Recorder's sequence numbers)."""
    # Imported here: only the child needs torch, the fleet process stays small.
    import torch
    import torch.distributed as dist
    from prometheus_client import CollectorRegistry
    from prometheus_client.exposition import choose_encoder

    import trainguard
    from trainguard.exporters.serving import PROMETHEUS_SCRAPE_ACCEPT

    identity = rank_identity(args.job_id, 0)
    with tempfile.TemporaryDirectory(prefix="fleet-capture-") as store:
        dist.init_process_group("gloo", init_method=f"file://{store}/store", rank=0, world_size=1)
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(16, 16))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    registry = CollectorRegistry()
    handle = trainguard.instrument(
        model,
        optimizer,
        job_id=args.job_id,
        registry=registry,
        metrics_port=-1,
        tracing=False,
        local_rank=int(identity[contract.LABEL_LOCAL_RANK]),
        node=identity[contract.LABEL_NODE],
        world_size=args.world_size,
    )
    for _ in range(args.steps):
        model(torch.randn(8, 16)).sum().backward()
        optimizer.step()
        optimizer.zero_grad()
    handle.flush()
    # The encoder the rank's own /metrics server picks for Prometheus' Accept header.
    encoder, content_type = choose_encoder(PROMETHEUS_SCRAPE_ACCEPT)
    exposition = encoder(registry).decode()
    floor = handle.config.resolved_stall_floor()
    handle.uninstrument()
    dist.destroy_process_group()
    json.dump(
        {"exposition": exposition, "content_type": content_type, "stall_floor_seconds": floor},
        sys.stdout,
    )
    return 0


# --- the template ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Sample:
    """One sample line of an exposition, label values kept as written (escaped)."""

    name: str
    labels: tuple[tuple[str, str], ...]
    value: str
    tail: str  # timestamp and exemplar, as written


def parse_sample(line: str) -> Sample:
    """Split a sample line into name, labels, value and the rest; ``FleetError`` if it is not
    one (the fleet only ever reads what prometheus_client wrote)."""
    match = _SAMPLE_NAME.match(line)
    if match is None:
        raise FleetError(f"not a sample line: {line!r}")
    name, rest = match.group(), line[match.end() :]
    labels: list[tuple[str, str]] = []
    if rest.startswith("{"):
        position = 1
        while rest[position] != "}":
            pair = _LABEL_PAIR.match(rest, position)
            if pair is None:
                raise FleetError(f"unreadable labels in {line!r}")
            labels.append((pair.group(1), pair.group(2)))
            position = pair.end()
            if rest[position] == ",":
                position += 1
        rest = rest[position + 1 :]
    value, _, tail = rest.strip().partition(" ")
    try:
        float(value)
    except ValueError:
        raise FleetError(f"no value in {line!r}") from None
    return Sample(name, tuple(labels), value, tail)


@dataclass(frozen=True)
class HistogramSlots:
    """Where one histogram (or summary) series' buckets, sum and count sit in a rank's row;
    ``buckets`` is None where it has none (a summary without quantiles)."""

    bounds: npt.NDArray[np.float64]
    buckets: slice | None
    sum: int
    count: int


SlotKey = tuple[str, frozenset[tuple[str, str]]]


class Template:
    """An exposition cut into literal text and gaps: one gap per sample value (a slot of a
    rank's row, initially the captured value) and one per identity label value (``rank``,
    ``local_rank``, ``node``). Slots are found by sample name and the labels beyond the
    identity. Rendering fills the gaps with one ``itemgetter`` call and joins: about 0.1 ms
    for a rank of 286 samples, where ``str.format`` on the same text took 0.26 ms."""

    def __init__(self, exposition: str, content_type: str) -> None:
        self.content_type = content_type
        self.initial: list[float] = []
        self.columns: dict[SlotKey, int] = {}
        # A histogram series' buckets by (bucket sample name, labels but le): (le, slot) pairs.
        self.buckets: dict[SlotKey, list[tuple[float, int]]] = {}
        chunks = [""]
        gaps: list[int] = []  # a slot, or -1 - the identity label's index in PER_RANK_LABELS
        for line in exposition.splitlines():
            if not line or line.startswith("#"):
                chunks[-1] += line + "\n"
                continue
            sample = parse_sample(line)
            column = len(self.initial)
            self.initial.append(float(sample.value))
            labels = {k: v for k, v in sample.labels if k not in _IDENTITY}
            self.columns[(sample.name, frozenset(labels.items()))] = column
            if "le" in labels:
                bound = float(labels.pop("le"))
                key = (sample.name, frozenset(labels.items()))
                self.buckets.setdefault(key, []).append((bound, column))
            chunks[-1] += sample.name
            for i, (k, v) in enumerate(sample.labels):
                chunks[-1] += ("{" if i == 0 else ",") + f'{k}="'
                if k in PER_RANK_LABELS:
                    gaps.append(-1 - PER_RANK_LABELS.index(k))
                    chunks.append("")
                else:
                    chunks[-1] += v
                chunks[-1] += '"'
            chunks[-1] += "} " if sample.labels else " "
            gaps.append(column)
            chunks.append(" " + sample.tail + "\n" if sample.tail else "\n")
        if not self.initial:
            raise FleetError("the captured exposition has no samples")
        slots = len(self.initial)
        self._pick = itemgetter(*(g if g >= 0 else slots - 1 - g for g in gaps))
        self._frame = [""] * (len(chunks) + len(gaps))
        self._frame[0::2] = chunks

    def render(self, values: list[float], identity: tuple[str, ...]) -> bytes:
        """The exposition of a rank whose row is ``values`` and whose identity label values
        are ``identity`` (in the order of ``PER_RANK_LABELS``)."""
        strings = [*map(repr, values), *identity]
        out = self._frame.copy()
        out[1::2] = self._pick(strings)
        return "".join(out).encode()

    def column(self, name: str, **labels: str) -> int | None:
        """The slot of sample ``name`` with these labels (beyond the identity), if served."""
        return self.columns.get((name, frozenset(labels.items())))

    def histogram(self, spec: contract.MetricSpec, **labels: str) -> HistogramSlots | None:
        """The slots of one series of histogram ``spec`` (served as a histogram, or as a
        summary: ``_sum`` and ``_count`` alone), if the exposition has it."""
        sum_column = self.column(spec.sum_name, **labels)
        count_column = self.column(spec.count_name, **labels)
        if sum_column is None or count_column is None:
            return None
        buckets = sorted(self.buckets.get((spec.bucket_name, frozenset(labels.items())), []))
        if not buckets:
            return HistogramSlots(np.empty(0), None, sum_column, count_column)
        first, last = buckets[0][1], buckets[-1][1]
        if [column for _, column in buckets] != list(range(first, last + 1)):
            raise FleetError(f"the buckets of {spec.name} {labels} are not consecutive lines")
        bounds = np.array([bound for bound, _ in buckets])
        return HistogramSlots(bounds, slice(first, last + 1), sum_column, count_column)


# --- the simulation -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Workload:
    """A rank's step in shares of ``step_seconds`` (they add up to 1: a step without jitter;
    the wait for the slowest rank adds a few percent, more with more ranks), and the faults'
    strength."""

    step_seconds: float = 1.0
    data: float = 0.04
    forward: float = 0.26
    backward: float = 0.50
    optimizer: float = 0.06
    exposed_comm: float = 0.14
    # Share of backward during which the gradient sync runs (it overlaps backward compute).
    sync_overlap: float = 0.5
    jitter: float = 0.03  # sigma of the lognormal factor on each phase of each rank
    collectives_per_step: int = 4
    grad_bytes_per_step: float = 1.4e9
    memory_capacity: float = 80 * GIB
    memory_reserved: float = 56 * GIB
    memory_allocated: float = 50 * GIB
    slow_factor: float = 1.8


@dataclass
class _Draw:
    """One job step's durations, rank by rank."""

    data: Matrix
    forward: Matrix
    backward: Matrix
    optimizer: Matrix
    compute: Matrix
    sync_wait: Matrix
    step: Matrix
    grad_sync: Matrix
    job_step: float


class Fleet:
    """N ranks of one job, their state one matrix (rank x slot) of the template's values."""

    def __init__(
        self,
        template: Template,
        ranks: int,
        job_id: str,
        *,
        slow_rank: int,
        hung_rank: int,
        workload: Workload | None = None,
        stall_floor_seconds: float = 30.0,
        seed: int = 0,
        start: float | None = None,
    ) -> None:
        if not 0 <= slow_rank < ranks or not 0 <= hung_rank < ranks or slow_rank == hung_rank:
            raise FleetError(f"slow rank {slow_rank} and hung rank {hung_rank} of {ranks} ranks")
        self.template = template
        self.ranks = ranks
        self.job_id = job_id
        self.slow_rank = slow_rank
        self.hung_rank = hung_rank
        self.workload = workload or Workload()
        self.stall_floor_seconds = stall_floor_seconds
        self.rng = np.random.default_rng(seed)
        self.identities = [rank_identity(job_id, i) for i in range(ranks)]
        self._identity_values = [tuple(ids[k] for k in PER_RANK_LABELS) for ids in self.identities]
        self.values: Matrix = np.tile(np.array(template.initial, dtype=np.float64), (ranks, 1))
        self.steps = 0
        self.faults_at: float | None = None
        self._frozen: Matrix | None = None
        self._stall_counted = False
        self._find_slots()
        self._reset()
        now = time.time() if start is None else start
        self._next = self._draw()
        self.next_step_at = now + self._next.job_step

    # Slots of the simulated series; None where the exposition does not have them.
    def _find_slots(self) -> None:
        t = self.template
        self.histograms = {
            "step": t.histogram(contract.STEP_DURATION),
            "compute": t.histogram(contract.STEP_COMPUTE_DURATION),
            "sync_wait": t.histogram(contract.SYNC_WAIT_DURATION),
            "grad_sync": t.histogram(contract.GRAD_SYNC_DURATION),
            **{
                phase.value: t.histogram(contract.STEP_PHASE_DURATION, phase=phase.value)
                for phase in contract.Phase
            },
        }
        self.col = {
            spec.name: t.column(spec.name)
            for spec in (
                contract.STEPS, contract.TRAINING_STEP, contract.LAST_STEP_TIMESTAMP,
                contract.WORLD_SIZE, contract.RANK_INDEX, contract.COLLECTIVES_LAUNCHED,
                contract.COLLECTIVES_COMPLETED, contract.COLLECTIVE_INFLIGHT,
                contract.COLLECTIVE_OLDEST_INFLIGHT, contract.COLLECTIVE_STALLS,
                contract.GRAD_SYNC_BYTES, contract.MEMORY_ALLOCATED, contract.MEMORY_RESERVED,
                contract.MEMORY_CAPACITY, contract.MEMORY_FRAGMENTATION,
            )
        }  # fmt: skip

    def _set(self, spec: contract.MetricSpec, values: Matrix | float) -> None:
        column = self.col[spec.name]
        if column is not None:
            self.values[:, column] = values

    def _add(self, spec: contract.MetricSpec, values: Matrix | float) -> None:
        column = self.col[spec.name]
        if column is not None:
            self.values[:, column] += values

    def _hung_value(self, spec: contract.MetricSpec) -> float:
        """The hung rank's value of ``spec`` (0 where the exposition lacks it)."""
        column = self.col[spec.name]
        return 0.0 if column is None else float(self.values[self.hung_rank, column])

    def _set_hung(self, spec: contract.MetricSpec, value: float) -> None:
        column = self.col[spec.name]
        if column is not None:
            self.values[self.hung_rank, column] = value
            if self._frozen is not None:
                self._frozen[column] = value

    def _reset(self) -> None:
        """Fresh processes: counters and histograms at zero, identity and static gauges set."""
        for slots in self.histograms.values():
            if slots is None:
                continue
            if slots.buckets is not None:
                self.values[:, slots.buckets] = 0.0
            self.values[:, [slots.sum, slots.count]] = 0.0
        for spec in (
            contract.STEPS, contract.TRAINING_STEP, contract.LAST_STEP_TIMESTAMP,
            contract.COLLECTIVES_LAUNCHED, contract.COLLECTIVES_COMPLETED,
            contract.COLLECTIVE_INFLIGHT, contract.COLLECTIVE_OLDEST_INFLIGHT,
            contract.COLLECTIVE_STALLS, contract.GRAD_SYNC_BYTES,
        ):  # fmt: skip
            self._set(spec, 0.0)
        w = self.workload
        self._set(contract.WORLD_SIZE, float(self.ranks))
        self._set(contract.RANK_INDEX, np.arange(self.ranks, dtype=np.float64))
        self._set(contract.MEMORY_CAPACITY, w.memory_capacity)
        self._set(contract.MEMORY_RESERVED, w.memory_reserved)
        self._memory()

    def _memory(self) -> None:
        w = self.workload
        allocated = w.memory_allocated + self.rng.normal(0.0, 0.2 * GIB, self.ranks)
        self._set(contract.MEMORY_ALLOCATED, allocated)
        self._set(
            contract.MEMORY_FRAGMENTATION, (w.memory_reserved - allocated) / w.memory_reserved
        )

    def _draw(self) -> _Draw:
        """The durations of the next step: per-rank jitter, the slowed rank slower once faults
        run, and the wait for the slowest live rank."""
        w, n = self.workload, self.ranks
        factors = self.rng.lognormal(0.0, w.jitter, size=(4, n)) * w.step_seconds
        slow = np.ones(n)
        live = np.ones(n, dtype=bool)
        if self.faults_at is not None:
            slow[self.slow_rank] = w.slow_factor
            live[self.hung_rank] = False
        data = w.data * factors[0]
        forward = w.forward * factors[1] * slow
        backward = w.backward * factors[2] * slow
        optimizer = w.optimizer * factors[3]
        compute = data + forward + backward
        slowest = float(np.max(compute, where=live, initial=0.0))
        exposed = w.exposed_comm * w.step_seconds * float(self.rng.lognormal(0.0, w.jitter))
        sync_wait = slowest - compute + exposed
        step = compute + sync_wait + optimizer
        return _Draw(
            data=data,
            forward=forward,
            backward=backward,
            optimizer=optimizer,
            compute=compute,
            sync_wait=sync_wait,
            step=step,
            grad_sync=sync_wait + w.sync_overlap * backward,
            job_step=float(np.max(step, where=live, initial=0.0)),
        )

    def _observe(self, name: str, observed: Matrix) -> None:
        slots = self.histograms[name]
        if slots is None:
            return
        if slots.buckets is not None:
            self.values[:, slots.buckets] += observed[:, None] <= slots.bounds[None, :]
        self.values[:, slots.sum] += observed
        self.values[:, slots.count] += 1.0

    def _complete(self, d: _Draw, at: float) -> None:
        """Apply one completed step to every rank; the hung rank's row stays as it hung."""
        w = self.workload
        self._add(contract.STEPS, 1.0)
        self._add(contract.TRAINING_STEP, 1.0)
        self._set(contract.LAST_STEP_TIMESTAMP, at)
        for name, observed in (
            ("step", d.step), ("compute", d.compute), ("sync_wait", d.sync_wait),
            ("grad_sync", d.grad_sync), (contract.Phase.DATA.value, d.data),
            (contract.Phase.FORWARD.value, d.forward),
            (contract.Phase.BACKWARD.value, d.backward + d.sync_wait),
            (contract.Phase.OPTIMIZER.value, d.optimizer),
        ):  # fmt: skip
            self._observe(name, observed)
        self._add(contract.COLLECTIVES_LAUNCHED, float(w.collectives_per_step))
        self._add(contract.COLLECTIVES_COMPLETED, float(w.collectives_per_step))
        self._add(contract.GRAD_SYNC_BYTES, w.grad_bytes_per_step)
        # A scrape lands inside the gradient sync now and then: one collective in flight.
        in_sync = self.rng.random(self.ranks) < d.grad_sync / np.maximum(d.step, 1e-9)
        self._set(contract.COLLECTIVE_INFLIGHT, in_sync.astype(np.float64))
        ages = in_sync * self.rng.random(self.ranks) * d.grad_sync
        self._set(contract.COLLECTIVE_OLDEST_INFLIGHT, ages)
        self._memory()
        if self._frozen is not None:
            self.values[self.hung_rank] = self._frozen
        self.steps += 1

    def advance(self, now: float) -> None:
        """Complete every step due by ``now``."""
        while self.next_step_at <= now:
            self._complete(self._next, self.next_step_at)
            self._next = self._draw()
            self.next_step_at += self._next.job_step

    def start_faults(self, now: float) -> float:
        """Slow one rank and hang another from ``now``; returns when the faults started (the
        first call's time: faults start once)."""
        self.advance(now)
        if self.faults_at is not None:
            return self.faults_at
        self.faults_at = now
        # It launched the step's first collective, which never completes.
        for spec, value in (
            (contract.COLLECTIVES_LAUNCHED, self._hung_value(contract.COLLECTIVES_LAUNCHED) + 1.0),
            (contract.COLLECTIVE_INFLIGHT, 1.0),
            (contract.COLLECTIVE_OLDEST_INFLIGHT, 0.0),
        ):
            self._set_hung(spec, value)
        hung = self.values[self.hung_rank]
        self._frozen = hung.copy()
        # The steps in progress were drawn before the faults: draw the next one with them.
        self._next = self._draw()
        self.next_step_at = now + self._next.job_step
        return now

    def _hung_age(self, now: float) -> None:
        assert self.faults_at is not None
        age = max(0.0, now - self.faults_at)
        self._set_hung(contract.COLLECTIVE_OLDEST_INFLIGHT, age)
        if not self._stall_counted and age >= self.stall_floor_seconds:
            # The hook's watchdog counts a stall once the age passes its floor.
            self._set_hung(
                contract.COLLECTIVE_STALLS, self._hung_value(contract.COLLECTIVE_STALLS) + 1
            )
            self._stall_counted = True

    def render(self, rank: int, now: float) -> bytes:
        """Rank ``rank``'s exposition at ``now``."""
        self.advance(now)
        if rank == self.hung_rank and self.faults_at is not None:
            self._hung_age(now)
        return self.template.render(self.values[rank].tolist(), self._identity_values[rank])

    def status(self) -> dict[str, Any]:
        return {
            "ranks": self.ranks,
            "job_id": self.job_id,
            "steps": self.steps,
            "slow_rank": self.slow_rank,
            "hung_rank": self.hung_rank,
            "faults_at": self.faults_at,
        }

    def file_sd(self, address: str) -> list[dict[str, Any]]:
        """One file_sd target group per rank: its path on the fleet's address, and the labels a
        rank's own file_sd entry carries (identity), with an ``instance`` of its own."""
        return [
            {
                "targets": [address],
                "labels": {
                    "__metrics_path__": f"/ranks/{i}/metrics",
                    "instance": f"{ids[contract.LABEL_NODE]}:{9400 + i % GPUS_PER_NODE}",
                    **ids,
                },
            }
            for i, ids in enumerate(self.identities)
        ]


def default_faulty_ranks(ranks: int) -> tuple[int, int]:
    """The slowed and the hung rank: a third and two thirds of the way, never rank 0."""
    if ranks < 3:
        raise FleetError("a fleet needs at least 3 ranks (a healthy one, a slow one, a hung one)")
    return max(1, ranks // 3), max(2, 2 * ranks // 3)


def build(args: argparse.Namespace) -> Fleet:
    """Capture a real rank and build the fleet the arguments describe."""
    slow, hung = default_faulty_ranks(args.ranks)
    captured = capture(args.ranks, args.job_id)
    template = Template(captured.exposition, captured.content_type)
    return Fleet(
        template,
        args.ranks,
        args.job_id,
        slow_rank=slow if args.slow_rank is None else args.slow_rank,
        hung_rank=hung if args.hung_rank is None else args.hung_rank,
        workload=Workload(step_seconds=args.step_seconds, slow_factor=args.slow_factor),
        stall_floor_seconds=captured.stall_floor_seconds,
        seed=args.seed,
    )


# --- serving --------------------------------------------------------------------------------------


def app(fleet: Fleet) -> Starlette:
    """``GET /ranks/<i>/metrics``, ``GET /status``, ``POST /faults``."""

    async def metrics(request: Request) -> Response:
        rank = int(request.path_params["rank"])
        if not 0 <= rank < fleet.ranks:
            return Response(f"no rank {rank}\n", status_code=404, media_type="text/plain")
        body = fleet.render(rank, time.time())
        return Response(body, headers={"content-type": fleet.template.content_type})

    async def status(request: Request) -> JSONResponse:
        return JSONResponse(fleet.status())

    async def faults(request: Request) -> JSONResponse:
        fleet.start_faults(time.time())
        return JSONResponse(fleet.status())

    return Starlette(
        routes=[
            Route("/ranks/{rank:int}/metrics", metrics),
            Route("/status", status),
            Route("/faults", faults, methods=["POST"]),
        ]
    )


def _write_atomically(path: Path, data: Any) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(data))
    tmp.replace(path)


def serve(args: argparse.Namespace) -> int:
    fleet = build(args)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((args.host, args.port))
    address = f"{args.host}:{sock.getsockname()[1]}"
    if args.file_sd is not None:
        _write_atomically(args.file_sd, fleet.file_sd(address))
    config = uvicorn.Config(app(fleet), log_level="warning", access_log=False, backlog=4096)
    server = uvicorn.Server(config)
    if args.ready_file is not None:
        _write_atomically(args.ready_file, {"address": address, **fleet.status()})
    print(f"fleet: {fleet.ranks} ranks on http://{address}/ranks/<i>/metrics", file=sys.stderr)
    asyncio.run(server.serve(sockets=[sock]))
    return 0


def bench(args: argparse.Namespace) -> int:
    """Rendering cost: every rank once, before and after faults, on this process' CPU."""
    fleet = build(args)
    now = time.time()
    fleet.advance(now + 30 * args.step_seconds)
    sizes = []
    started = time.process_time()
    for rank in range(fleet.ranks):
        sizes.append(len(fleet.render(rank, now + 30 * args.step_seconds)))
    render_s = time.process_time() - started
    started = time.process_time()
    fleet.advance(now + 60 * args.step_seconds)
    step_s = (time.process_time() - started) / 30
    print(
        f"ranks={fleet.ranks} slots={len(fleet.template.initial)} "
        f"body_bytes={int(np.median(sizes))} "
        f"render_ms_per_rank={1000 * render_s / fleet.ranks:.3f} "
        f"render_s_all_ranks={render_s:.3f} step_ms={1000 * step_s:.2f}"
    )
    return 0


def _arguments(argv: Iterable[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    for name in ("serve", "bench"):
        p = sub.add_parser(name)
        p.add_argument("--ranks", type=int, required=True)
        p.add_argument("--job-id", default="scale")
        p.add_argument("--step-seconds", type=float, default=Workload.step_seconds)
        p.add_argument("--slow-factor", type=float, default=Workload.slow_factor)
        p.add_argument("--slow-rank", type=int, default=None)
        p.add_argument("--hung-rank", type=int, default=None)
        p.add_argument("--seed", type=int, default=0)
        if name == "serve":
            p.add_argument("--host", default="127.0.0.1")
            p.add_argument("--port", type=int, default=0)
            p.add_argument("--file-sd", type=Path, default=None)
            p.add_argument("--ready-file", type=Path, default=None)
    p = sub.add_parser("capture", help="(internal) print a real rank's exposition as JSON")
    p.add_argument("--world-size", type=int, required=True)
    p.add_argument("--job-id", required=True)
    p.add_argument("--steps", type=int, default=10)
    args = parser.parse_args(None if argv is None else list(argv))
    if args.command != "capture" and not (
        math.isfinite(args.step_seconds) and args.step_seconds > 0
    ):
        parser.error("--step-seconds must be a positive number")
    return args


def main(argv: Iterable[str] | None = None) -> int:
    args = _arguments(argv)
    try:
        if args.command == "capture":
            return _capture_main(args)
        if args.command == "bench":
            return bench(args)
        return serve(args)
    except FleetError as error:
        print(f"fleet: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
