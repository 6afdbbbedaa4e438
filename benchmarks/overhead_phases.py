"""How the overhead benchmark measures: the phases that run the variants interleaved, round by
round, and read each one's clocks (tiny models in one process, the FSDP2 training thread on a
fake process group, the large models as two real gloo ranks with a scraper beside them)."""

from __future__ import annotations

import itertools
import json
import os
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import HashStore
from torch.distributed.device_mesh import init_device_mesh
from torch.nn.parallel import DistributedDataParallel

# Registers torch's "fake" process-group backend (collectives that return at once, no peers);
# a testing module of torch's, the one place that registers it.
from torch.testing._internal.distributed import fake_pg  # noqa: F401

from benchmarks.harness.sinks import Scraper
from benchmarks.harness.threads import Clocks, context_switches, thread_clocks
from benchmarks.overhead_scenarios import (
    BATCH,
    FAKE_VARIANTS,
    TINY_BATCH,
    TINY_VARIANTS,
    TINY_WIDTH,
    VARIANTS,
    WIDTH,
    Setup,
    attach,
    count_collectives,
    enter_block,
    idle_wrapper_ns,
    make_replica,
    rotated,
    step,
    timing_sources,
)
from trainguard import contract


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


TINY_WARMUP_STEPS = 20


TINY_BLOCK_WARMUP_STEPS = 5  # after instrumenting, before the block's clocks start


SCRAPE_CALIBRATION = 5
