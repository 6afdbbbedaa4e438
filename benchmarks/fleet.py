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
``--noise`` drives the ranks' compute with the demo trainer's healthy noise model instead
(``trainguard.demo.noise``: its factor per step and rank on forward and backward, its whole-job
pauses in every rank's data wait, its noisy neighbour's bursts on one node).

Two faults start together on ``POST /faults``: the slowed rank's forward and backward take
``--slow-factor`` times longer (so its compute time does, and every rank's step time follows
it), and the hung rank stops: none of its series moves again except the age of the collective
it launched and never completed, which grows, and the watchdog's stall counter, which counts
once that age passes the hook's stall floor. The other ranks keep stepping, which a real job
would not (its ranks block in the collective the hung rank never completes): that keeps the
straggler measurable in the same run as the hang.

The state of all ranks is one matrix (rank x slot) updated once per job step with numpy; a
scrape formats one row into the template (0.03 ms for a rank of 80 series, 0.1 ms for 288), so
4,096 targets cost about 0.1 s of CPU per scrape interval (``python -m benchmarks.fleet bench``).

One HTTP server (uvicorn) serves every rank, each at its own path ``/ranks/<i>/metrics``; the
file_sd file gives each target its ``__metrics_path__``, an ``instance`` of its own and the rank
identity as target labels, as a rank's own file_sd entry does. One port rather than one per rank:
4,096 listening sockets would need raised file limits, and Prometheus' keep-alive connections
are shared by the targets of one address instead of one per rank.

    python -m benchmarks.fleet serve --ranks 4096 --file-sd targets.json --ready-file ready.json
    python -m benchmarks.fleet bench --ranks 4096     # rendering cost, no server
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import socket
import sys
import time
from collections.abc import Iterable
from dataclasses import astuple, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from benchmarks.fleet_template import (
    GPUS_PER_NODE,
    PER_RANK_LABELS,
    FleetError,
    Template,
    _capture_main,
    capture,
    rank_identity,
)
from trainguard import contract
from trainguard.demo.noise import Noise

GIB = 1024.0**3

Matrix = npt.NDArray[np.float64]


# --- the capture ----------------------------------------------------------------------------------


# --- the template ---------------------------------------------------------------------------------


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
    inputs: Matrix  # each rank's batch size (its input elements, relative)


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
        noise: Noise | None = None,
        first_node: int = 0,
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
        self.noise = noise
        self.identities = [rank_identity(job_id, i, first_node) for i in range(ranks)]
        self._nodes = [ids[contract.LABEL_NODE] for ids in self.identities]
        self._identity_values = [tuple(ids[k] for k in PER_RANK_LABELS) for ids in self.identities]
        self.values: Matrix = np.tile(np.array(template.initial, dtype=np.float64), (ranks, 1))
        self.steps = 0
        self.faults_at: float | None = None
        self.hanging = False  # whether the faults hung a rank (start_faults' hang)
        self._frozen: Matrix | None = None
        self._stall_counted = False
        self._find_slots()
        self._reset()
        now = time.time() if start is None else start
        self.started_at = now
        self._next = self._draw(now)
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
                contract.STEP_COMPUTE_SHARE,
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
        # The hook's recent compute share (every step here, as on FSDP; on DDP the steps DDP
        # times): median compute per input element over RECENT_COMPUTE_SECONDS, times the mean
        # input size, over the mean compute + sync wait, of the last USUAL_OBSERVATIONS steps.
        # A ring of the latest steps, long enough for the window at half-length steps.
        ring = min(
            contract.RECENT_COMPUTE_MAX_OBSERVATIONS,
            contract.RECENT_COMPUTE_MIN_OBSERVATIONS
            + math.ceil(2 * contract.RECENT_COMPUTE_SECONDS / w.step_seconds),
        )
        self._recent_compute = np.zeros((self.ranks, ring))
        self._usual_inputs = np.zeros((self.ranks, contract.USUAL_OBSERVATIONS))
        self._usual_busy = np.zeros((self.ranks, contract.USUAL_OBSERVATIONS))
        self._recent_ended = np.full(ring, -math.inf)
        self._recent_seen = 0
        self._set(contract.STEP_COMPUTE_SHARE, 0.0)
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

    def _draw(self, at: float) -> _Draw:
        """The durations of the next step (starting ``at``): per-rank jitter, or the healthy
        noise model where the fleet has one (then its compute factor on forward and backward,
        its whole-job pauses in every rank's data wait), the slowed rank slower once faults run,
        and the wait for the slowest live rank."""
        w, n = self.workload, self.ranks
        jitter = 0.0 if self.noise is not None else w.jitter
        factors = self.rng.lognormal(0.0, jitter, size=(4, n)) * w.step_seconds
        inputs, slow = self._noise_draws(at) if self.noise is not None else (np.ones(n), np.ones(n))
        live = np.ones(n, dtype=bool)
        if self.faults_at is not None:
            slow[self.slow_rank] *= w.slow_factor
        if self.hanging:
            live[self.hung_rank] = False
        data = w.data * factors[0]
        if self.noise is not None:
            data += self.noise.pause_seconds(self.steps + 1)
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
            inputs=inputs,
        )

    def _noise_draws(self, at: float) -> tuple[Matrix, Matrix]:
        """Each rank's batch size and compute factor for the next step under the noise model."""
        noise = self.noise
        assert noise is not None
        step, elapsed = self.steps + 1, at - self.started_at
        busy = noise.neighbour_factor(noise.neighbour_node or "", elapsed)
        sizes, factors = np.array([astuple(noise.draw(step, r)) for r in range(self.ranks)]).T
        on_neighbour = np.array([node == noise.neighbour_node for node in self._nodes])
        return sizes, np.where(on_neighbour, factors * busy, factors)

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
        ring, usual = self._recent_ended.size, self._usual_inputs.shape[1]
        slot = self._recent_seen % ring
        self._recent_compute[:, slot] = d.compute / d.inputs
        self._usual_inputs[:, self._recent_seen % usual] = d.inputs
        self._usual_busy[:, self._recent_seen % usual] = d.compute + d.sync_wait
        self._recent_ended[slot] = at
        self._recent_seen += 1
        # No share until the window has filled once (the hook's RecentMedian.ready). Every
        # rank's steps end together: one choice of slots for all of them.
        if at - self.started_at >= contract.RECENT_COMPUTE_SECONDS:
            newest = np.argsort(-self._recent_ended)[: min(ring, self._recent_seen)]
            held = self._recent_ended[newest] >= at - contract.RECENT_COMPUTE_SECONDS
            held[: contract.RECENT_COMPUTE_MIN_OBSERVATIONS] = True
            kept, seen = newest[held], min(usual, self._recent_seen)
            per_input = np.median(self._recent_compute[:, kept], axis=1)
            usual_step = np.mean(self._usual_busy[:, :seen], axis=1)
            inputs = np.mean(self._usual_inputs[:, :seen], axis=1)
            self._set(contract.STEP_COMPUTE_SHARE, per_input * inputs / usual_step)
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
            self._next = self._draw(self.next_step_at)
            self.next_step_at += self._next.job_step

    def start_faults(self, now: float, hang: bool = True) -> float:
        """Slow one rank and hang another (unless not ``hang``) from ``now``; returns when the
        faults started (the first call's time: faults start once)."""
        self.advance(now)
        if self.faults_at is not None:
            return self.faults_at
        self.faults_at = now
        if hang:
            self.hanging = True
            # It launched the step's first collective, which never completes.
            launched = self._hung_value(contract.COLLECTIVES_LAUNCHED) + 1.0
            for spec, value in (
                (contract.COLLECTIVES_LAUNCHED, launched),
                (contract.COLLECTIVE_INFLIGHT, 1.0),
                (contract.COLLECTIVE_OLDEST_INFLIGHT, 0.0),
            ):
                self._set_hung(spec, value)
            self._frozen = self.values[self.hung_rank].copy()
        # The steps in progress were drawn before the faults: draw the next one with them.
        self._next = self._draw(now)
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
        if rank == self.hung_rank and self.hanging:
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

    def file_sd(self, address: str, path_prefix: str = "") -> list[dict[str, Any]]:
        """One file_sd target group per rank: its path on the fleet's address (under
        ``path_prefix``), and the labels a rank's own file_sd entry carries (identity), with an
        ``instance`` of its own."""
        return [
            {
                "targets": [address],
                "labels": {
                    "__metrics_path__": f"{path_prefix}/ranks/{i}/metrics",
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
        noise=None if args.noise is None else Noise.parse(args.noise, seed=args.seed),
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
        p.add_argument(
            "--noise",
            default=None,
            help="drive the ranks' compute with the healthy noise model (trainguard.demo.noise: "
            '"default" or key=value overrides) instead of the lognormal phase jitter',
        )
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
