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
import json
import os
import statistics
import tempfile
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

from torch.multiprocessing.spawn import start_processes

from benchmarks.harness.processes import free_port
from benchmarks.harness.sinks import OtlpReceiver
from benchmarks.harness.stats import median_interval, per_round_ratios, quartiles, summed
from benchmarks.overhead_phases import fake_main, rank_main
from benchmarks.overhead_scenarios import (
    BATCH,
    FAKE_VARIANTS,
    LAYERS,
    MODELS,
    TINY_VARIANTS,
    VARIANTS,
    WIDTH,
)

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
SCRAPE_INTERVAL_SECONDS = 15.0
# glibc's malloc adapts its mmap and trim thresholds as a process runs; with several replicas
# in one process, the one built last (its gradients at the top of the heap, freed every step by
# zero_grad(set_to_none=True) and trimmed) then faults in ~64 MB of fresh pages every step:
# 16,000 minor faults and 40 ms more of training-thread CPU per DDP step, whichever variant it
# is. Fixed thresholds (the largest mmap threshold glibc allows, no trimming under 1 GiB) keep
# the build order out of the figures; each variant's page faults are printed.
MALLOC_TUNABLES = "glibc.malloc.mmap_threshold=33554432:glibc.malloc.trim_threshold=1073741824"


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
