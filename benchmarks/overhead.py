"""What trainguard's hook costs a training step, against the same model without it, in one run.

``--model ddp`` (the default) or ``--model fsdp2``. Two gloo ranks on the CPU (this machine has
2 cores), a model of six Linear(2048, 2048) layers and a batch of 32: wrapped in DDP (its
default 25 MB buckets: about 100 MB of gradients in four buckets), or sharded with FSDP2
(``init_device_mesh("cpu", (2,))``, ``fully_shard`` on each Linear and on the root
Sequential). Every variant is its own replica in the same process group, and the variants run
interleaved in blocks of ``--steps`` steps, the order rotated every round and the same on both
ranks, so drift in the machine's load hits them all alike:

- plain: the model as it comes (DDP, or FSDP2);
- hook_floor (DDP only): torch's own ``allreduce_hook`` (what any Python comm hook pays);
- default: ``trainguard.instrument`` with its defaults and ``metrics_port=-1`` (DDP: the
  reducer's timers, no comm hook; FSDP2: the collective timeline; the watchdog on, no spans);
- per_bucket: ``per_bucket=True`` (DDP: a comm hook timing every bucket; FSDP2 has no comm
  hook: the worker observes every all-gather and reduce-scatter on its own instead);
- all (DDP only): per-bucket, spans built and handed to an exporter that discards them,
  ``/metrics`` served (never scraped), the watchdog on;
- production: what users run: the defaults (no per_bucket) plus spans exported with
  ``OTLPSpanExporter`` over OTLP/HTTP to a receiver in this benchmark's parent process (a
  ThreadingHTTPServer that reads each body and answers 200 with an empty body; its request and
  byte counts are printed, so it is visible that spans were exported), ``/metrics`` served on
  127.0.0.1 and scraped every 15 s with Prometheus' headers (OpenMetrics, gzip), and the
  watchdog on (dumps to a temporary folder). The scraper is a daemon thread in each rank
  process: the rank pays the client side of every scrape as well as the server side, which in
  production Prometheus' own process pays, so the production figure is pessimistic by that
  much (a scrape every 15 s: little).

Wall time (rank 0): each variant's figure for a round is the median step of its block; its
ratio for the round is that over plain's in the same round, and the reported ratio is the
median over rounds (the rounds' quartiles are printed: on a shared 2-core machine they are
wider than the targets). Idle replicas' threads (below) take CPU from whichever block runs, a
little more from plain's (every instrumented replica is idle then) than from an instrumented
variant's, which leans the wall ratios slightly in the hook's favour; the CPU figures do not
have that bias.

CPU time per step, both ranks' together, two ways. "process" is the rank process's CPU time
(every thread) during the variant's block, as this benchmark has always measured it. But the
threads of an instrumented replica (its worker, watchdog, span exporter and ``/metrics``
server) keep running while the other variants' blocks run, so part of their cost lands on the
others, plain included, and cancels out of the ratio. "attributed" charges threads to their
owners: the process CPU time of the block less that of every Python thread but the training
thread (what remains: the training thread, gloo's C++ threads, threads that ended during the
block), plus what the variant's own threads (those ``instrument`` started, told apart by
listing the process's threads before and after, and the scraper for production) used during
its own block: what they would cost a job that runs only this variant (their cost per second,
their work per step). What an idle replica's threads use while other variants run (a worker
that keeps waking, a watchdog that finds the last step long ago) is charged to no variant and
printed apart ("idle ms/s"). The ``/metrics`` server answers each scrape on a thread that ends
with the request, which per-thread clocks miss; its CPU per scrape is measured at the end
(sequential scrapes from the idle training thread) and moved from the blocks the scrapes fell
in to production. Thread times are per-thread CPU clocks (``pthread_getcpuclockid``). The
``*_cpu_ratio`` figures of the last lines are medians over rounds of the per-round ratios of
attributed CPU time.

The ranks run with glibc's malloc thresholds fixed (``GLIBC_TUNABLES``, see
:data:`MALLOC_TUNABLES`): left adaptive, whichever replica is built last faults in its
gradients' pages afresh every step (16,000 minor page faults and some 40 ms of training-thread
CPU per DDP step, measured), an artifact of the build order that made the last-built variant
(production) look 15% dearer in a run here. The training thread's page faults per step are
printed per variant. So is each instrumented replica's timing source at the end (DDP's reducer
timers, the collective timeline, or wall clock once the hook gave the timers up).

Training-thread time per step: a 300 ms step hides microseconds, so the hook's own work is
measured on a tiny model of the same kind, as the training thread's own CPU time
(``time.thread_time_ns``). The figure is the median over rounds of the per-round difference,
instrumented minus plain.

DDP (Linear(16, 16), in each rank before the large model runs, in the same process group):
plain, default and production interleaved in short blocks (about a second each:
``--tiny-steps`` steps, ``--tiny-rounds`` rounds), each round's figure the two ranks' mean.
Here only the variant whose block runs is instrumented: it is instrumented before its block (a
few unmeasured steps follow) and uninstrumented after it, because an idle replica's worker
keeps waking (every 10-100 ms, backing off to once a second) and would tax every other block,
plain's most (plain runs with no hook in the process at all). The worker's processing, which in
real training overlaps the GIL-free C++ of forward and backward, is not charged there; whatever
the hook makes the training thread do is, in Python or in C++ (the DDP runtime statistics the
hook asks DDP for), and so is what the training thread spends switching when the hook's threads
take the GIL (the training thread's context switches per step are printed beside it).

FSDP2 (three ``fully_shard`` Linear(16, 16) units and the root): over gloo a tiny FSDP2 step is
4 ms of Python on the training thread but 17-25 ms of wall time here (two ranks on two shared
cores waiting on each other nine times a step), and its CPU time spreads several hundred
microseconds from step to step, so blocks of it resolved the hook's tens of microseconds to
about +-100 us, and 160 rounds to +-15 us. So the FSDP2 figure comes from one process of its own
(before the ranks start) on torch's fake process group (``init_process_group("fake")`` with a
``HashStore``, world size 2, rank 0: the same ``fully_shard`` code, the same nine collectives
through the same ``torch.distributed`` functions and so through the timeline's wraps, but
collectives that return at once): a step is then 3 ms of wall time as well as of CPU. Four
replicas exist throughout, as plain, default, production (its spans exported over OTLP to this
benchmark's receiver, ``/metrics`` served and scraped every 15 s, the watchdog on) and a second
plain replica, ``plain_aa``, the self-check: its figure is the measurement's own bias and noise
and should be about 0. Each round runs one step of each (``--tiny-steps``), in one of the 24
orders, every order in turn, so that what a step leaves behind (caches, the hook's threads it
wakes) falls on each variant alike; the instrumented replicas stay instrumented, so their
workers' wakes land on every variant's steps alike too (their GIL hand-overs, about one per
worker wake every 100 ms, are not charged to the hook: the context switches per step are
printed per variant, and so is the CPU the replica's own threads used per step, the work moved
off the training thread). The four replicas take the four parts in turn, in four phases of
equal length, so that whatever sets one replica apart from another (where its tensors lie in
memory: 10-20 us per step between two plain replicas here) cancels. Printed per variant: the median
difference, the rounds' quartiles and a 95% confidence interval of the median (the order
statistics n/2 -+ 0.98 sqrt(n), which assume nothing of the distribution). 9,600 rounds
(``--tiny-rounds``) take two to five minutes here. Plain pays the timeline's idle wraps there
(an instrumented replica exists in the process): that, measured apart (below), is added to
``fsdp2_thread_us``.

The collective timeline's wraps of ``torch.distributed``'s functions are process-wide: while an
instrumented replica exists, every collective any replica issues through those functions goes
through the wrapper. The wrapper records into the timeline that is "current"; the hook makes
its timeline current when its step begins and leaves it current after the step ends (so that a
collective between steps, a metric all-reduce or a checkpoint barrier, is still recorded), so
here plain FSDP2 replicas of the large model would record their all-gathers and reduce-scatters
into the last instrumented replica's timeline: a cost charged to plain and collectives charged
to the wrong replica. Before each block of an uninstrumented variant the benchmark therefore
clears ``current``, the state of a process whose one model is instrumented, between its steps:
the plain variants then pay what the wrapper costs with nothing to record, one attribute read
and a Python call per collective. That is measured and printed (collectives per step through
the wrappers x nanoseconds per idle call): for FSDP2 a few microseconds in a step of hundreds
of milliseconds, far under the spread of the rounds, so it does not matter. DDP's gradient
all-reduce never reaches the wrappers (it runs in DDP's C++ reducer): plain DDP pays nothing.

The last lines: for ``--model ddp``, ``ddp_thread_us=<y> production_cpu_ratio=<p>`` and then
``overhead_ratio=<default/plain> bucket_mode_ratio=<per_bucket/plain>
hook_floor_ratio=<allreduce_hook/plain>`` (wall-time ratios); for ``--model fsdp2``,
``fsdp2_cpu_ratio=<x> fsdp2_thread_us=<y> fsdp2_wall_ratio=<z> production_cpu_ratio=<p>``:
attributed CPU default/plain, training-thread microseconds default minus plain on the tiny
model, wall default/plain, attributed CPU production/plain. Defaults keep a run under about 10
minutes here: 16 rounds for DDP, 12 for FSDP2 (its steps are slower), plus FSDP2's 9,600
training-thread rounds.
"""

from __future__ import annotations

import argparse
import gzip
import itertools
import json
import math
import os
import resource
import statistics
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult
from torch import nn
from torch._C._distributed_c10d import HashStore
from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.multiprocessing.spawn import start_processes
from torch.nn.parallel import DistributedDataParallel

# Registers torch's "fake" process-group backend (collectives that return at once, no peers);
# a testing module of torch's, the one place that registers it.
from torch.testing._internal.distributed import fake_pg  # noqa: F401

import trainguard
from trainguard import contract
from trainguard.exporters.serving import PROMETHEUS_SCRAPE_ACCEPT
from trainguard.instrumentation.timeline import INTERCEPTOR, Timeline, _signature

WIDTH = 2048
LAYERS = 6
BATCH = 32
TINY_WIDTH = 16
TINY_BATCH = 4
TINY_FSDP2_UNITS = 3
MODELS = ("ddp", "fsdp2")
VARIANTS: dict[str, tuple[str, ...]] = {
    "ddp": ("plain", "hook_floor", "default", "per_bucket", "all", "production"),
    "fsdp2": ("plain", "default", "per_bucket", "production"),
}
TINY_VARIANTS = ("plain", "default", "production")
# The FSDP2 training-thread measurement (one process, a fake process group, see the docstring):
# a second plain replica is the A/A self-check, whose figure should be about 0.
FAKE_VARIANTS = ("plain", "default", "production", "plain_aa")
UNINSTRUMENTED = frozenset({"plain", "hook_floor", "plain_aa"})
# Defaults per model kind: each full run stays under about 10 minutes on the 2-core machine
# (an FSDP2 step of the large model is slower than a DDP step, and a tiny FSDP2 step costs
# milliseconds of Python where a tiny DDP step costs a few hundred microseconds).
DEFAULT_ROUNDS = {"ddp": 16, "fsdp2": 12}
# DDP's tiny model runs in blocks of about a second (a tiny DDP step is ~3 ms of wall time
# here): short blocks, many rounds, so drift in the load cancels. FSDP2's runs one step per
# variant per round, the four variants in every order in turn; 9,600 rounds (24 orders x 400)
# took 2-5 minutes here, and the 95% interval of the median came to +-3 us at load average
# ~3 and +-13 us at 4-7.
DEFAULT_TINY_STEPS = {"ddp": 400, "fsdp2": 1}
DEFAULT_TINY_ROUNDS = {"ddp": 25, "fsdp2": 9600}
TINY_WARMUP_STEPS = 20
TINY_BLOCK_WARMUP_STEPS = 5  # after instrumenting, before the block's clocks start
SCRAPE_INTERVAL_SECONDS = 15.0
# glibc's malloc adapts its mmap and trim thresholds as a process runs; with several replicas
# in one process, the one built last (its gradients at the top of the heap, freed every step by
# zero_grad(set_to_none=True) and trimmed) then faults in ~64 MB of fresh pages every step:
# 16,000 minor faults and 40 ms more of training-thread CPU per DDP step, whichever variant it
# is. Fixed thresholds (the largest mmap threshold glibc allows, no trimming under 1 GiB) keep
# the build order out of the figures; each variant's page faults are printed.
MALLOC_TUNABLES = "glibc.malloc.mmap_threshold=33554432:glibc.malloc.trim_threshold=1073741824"
SCRAPE_CALIBRATION = 5


class DiscardingExporter(SpanExporter):
    """Receives every span (so they are built and batched) and keeps none."""

    def __init__(self) -> None:
        self.spans = 0

    def export(self, spans: Sequence[Any]) -> SpanExportResult:
        self.spans += len(spans)
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        return None


# -- the OTLP receiver (parent process) ---------------------------------------------------------
class OtlpReceiver:
    """A local OTLP/HTTP endpoint: reads each POST body fully and answers 200, empty body."""

    def __init__(self) -> None:
        self.requests = 0
        self.bytes = 0
        self._lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length)
                with receiver._lock:
                    receiver.requests += 1
                    receiver.bytes += len(body)
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, format: str, *args: Any) -> None:
                return None

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.port = int(self.server.server_address[1])
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> OtlpReceiver:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()


# -- the scraper (each rank process) ------------------------------------------------------------
class Scraper:
    """GETs ``/metrics`` of the production replica (``port``) every ``interval`` seconds."""

    def __init__(self, interval: float) -> None:
        self.interval = interval
        self.port: int | None = None
        self.scrapes = 0
        self.failures = 0
        self.bytes = 0
        self.seconds: list[float] = []
        self._stop = threading.Event()
        self.thread = threading.Thread(target=self._run, name="bench-scraper", daemon=True)

    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        self._stop.set()
        self.thread.join(timeout=5)

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            port = self.port
            if port is not None:
                self.scrape(port)

    def scrape(self, port: int) -> None:
        request = urllib.request.Request(
            f"http://127.0.0.1:{port}/metrics",
            headers={"Accept": PROMETHEUS_SCRAPE_ACCEPT, "Accept-Encoding": "gzip"},
        )
        start = time.perf_counter()
        try:
            with urllib.request.urlopen(request, timeout=10) as response:
                body = response.read()
                if response.headers.get("Content-Encoding") == "gzip":
                    body = gzip.decompress(body)
        except OSError:
            self.failures += 1
            return
        self.seconds.append(time.perf_counter() - start)
        self.bytes += len(body)
        self.scrapes += 1


# -- replicas -------------------------------------------------------------------------------------
@dataclass
class Replica:
    model: nn.Module
    optimizer: torch.optim.Optimizer
    handle: Any = None
    threads: set[int] = field(default_factory=set)  # idents of the threads it started


@dataclass
class Setup:
    kind: str
    mesh: DeviceMesh | None
    otlp_endpoint: str
    tmp: Path


def build_model(setup: Setup, tiny: bool) -> nn.Module:
    torch.manual_seed(0)
    if setup.kind == "ddp":
        layers = (
            [nn.Linear(TINY_WIDTH, TINY_WIDTH)]
            if tiny
            else [nn.Linear(WIDTH, WIDTH) for _ in range(LAYERS)]
        )
        return DistributedDataParallel(nn.Sequential(*layers))
    width, count = (TINY_WIDTH, TINY_FSDP2_UNITS) if tiny else (WIDTH, LAYERS)
    model = nn.Sequential(*[nn.Linear(width, width) for _ in range(count)])
    for layer in model:
        fully_shard(layer, mesh=setup.mesh)
    fully_shard(model, mesh=setup.mesh)
    return model


def python_threads() -> set[int]:
    return {t.ident for t in threading.enumerate() if t.ident is not None}


def make_replica(setup: Setup, variant: str, tiny: bool) -> Replica:
    model = build_model(setup, tiny)
    replica = Replica(model, torch.optim.SGD(model.parameters(), lr=1e-4))
    attach(setup, replica, variant, tiny)
    return replica


def attach(setup: Setup, replica: Replica, variant: str, tiny: bool) -> None:
    """Make ``replica`` the variant: a comm hook, or ``trainguard.instrument`` (the handle and
    the threads it started go into the replica)."""
    model, optimizer = replica.model, replica.optimizer
    job = f"bench-{setup.kind}{'-tiny' if tiny else ''}-{variant}"
    before = python_threads()
    if variant == "hook_floor":
        assert isinstance(model, DistributedDataParallel)
        model.register_comm_hook(dist.group.WORLD, allreduce_hook)
    elif variant == "default":
        replica.handle = trainguard.instrument(model, optimizer, job_id=job, metrics_port=-1)
    elif variant == "per_bucket":
        replica.handle = trainguard.instrument(
            model, optimizer, job_id=job, metrics_port=-1, per_bucket=True
        )
    elif variant == "all":
        replica.handle = trainguard.instrument(
            model,
            optimizer,
            job_id=job,
            metrics_port=0,
            metrics_addr="127.0.0.1",
            per_bucket=True,
            span_exporter=DiscardingExporter(),
            dump_dir=setup.tmp / job,
        )
    elif variant == "production":
        replica.handle = trainguard.instrument(
            model,
            optimizer,
            job_id=job,
            metrics_port=0,
            metrics_addr="127.0.0.1",
            span_exporter=OTLPSpanExporter(endpoint=setup.otlp_endpoint),
            dump_dir=setup.tmp / job,
        )
    # What instrument started: worker, watchdog, span processor, /metrics server (not a
    # request thread of another replica's server that happened to be alive).
    replica.threads = {
        t.ident
        for t in threading.enumerate()
        if t.ident is not None and t.ident not in before and "process_request" not in t.name
    }


def step(model: nn.Module, optimizer: torch.optim.Optimizer, x: torch.Tensor) -> float:
    start = time.perf_counter()
    optimizer.zero_grad(set_to_none=True)
    model(x).square().mean().backward()
    optimizer.step()
    return time.perf_counter() - start


def enter_block(variant: str) -> None:
    """An uninstrumented variant runs with no timeline current (see the module docstring)."""
    if variant in UNINSTRUMENTED:
        INTERCEPTOR.current = None


def rotated(variants: Sequence[str], index: int) -> list[str]:
    shift = index % len(variants)
    return [*variants[shift:], *variants[:shift]]


# -- CPU clocks -----------------------------------------------------------------------------------
def thread_clocks() -> dict[int, int]:
    """CPU time (ns) of every Python thread but the main (training) one."""
    main = threading.main_thread()
    clocks: dict[int, int] = {}
    for thread in threading.enumerate():
        if thread is main or thread.ident is None:
            continue
        try:
            clocks[thread.ident] = time.clock_gettime_ns(time.pthread_getcpuclockid(thread.ident))
        except (OSError, OverflowError):  # it ended meanwhile
            continue
    return clocks


@dataclass
class Clocks:
    process: int
    main: int
    threads: dict[int, int]

    @staticmethod
    def now() -> Clocks:
        return Clocks(time.process_time_ns(), time.thread_time_ns(), thread_clocks())

    def since(self, earlier: Clocks) -> tuple[int, int, dict[int, int]]:
        """(process, training thread, each Python thread present both times) CPU ns between."""
        threads = {
            ident: max(0, ns - earlier.threads[ident])
            for ident, ns in self.threads.items()
            if ident in earlier.threads
        }
        return self.process - earlier.process, self.main - earlier.main, threads


# -- the tiny model: training-thread time ---------------------------------------------------------
def tiny_phase(
    setup: Setup, scraper: Scraper, rounds: int, steps: int, rank: int
) -> dict[str, Any]:
    """Training-thread time per step on the tiny model. Only the variant whose block runs is
    instrumented (before its block, removed after it): an idle instrumented replica's worker
    keeps waking every few milliseconds after steps this short, and would tax every other
    block, plain's most. Plain runs with no instrumentation in the process at all."""
    replicas = {variant: make_replica(setup, "plain", tiny=True) for variant in TINY_VARIANTS}
    x = torch.randn(TINY_BATCH, TINY_WIDTH, generator=torch.Generator().manual_seed(rank))
    for replica in replicas.values():
        for _ in range(TINY_WARMUP_STEPS):
            step(replica.model, replica.optimizer, x)
    probe = replicas["default"]
    attach(setup, probe, "default", tiny=True)
    collectives = count_collectives(replicas["plain"], probe.handle, x)
    probe.handle.uninstrument()
    probe.handle = None
    thread_us: dict[str, list[float]] = {variant: [] for variant in TINY_VARIANTS}
    wall_us: dict[str, list[float]] = {variant: [] for variant in TINY_VARIANTS}
    switches: dict[str, list[float]] = {variant: [] for variant in TINY_VARIANTS}
    sources: dict[str, str] = {}
    dropped = 0.0
    for round_index in range(rounds):
        for variant in rotated(TINY_VARIANTS, round_index):
            replica = replicas[variant]
            model, optimizer = replica.model, replica.optimizer
            attach(setup, replica, variant, tiny=True)
            handle = replica.handle
            if variant == "production":
                scraper.port = handle.metrics_port
            for _ in range(TINY_BLOCK_WARMUP_STEPS):
                step(model, optimizer, x)
            switched = context_switches()
            wall = time.perf_counter_ns()
            cpu = time.thread_time_ns()
            for _ in range(steps):
                optimizer.zero_grad(set_to_none=True)
                model(x).square().mean().backward()
                optimizer.step()
            thread_us[variant].append((time.thread_time_ns() - cpu) / steps / 1000)
            wall_us[variant].append((time.perf_counter_ns() - wall) / steps / 1000)
            switches[variant].append((context_switches() - switched) / steps)
            if handle is not None:
                scraper.port = None
                handle.force_flush_spans()
                sources[variant] = str(handle.timing_source.value)
                dropped += (
                    handle.registry.get_sample_value(
                        contract.SPANS_DROPPED.name, handle.identity.labels()
                    )
                    or 0.0
                )
                handle.uninstrument()
                replica.handle = None
        if rank == 0:
            print(f"tiny round {round_index + 1}/{rounds} done", file=sys.stderr, flush=True)
    return {
        "timing_sources": sources,
        "thread_us": thread_us,
        "wall_us": wall_us,
        "switches": switches,
        "steps": steps,
        "collectives": collectives,
        "spans_dropped": dropped,
    }


def timing_sources(replicas: dict[str, Replica]) -> dict[str, str]:
    """Where each instrumented replica's compute time comes from by now (DDP's reducer timers,
    the collective timeline, or wall clock once the timers were given up on)."""
    return {
        variant: str(replica.handle.timing_source.value)
        for variant, replica in replicas.items()
        if replica.handle is not None
    }


def context_switches() -> int:
    """The calling thread's context switches so far, voluntary and not (Linux)."""
    try:
        status = Path("/proc/thread-self/status").read_text()
    except OSError:
        return 0
    return sum(int(line.split()[1]) for line in status.splitlines() if "ctxt_switches:" in line)


def count_collectives(plain: Replica, instrumented: Any, x: torch.Tensor) -> int:
    """Collectives one plain step issues through the wrapped torch.distributed functions."""
    probe = Timeline(instrumented.errors)
    INTERCEPTOR.current = probe
    step(plain.model, plain.optimizer, x)
    INTERCEPTOR.current = None
    return len(probe.entries) + probe.overflow


def idle_wrapper_ns(calls: int = 200_000) -> float:
    """What a wrapped torch.distributed function costs with no timeline current, per call."""
    signature = _signature("all_reduce", "all_reduce", "tensor")
    assert signature is not None

    def original(*args: Any, **kwargs: Any) -> None:
        return None

    wrapped = INTERCEPTOR._wrapper("all_reduce", signature, original)
    saved, INTERCEPTOR.current = INTERCEPTOR.current, None
    tensor = torch.zeros(1)
    best = []
    try:
        for function in (original, wrapped):
            samples = []
            for _ in range(5):
                start = time.thread_time_ns()
                for _ in range(calls):
                    function(tensor, group=None)
                samples.append((time.thread_time_ns() - start) / calls)
            best.append(min(samples))
    finally:
        INTERCEPTOR.current = saved
    return best[1] - best[0]


# -- the tiny FSDP2 model on a fake process group: training-thread time -------------------------
def fake_main(_index: int, settings: dict[str, Any], out_dir: str) -> None:
    """The FSDP2 training-thread measurement, in a process of its own (see the docstring)."""
    for name in ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"):
        os.environ.pop(name, None)
    torch.set_num_threads(1)
    # A real store (the job id agreement, the watchdog's stall flags); fake collectives.
    dist.init_process_group("fake", store=HashStore(), rank=0, world_size=2)
    mesh = init_device_mesh("cpu", (2,))
    scraper = Scraper(settings["scrape_interval"])
    scraper.start()
    with tempfile.TemporaryDirectory() as tmp:
        setup = Setup("fsdp2", mesh, settings["otlp_endpoint"], Path(tmp))
        result = fake_phase(setup, scraper, settings["tiny_rounds"], settings["tiny_steps"])
    scraper.stop()
    result["idle_wrapper_ns"] = idle_wrapper_ns()
    result["scrapes"] = scraper.scrapes
    (Path(out_dir) / "fake.json").write_text(json.dumps(result))
    dist.destroy_process_group()


def fake_phase(setup: Setup, scraper: Scraper, rounds: int, steps: int) -> dict[str, Any]:
    """Training-thread CPU per step of each variant, round by round. Four replicas of the tiny
    model take the four variants' parts in turn, in four phases (each replica plays each
    variant once, so what sets one replica apart from another, where its tensors lie, cancels);
    within a phase the instrumented ones stay instrumented, and each round runs ``steps`` steps
    of every variant, the variants in one of their orders, every order in turn (so that what one
    variant leaves behind, in the caches or in the threads it wakes, falls on each other alike).
    """
    replicas = [make_replica(setup, "plain", tiny=True) for _ in FAKE_VARIANTS]
    x = torch.randn(TINY_BATCH, TINY_WIDTH, generator=torch.Generator().manual_seed(0))
    for replica in replicas:
        for _ in range(TINY_WARMUP_STEPS):
            step(replica.model, replica.optimizer, x)
    thread_ns: dict[str, list[int]] = {variant: [] for variant in FAKE_VARIANTS}
    wall_ns: dict[str, list[int]] = {variant: [] for variant in FAKE_VARIANTS}
    voluntary = dict.fromkeys(FAKE_VARIANTS, 0)
    involuntary = dict.fromkeys(FAKE_VARIANTS, 0)
    # What the instrumented replicas' own threads (worker, watchdog, span export, /metrics
    # server) used: work moved off the training thread.
    off_thread = dict.fromkeys(FAKE_VARIANTS, 0)
    sources: dict[str, str] = {}
    dropped = 0.0
    collectives = 0
    orders = list(itertools.permutations(FAKE_VARIANTS))
    clock, wall_clock = time.thread_time_ns, time.perf_counter_ns
    phases = len(FAKE_VARIANTS)
    started = time.perf_counter()
    done = 0
    for phase in range(phases):
        parts = {
            variant: replicas[(index + phase) % phases]
            for index, variant in enumerate(FAKE_VARIANTS)
        }
        for variant in ("default", "production"):
            attach(setup, parts[variant], variant, tiny=True)
        if phase == 0:
            collectives = count_collectives(parts["plain"], parts["default"].handle, x)
        scraper.port = parts["production"].handle.metrics_port
        for variant in ("default", "production"):
            for _ in range(TINY_BLOCK_WARMUP_STEPS):
                step(parts[variant].model, parts[variant].optimizer, x)
        owned = {ident: v for v, replica in parts.items() for ident in replica.threads}
        threads_before = thread_clocks()
        phase_rounds = rounds // phases + (1 if phase < rounds % phases else 0)
        for round_index in range(phase_rounds):
            for variant in orders[round_index % len(orders)]:
                model, optimizer = parts[variant].model, parts[variant].optimizer
                enter_block(variant)
                usage = resource.getrusage(resource.RUSAGE_THREAD)
                wall = wall_clock()
                cpu = clock()
                for _ in range(steps):
                    optimizer.zero_grad(set_to_none=True)
                    model(x).square().mean().backward()
                    optimizer.step()
                thread_ns[variant].append((clock() - cpu) // steps)
                wall_ns[variant].append((wall_clock() - wall) // steps)
                after = resource.getrusage(resource.RUSAGE_THREAD)
                voluntary[variant] += after.ru_nvcsw - usage.ru_nvcsw
                involuntary[variant] += after.ru_nivcsw - usage.ru_nivcsw
            done += 1
            if done % 1200 == 0:
                print(f"fsdp2 round {done}/{rounds} done", file=sys.stderr, flush=True)
        for ident, ns in thread_clocks().items():
            owner = owned.get(ident)
            if owner is not None and ident in threads_before:
                off_thread[owner] += ns - threads_before[ident]
        scraper.port = None
        for variant in ("default", "production"):
            handle = parts[variant].handle
            handle.force_flush_spans()
            sources[variant] = str(handle.timing_source.value)
            dropped += (
                handle.registry.get_sample_value(
                    contract.SPANS_DROPPED.name, handle.identity.labels()
                )
                or 0.0
            )
            handle.uninstrument()
            parts[variant].handle = None
            parts[variant].threads = set()  # ended; their idents may be reused
    total = rounds * steps
    return {
        "thread_ns": thread_ns,
        "wall_ns": wall_ns,
        "voluntary": {v: n / total for v, n in voluntary.items()},
        "involuntary": {v: n / total for v, n in involuntary.items()},
        "off_thread_us": {v: ns / total / 1e3 for v, ns in off_thread.items()},
        "seconds": time.perf_counter() - started,
        "steps": steps,
        "collectives": collectives,
        "timing_sources": sources,
        "spans_dropped": dropped,
    }


# -- the large model: step time and CPU -----------------------------------------------------------
def large_phase(
    setup: Setup, scraper: Scraper, rounds: int, steps: int, rank: int
) -> dict[str, Any]:
    variants = VARIANTS[setup.kind]
    replicas = {variant: make_replica(setup, variant, tiny=False) for variant in variants}
    replicas["production"].threads.add(scraper.thread.ident or 0)
    scraper.port = replicas["production"].handle.metrics_port
    x = torch.randn(BATCH, WIDTH, generator=torch.Generator().manual_seed(rank))
    for variant in variants:  # warm-up: bucket rebuild, lazy init, allocator, first iterations
        enter_block(variant)
        replica = replicas[variant]
        for _ in range(2):
            step(replica.model, replica.optimizer, x)
    collectives = count_collectives(replicas["plain"], replicas["default"].handle, x)
    owned = {ident: v for v, replica in replicas.items() for ident in replica.threads}
    times: dict[str, list[list[float]]] = {variant: [] for variant in variants}
    # Per block, seconds of CPU per step: the whole process; the process less every Python
    # thread but the training thread; the variant's own threads. Scrapes during the block.
    process_cpu: dict[str, list[float]] = {variant: [] for variant in variants}
    foreground: dict[str, list[float]] = {variant: [] for variant in variants}
    own: dict[str, list[float]] = {variant: [] for variant in variants}
    scrapes: dict[str, list[int]] = {variant: [] for variant in variants}
    # The training thread's minor page faults per step (see MALLOC_TUNABLES).
    faults: dict[str, list[float]] = {variant: [] for variant in variants}
    # What each replica's threads use while other variants' blocks run (ns, and seconds).
    idle_ns = dict.fromkeys(variants, 0)
    idle_s = dict.fromkeys(variants, 0.0)
    unowned_ns = 0
    for round_index in range(rounds):
        for variant in rotated(variants, round_index):
            replica = replicas[variant]
            enter_block(variant)
            scrapes_before = scraper.scrapes
            faults_before = resource.getrusage(resource.RUSAGE_THREAD).ru_minflt
            wall = time.perf_counter()
            before = Clocks.now()
            walls = [step(replica.model, replica.optimizer, x) for _ in range(steps)]
            process, _, threads = Clocks.now().since(before)
            wall = time.perf_counter() - wall
            faults_after = resource.getrusage(resource.RUSAGE_THREAD).ru_minflt
            faults[variant].append((faults_after - faults_before) / steps)
            times[variant].append(walls)
            scrapes[variant].append(scraper.scrapes - scrapes_before)
            process_cpu[variant].append(process / steps / 1e9)
            foreground[variant].append((process - sum(threads.values())) / steps / 1e9)
            mine = 0
            for ident, ns in threads.items():
                owner = owned.get(ident)
                if owner == variant:
                    mine += ns
                elif owner is None:
                    unowned_ns += ns
                else:
                    idle_ns[owner] += ns
            own[variant].append(mine / steps / 1e9)
            for other in variants:
                if other != variant:
                    idle_s[other] += wall
        if rank == 0:
            print(f"round {round_index + 1}/{rounds} done", file=sys.stderr, flush=True)
    production = replicas["production"].handle
    scraper.port = None
    server_ns = scrape_server_ns(scraper, production.metrics_port)
    production.force_flush_spans()
    dropped = production.registry.get_sample_value(
        contract.SPANS_DROPPED.name, production.identity.labels()
    )
    buckets = 0
    plain_model = replicas["plain"].model
    if isinstance(plain_model, DistributedDataParallel):
        sizes = plain_model._get_ddp_logging_data()["rebuilt_bucket_sizes"]
        buckets = len(str(sizes).split(","))
    sources = timing_sources(replicas)
    for replica in replicas.values():
        if replica.handle is not None:
            replica.handle.uninstrument()
    return {
        "timing_sources": sources,
        "times": times,
        "process_cpu": process_cpu,
        "foreground": foreground,
        "own": own,
        "scrapes": scrapes,
        "faults": faults,
        "idle_ms_per_s": {v: idle_ns[v] / 1e6 / max(idle_s[v], 1e-9) for v in variants},
        "scrape_server_ns": server_ns,
        "unowned_ms": unowned_ns / 1e6,
        "collectives": collectives,
        "buckets": buckets,
        "spans_dropped": dropped or 0.0,
    }


def scrape_server_ns(scraper: Scraper, port: int) -> float:
    """CPU per scrape of the /metrics server's request thread (it ends with the request, so
    per-thread clocks miss it): scrapes from this idle thread, less what every live thread
    used."""
    before = Clocks.now()
    for _ in range(SCRAPE_CALIBRATION):
        scraper.scrape(port)
    process, main, threads = Clocks.now().since(before)
    return max(0.0, (process - main - sum(threads.values())) / SCRAPE_CALIBRATION)


def rank_main(rank: int, world: int, port: int, settings: dict[str, Any], out_dir: str) -> None:
    os.environ.update({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "RANK": str(rank)})
    # Tracing only where the benchmark asks for it.
    for name in ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"):
        os.environ.pop(name, None)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    kind = settings["model"]
    mesh = init_device_mesh("cpu", (world,)) if kind == "fsdp2" else None
    scraper = Scraper(settings["scrape_interval"])
    scraper.start()
    with tempfile.TemporaryDirectory() as tmp:
        setup = Setup(kind, mesh, settings["otlp_endpoint"], Path(tmp))
        tiny = (
            tiny_phase(setup, scraper, settings["tiny_rounds"], settings["tiny_steps"], rank)
            if kind == "ddp"
            else None
        )
        large = large_phase(setup, scraper, settings["rounds"], settings["steps"], rank)
    scraper.stop()
    result = {
        "tiny": tiny,
        "large": large,
        "idle_wrapper_ns": idle_wrapper_ns(),
        "scrapes": scraper.scrapes,
        "scrape_failures": scraper.failures,
        "scrape_ms": 1e3 * statistics.median(scraper.seconds) if scraper.seconds else 0.0,
        "scrape_bytes": scraper.bytes / max(1, scraper.scrapes),
    }
    (Path(out_dir) / f"rank{rank}.json").write_text(json.dumps(result))
    dist.destroy_process_group()


# -- the parent: run, then report ------------------------------------------------------------------
def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def quartiles(values: Sequence[float]) -> tuple[float, float]:
    if len(values) < 2:
        return values[0], values[0]
    q = statistics.quantiles(values, n=4)
    return q[0], q[2]


def per_round_ratios(values: dict[str, list[float]], variant: str) -> list[float]:
    return [a / b for a, b in zip(values[variant], values["plain"], strict=True)]


def summed(per_rank: Sequence[Sequence[float]]) -> list[float]:
    """Element-wise sum over ranks."""
    return [sum(values) for values in zip(*per_rank, strict=True)]


def attributed_cpu(large: dict[str, Any], variant: str, steps: int) -> list[float]:
    """One rank's attributed CPU seconds per step, round by round (see the docstring).

    A scrape's server side runs on a thread that ends with the request, so it stays in the
    foreground of whichever block it fell in: taken out of other variants' blocks, it is left
    in production's.
    """
    server_s = large["scrape_server_ns"] / 1e9
    return [
        fg + mine - (0.0 if variant == "production" else scraped * server_s / steps)
        for fg, mine, scraped in zip(
            large["foreground"][variant],
            large["own"][variant],
            large["scrapes"][variant],
            strict=True,
        )
    ]


def describe_sources(per_rank: Iterable[dict[str, str]]) -> str:
    ranks = list(per_rank)
    return ", ".join(
        f"{variant} {' / '.join(sources[variant] for sources in ranks)}" for variant in ranks[0]
    )


def report_tiny(kind: str, tinies: Sequence[dict[str, Any]]) -> float:
    """Print the tiny model's training-thread figures (each round's figure is the mean of the
    ranks'); return the median over rounds of default minus plain (µs per step)."""
    ranks = len(tinies)
    thread = {
        v: [x / ranks for x in summed([t["thread_us"][v] for t in tinies])] for v in TINY_VARIANTS
    }
    wall = {
        v: [x / ranks for x in summed([t["wall_us"][v] for t in tinies])] for v in TINY_VARIANTS
    }
    switches = {
        v: [x / ranks for x in summed([t["switches"][v] for t in tinies])] for v in TINY_VARIANTS
    }
    rounds = len(thread["plain"])
    print(
        f"training thread, tiny {kind} model ({rounds} rounds x {tinies[0]['steps']} steps, "
        f"thread CPU time, mean of the ranks): plain "
        f"{statistics.median(thread['plain']):.1f} us/step (wall "
        f"{statistics.median(wall['plain']):.1f} us, "
        f"{statistics.median(switches['plain']):.2f} context switches), "
        f"{tinies[0]['collectives']} collectives per step through torch.distributed"
    )
    added: dict[str, float] = {}
    for variant in TINY_VARIANTS[1:]:
        diffs = [a - b for a, b in zip(thread[variant], thread["plain"], strict=True)]
        added[variant] = statistics.median(diffs)
        low, high = quartiles(diffs)
        wall_diff = statistics.median(
            a - b for a, b in zip(wall[variant], wall["plain"], strict=True)
        )
        print(
            f"  {variant:>10}: {added[variant]:+.1f} us/step on the training thread "
            f"(rounds' quartiles {low:+.1f}..{high:+.1f}); wall {wall_diff:+.1f} us/step; "
            f"{statistics.median(switches[variant]):.2f} context switches per step"
        )
    dropped = sum(t["spans_dropped"] for t in tinies)
    print(
        f"  production spans dropped (tiny model, both ranks): {dropped:.0f}; timing source "
        f"at the end (rank 0 / rank 1): {describe_sources(t['timing_sources'] for t in tinies)}"
    )
    return added["default"]


def median_interval(values: Sequence[float], z: float = 1.96) -> tuple[float, float]:
    """A 95% confidence interval of the median, free of any assumption on the distribution:
    the order statistics n/2 -+ z*sqrt(n)/2 (the binomial's normal approximation)."""
    ordered = sorted(values)
    n = len(ordered)
    half = z * math.sqrt(n) / 2
    low = max(0, math.floor(n / 2 - half))
    high = min(n - 1, math.ceil(n / 2 + half))
    return ordered[low], ordered[high]


def report_fake(fake: dict[str, Any]) -> float:
    """Print the FSDP2 training-thread figures (one process, fake process group); return
    default's: the median over rounds of default minus plain, plus what plain paid for the
    timeline's idle wraps (µs per step)."""
    thread = {v: [ns / 1e3 for ns in fake["thread_ns"][v]] for v in FAKE_VARIANTS}
    wall = {v: [ns / 1e3 for ns in fake["wall_ns"][v]] for v in FAKE_VARIANTS}
    rounds = len(thread["plain"])
    idle_us = fake["collectives"] * fake["idle_wrapper_ns"] / 1e3
    print(
        f"training thread, tiny fsdp2 model ({rounds} rounds x {fake['steps']} steps, thread "
        f"CPU time, one process on a fake process group of 2, {fake['seconds']:.0f} s): plain "
        f"{statistics.median(thread['plain']):.1f} us/step (wall "
        f"{statistics.median(wall['plain']):.1f} us, "
        f"{fake['voluntary']['plain'] + fake['involuntary']['plain']:.2f} context switches), "
        f"{fake['collectives']} collectives per step through torch.distributed"
    )
    added: dict[str, float] = {}
    for variant in FAKE_VARIANTS[1:]:
        diffs = [a - b for a, b in zip(thread[variant], thread["plain"], strict=True)]
        added[variant] = statistics.median(diffs)
        low, high = quartiles(diffs)
        ci_low, ci_high = median_interval(diffs)
        wall_diff = statistics.median(
            a - b for a, b in zip(wall[variant], wall["plain"], strict=True)
        )
        switches = fake["voluntary"][variant] + fake["involuntary"][variant]
        print(
            f"  {variant:>10}: {added[variant]:+.1f} us/step on the training thread "
            f"(rounds' quartiles {low:+.1f}..{high:+.1f}; 95% interval of the median "
            f"{ci_low:+.1f}..{ci_high:+.1f}); wall {wall_diff:+.1f} us/step; "
            f"{switches:.2f} context switches per step; its own threads "
            f"{fake['off_thread_us'][variant]:.1f} us per step"
        )
    print(
        f"  self-check: plain_aa is a second plain replica, so its figure is this measurement's "
        f"bias and noise ({added['plain_aa']:+.1f}); plain paid {idle_us:.2f} us per step for "
        f"the timeline's idle wraps (an instrumented replica exists), added to default's "
        f"figure: {added['default']:+.1f} + {idle_us:.2f}"
    )
    print(
        f"  production spans dropped: {fake['spans_dropped']:.0f}; timing source at the end: "
        + ", ".join(f"{v} {source}" for v, source in fake["timing_sources"].items())
    )
    return float(added["default"] + idle_us)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", choices=MODELS, default="ddp", help="DDP or FSDP2")
    parser.add_argument("--rounds", type=int, help="interleaved rounds (ddp 16, fsdp2 12)")
    parser.add_argument("--steps", type=int, default=4, help="steps per variant per round")
    parser.add_argument("--tiny-rounds", type=int, help="tiny model's rounds (ddp 25, fsdp2 9600)")
    parser.add_argument(
        "--tiny-steps", type=int, help="tiny model's steps per block (ddp 400, fsdp2 1)"
    )
    parser.add_argument(
        "--scrape-interval", type=float, default=SCRAPE_INTERVAL_SECONDS, help="seconds"
    )
    args = parser.parse_args(argv)
    kind: str = args.model
    variants = VARIANTS[kind]
    tunables = os.environ.get("GLIBC_TUNABLES", "")
    if "glibc.malloc." not in tunables:  # the ranks inherit it (spawn starts new interpreters)
        os.environ["GLIBC_TUNABLES"] = (
            f"{tunables}:{MALLOC_TUNABLES}" if tunables else MALLOC_TUNABLES
        )
    with tempfile.TemporaryDirectory() as tmp, OtlpReceiver() as receiver:
        settings = {
            "model": kind,
            "rounds": args.rounds or DEFAULT_ROUNDS[kind],
            "steps": args.steps,
            "tiny_rounds": args.tiny_rounds or DEFAULT_TINY_ROUNDS[kind],
            "tiny_steps": args.tiny_steps or DEFAULT_TINY_STEPS[kind],
            "scrape_interval": args.scrape_interval,
            "otlp_endpoint": f"http://127.0.0.1:{receiver.port}/v1/traces",
        }
        if kind == "fsdp2":
            fake_entry: Callable[..., None] = fake_main
            start_processes(
                fake_entry, args=(settings, tmp), nprocs=1, join=True, start_method="spawn"
            )
            fake = json.loads((Path(tmp) / "fake.json").read_text())
        entry: Callable[..., None] = rank_main
        start_processes(
            entry,
            args=(2, free_port(), settings, tmp),
            nprocs=2,
            join=True,
            start_method="spawn",
        )
        results = [json.loads((Path(tmp) / f"rank{r}.json").read_text()) for r in range(2)]
    ranks = len(results)
    larges = [result["large"] for result in results]
    large = larges[0]
    rounds, steps = settings["rounds"], settings["steps"]
    # Wall time: rank 0's steps (the ranks wait for each other at every collective).
    times: dict[str, list[list[float]]] = large["times"]
    block_medians = {v: [statistics.median(block) for block in times[v]] for v in variants}
    wall_ratios = {v: per_round_ratios(block_medians, v) for v in variants}
    wall_ratio = {v: statistics.median(r) for v, r in wall_ratios.items()}
    medians = {v: statistics.median(s for block in times[v] for s in block) for v in variants}
    # CPU time: both ranks' together, round by round (printed per rank: the mean).
    process_rounds = {v: summed([lg["process_cpu"][v] for lg in larges]) for v in variants}
    process = {v: statistics.median(process_rounds[v]) / ranks for v in variants}
    process_ratio = {v: statistics.median(per_round_ratios(process_rounds, v)) for v in variants}
    attributed = {v: summed([attributed_cpu(lg, v, steps) for lg in larges]) for v in variants}
    cpu_ratios = {v: per_round_ratios(attributed, v) for v in variants}
    cpu_ratio = {v: statistics.median(r) for v, r in cpu_ratios.items()}
    own = {v: statistics.median(summed([lg["own"][v] for lg in larges])) / ranks for v in variants}
    idle = {v: sum(lg["idle_ms_per_s"][v] for lg in larges) / ranks for v in variants}
    faults = {
        v: statistics.median(summed([lg["faults"][v] for lg in larges])) / ranks for v in variants
    }
    if kind == "ddp":
        print(
            f"model: DDP, {LAYERS}x Linear({WIDTH},{WIDTH}), batch {BATCH}, "
            f"{large['buckets']} buckets"
        )
    else:
        print(
            f"model: FSDP2, {LAYERS}x Linear({WIDTH},{WIDTH}), batch {BATCH}, fully_shard "
            f"on each layer and the root"
        )
    print(f"{rounds} rounds x {steps} steps per variant, interleaved; CPU ms per step and rank")
    print(
        f"{'':>10}  {'step ms':>8}  {'wall ratio (quartiles)':>23}  {'CPU process':>11} "
        f"{'(ratio)':>8}  {'CPU attributed':>14} {'ratio (quartiles)':>23}  "
        f"{'own threads':>11}  {'idle ms/s':>9}  {'faults':>6}"
    )
    for v in variants:
        w_low, w_high = quartiles(wall_ratios[v])
        c_low, c_high = quartiles(cpu_ratios[v])
        print(
            f"{v:>10}  {medians[v] * 1e3:8.2f}  "
            f"{wall_ratio[v]:7.4f} ({w_low:.3f}..{w_high:.3f})  "
            f"{process[v] * 1e3:11.1f} ({process_ratio[v]:.4f})  "
            f"{statistics.median(attributed[v]) / ranks * 1e3:14.1f} "
            f"{cpu_ratio[v]:7.4f} ({c_low:.3f}..{c_high:.3f})  "
            f"{own[v] * 1e3:11.2f}  {idle[v]:9.2f}  {faults[v]:6.0f}"
        )
    print(
        "  process: every thread of the rank during the block (what other variants' idle "
        "threads do lands here too); attributed: the process less every Python thread but "
        "the training thread, plus the variant's own threads during its block ('own "
        "threads': worker, watchdog, span export, /metrics server, production's scraper); "
        "'idle ms/s': what its threads use per second of other variants' blocks, charged to "
        "no variant; 'faults': the training thread's minor page faults per step "
        f"(GLIBC_TUNABLES={os.environ['GLIBC_TUNABLES']})"
    )
    scrapes = sum(result["scrapes"] for result in results)
    failures = sum(result["scrape_failures"] for result in results)
    server_ms = [lg["scrape_server_ns"] / 1e6 for lg in larges]
    print(
        f"/metrics scrapes of the production replicas: {scrapes} ({failures} failed), median "
        f"{results[0]['scrape_ms']:.1f} ms and {results[0]['scrape_bytes'] / 1024:.1f} KiB "
        f"each on rank 0; server CPU per scrape "
        f"{' / '.join(f'{ms:.2f}' for ms in server_ms)} ms (ranks); CPU of threads owned by "
        f"no replica during blocks: {sum(lg['unowned_ms'] for lg in larges):.1f} ms in all"
    )
    print(
        f"OTLP receiver (parent process, both ranks): {receiver.requests} requests, "
        f"{receiver.bytes / 1024:.1f} KiB; production spans dropped (large model, both "
        f"ranks): {sum(lg['spans_dropped'] for lg in larges):.0f}"
    )
    print(
        "timing source at the end (rank 0 / rank 1): "
        + describe_sources(lg["timing_sources"] for lg in larges)
    )
    wrap_ns = results[0]["idle_wrapper_ns"]
    print(
        f"timeline wraps, idle: {large['collectives']} collectives per step x "
        f"{wrap_ns:.0f} ns per call = {large['collectives'] * wrap_ns / 1e3:.2f} us per "
        f"step that the plain variants pay while an instrumented replica exists"
    )
    thread_us = (
        report_tiny(kind, [result["tiny"] for result in results])
        if kind == "ddp"
        else report_fake(fake)
    )
    if kind == "ddp":
        per_bucket_us = (
            (wall_ratio["per_bucket"] - wall_ratio["hook_floor"])
            * medians["plain"]
            * 1e6
            / max(1, large["buckets"])
        )
        print(f"per-bucket mode over the hook floor: {per_bucket_us:.1f} us per bucket (medians)")
        print(f"ddp_thread_us={thread_us:.2f} production_cpu_ratio={cpu_ratio['production']:.4f}")
        print(
            f"overhead_ratio={wall_ratio['default']:.4f} "
            f"bucket_mode_ratio={wall_ratio['per_bucket']:.4f} "
            f"hook_floor_ratio={wall_ratio['hook_floor']:.4f}"
        )
    else:
        print(
            f"fsdp2_cpu_ratio={cpu_ratio['default']:.4f} fsdp2_thread_us={thread_us:.2f} "
            f"fsdp2_wall_ratio={wall_ratio['default']:.4f} "
            f"production_cpu_ratio={cpu_ratio['production']:.4f}"
        )


if __name__ == "__main__":
    main()
