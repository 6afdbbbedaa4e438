"""Stragglers from the per-rank timings trainers and training scripts print.

The verdict is one rule whatever printed the numbers: a rank is slow when the median of its
samples of one timing is at least ``factor`` times the median of its peers' medians, with at
least ``min_ranks`` ranks compared (thresholds.yml's ``straggler_factor`` and
``straggler_min_ranks``, the values the TrainingStraggler alert and ``diagnose`` judge by) and
enough samples per rank for a median to mean something.

What differs is how the samples are read. Four kinds:

* per-step lines a rank prints about itself (``step_time=0.51``, DeepSpeed's
  ``rank=3 time (ms) | forward: ...``): noisy, one step each, so a rank needs
  ``MIN_SAMPLES`` of them;
* reports one process prints about every rank at once (Megatron's ``times across ranks``
  block, DLRover's network-check times): each is already an aggregate (a logging interval's
  average, a whole check task), so a rank needs ``MIN_REPORTS`` of them; three, so that one
  bad report (a warm-up, a round run before a node was replaced) cannot carry the median;
* another tool's straggler verdict (TraceML's ``Rank r2 input wait was 199.7ms vs median rank
  r0 at 10.4ms.``): the worst rank's and the median rank's figures over the tool's whole
  analysis window, so one suffices; the same factor still decides whether it is slow;
* a benchmark every rank runs at once before or during training (Greyhound's computation
  check, ``Computation result of rank 1 collected = (Perf: min=515.40, ..., avg=515.49, ...)``):
  each result is already the mean of repeated timed runs of one fixed kernel, the same on every
  rank, so one round suffices too. The Relax straggler prototype's 4-GPU check (a JSON dump with
  ``"fwd_ms_by_rank": [12.76, 12.96, 12.90, 34.01]``, one rank's forward total per entry) is
  read the same way;
* a per-rank summary printed once at the end of a run (pytscope's ``rank 1:    2.55 ms ·``
  compute lines under their header, a DDP lab's ``rank=0 step_ms=... data_ms=44.64 ...``): each
  figure is a rank's mean over the whole run, so one suffices.

Timers that contain a collective or a wait (all-reduce, send/recv, sync, ...) are not compared:
a collective ends when the last rank arrives, so in it the straggler waits least and the ranks
that wait for it look slow. Only local work tells the straggler apart.
"""

from __future__ import annotations

import re
import statistics
from collections import deque
from dataclasses import dataclass
from typing import ClassVar

from trainguard.contract import Failure
from trainguard.thresholds import Thresholds
from trainguard.triage.detectors.base import (
    MAX_LISTED,
    Source,
    bounded_get,
    rank_of,
    register,
)
from trainguard.triage.findings import Finding, Location

_SAMPLES_PER_RANK = 1000
# Per-step samples a rank needs before its median is compared (a rank's own lines).
MIN_SAMPLES = 5
# Reports a rank needs before its median is compared (one line or block covering every rank).
MIN_REPORTS = 3
# Verdicts of another straggler detector: each already sums up a whole analysis window.
MIN_VERDICTS = 1
# Rounds of a per-rank benchmark: each is the mean of repeated timed runs of one kernel.
MIN_BENCHMARKS = 1
# Per-rank summaries of a whole run: each is a rank's mean over every step of it.
MIN_SUMMARIES = 1
# Lines one Megatron "times across ranks" block may span before it is cut off.
_MAX_BLOCK_LINES = 100_000

# --- formats ----------------------------------------------------------------------------
# 1. A rank's own key=value timing, in seconds or milliseconds: what training scripts print
#    (``compute_time=0.51s``, ``step_time: 498.3ms``: tests/triage/fixtures/straggler.log),
#    plain prints (``rank 3 step time 1.52s``), Megatron's
#    ``elapsed time per iteration (ms): 1234.5`` (megatron/training/training.py training_log,
#    NVIDIA/Megatron-LM d98e8a64dd) and ESPnet's ``iter_time=0.422`` (as its trainer logs it,
#    espnet/espnet#3221); not inside a longer name (``optim_step_time``). The rank comes from
#    torchrun's [rankN]: prefix, the message ("rank 3 ...") or the file name.
#    "Not inside a longer name" is checked on the character before the key (_in_name), not by a
#    look-behind here: one at the start of the pattern keeps re from skipping ahead to the
#    keys' first letters, and made the search twice as slow on every line with a step time.
_TIMING = re.compile(
    r"(?P<key>step[_ ]time|iter(?:ation)?[_ ]time|compute[_ ]time|batch[_ ]time"
    r"|time per iteration)"
    r"\s*(?P<ms>\(ms\))?\s*[=:]?\s*(?P<value>\d+(?:\.\d+)?)\s*(?P<unit>ms|s)?\b"
)


def _in_name(char: str) -> bool:
    """Whether ``char`` can be part of a name (``\\w`` or ``-``)."""
    return char.isalnum() or char in "_-"


# "rank 3", "rank=3", "Rank: 3", "[rank 3]" before the timing; not "nranks" nor "local_rank".
_RANK_WORD = re.compile(r"\b[Rr]ank[\s=:#\[]*(\d+)\b")

# 2. DeepSpeed's wall-clock breakdown, ``rank=0 time (ms) | forward: 316.00 | backward: ...``:
#    SynchronizedWallClockTimer.log in deepspeed/utils/timer.py from v0.3.0 (65c2f974d,
#    2020-09) to v0.10.0; b354c28b7 (v0.10.1) dropped the ``rank=N`` and prints ``time (ms)``
#    alone (deepspeedai/DeepSpeed). Printed by rank 0 unless the caller passes ``ranks``.
_DEEPSPEED = re.compile(r"\brank=(?P<rank>\d+) time \(ms\)(?P<timers>(?: \| [\w.\-]+: [\d.]+)+)")
_DEEPSPEED_TIMER = re.compile(r" \| (?P<name>[\w.\-]+): (?P<value>\d+(?:\.\d+)?)")

# 3. Megatron with --timing-log-option all: Timers._get_all_ranks_time_string in
#    megatron/core/timers.py (since 77efcccb93 "Timing levels", 2022-08, tag 23.04; unchanged
#    at d98e8a64dd) logs, on the last rank, every timer's time per rank in milliseconds:
#        times across ranks (ms):
#          forward-compute:
#             rank  0: 1210.51
#             rank  1: 1544.30
#    one logger.info record per log interval, normalised by --log-interval (an average).
_MEGATRON_HEADER = "times across ranks (ms):"
_MEGATRON_ROW = re.compile(r"\brank\s+(?P<rank>\d+): (?P<value>\d+(?:\.\d+)?)\s*$")
_MEGATRON_NAME = re.compile(r"(?:^|\s)(?P<name>[A-Za-z][\w\-/.]*(?: [\w\-/.]+)*):\s*$")

# 4. DLRover's network check (dlrover-run --network-check): the job master logs each node's
#    time to run the check task, ``Round 1: The node elapsed time are {2: 20.307, 1: 135.961}``
#    (NetworkCheckRendezvousManager, dlrover/python/master/elastic_training/rdzv_manager.py;
#    intelligent-machine-learning/dlrover b1fb4c4 prefixes the manager's name; 2023 releases
#    printed ``The elapsed time of nodes are {...}``). Keys are node ranks; 3600 s is the value
#    a node gets when the check timed out (docs/tutorial/check_node_health.md): a fault, not a
#    time, so it is left out.
_DLROVER = re.compile(r"elapsed time[^{]*\{(?P<body>[^{}]*)\}")
_DLROVER_ENTRY = re.compile(r"(?P<node>\d+): (?P<value>\d+(?:\.\d+)?)")
_DLROVER_TIMEOUT = 3600.0

# 5. TraceML's Step Time verdict, the slowest rank of a phase against the median rank over its
#    analysis window: ``Rank r2 input wait was 199.7ms vs median rank r0 at 10.4ms.``
#    (traceopt-ai/traceml src/traceml_ai/reporting/primary_diagnosis.py,
#    ``f"Rank r{worst_rank} {phase_label} was {worst_value:.1f}ms "
#    f"vs median rank r{median_rank} at {median_value:.1f}ms."``; the phase is the tool's
#    phase name, ``dataloader``, ``optimizer``, ``h2d``, or its label, ``input wait``). The
#    phase is compared as the tool chose it, waits included: an input wait is the rank's own
#    loader, and the tool has already set collectives aside.
_TRACEML_KEY = "ms vs median rank r"  # long, hence cheap to search for
_TRACEML = re.compile(
    r"\bRank r(?P<rank>\d+) (?P<phase>[A-Za-z][\w ]{0,40}?) was (?P<worst>\d+(?:\.\d+)?)ms "
    r"vs median rank r(?P<peer>\d+) at (?P<median>\d+(?:\.\d+)?)ms"
)

# 6. Greyhound's computation check (FALCON, USENIX ATC '25; wutianyuan1/Greyhound 7485ea8, the same
#    in wutianyuan1/ncclprobe): when a fail-slow is suspected, and once before training, the
#    global controller has every rank run perf_gemm (detector/matmul.cu: one fixed matmul ten
#    times, each timed with CUDA events, in ms) and logs, in
#    detector/control_plane/global_controller.py validate_computation,
#    ``f"Computation result of rank {r} collected = {results[r]}!!"``, the result printed by
#    PerformanceMetric.__str__ (detector/control_plane/global_analyzer.py):
#    ``f"(Perf: min={self.min_lat}, max={self.max_lat}, avg={self.avg_lat}, std={self.std_lat})"``.
#    The average is compared. Its p2p tests (``Result of rank 0 collected = (Perf: ...)``) time
#    pairs of ranks sending to each other: communication, not compared.
# The needle is the message's longest fixed run: a long needle is the cheapest to search for.
_GREYHOUND_KEY = "Computation result of rank"
_FLOAT = r"\d+(?:\.\d+)?(?:[eE][-+]?\d+)?"
_GREYHOUND = re.compile(
    rf"\bComputation result of rank (?P<rank>\d+) collected = "
    rf"\(Perf: min={_FLOAT}, max={_FLOAT}, avg=(?P<avg>{_FLOAT}),"
)

# 7. The 4-GPU check of the Relax straggler prototype (evidence of the RFC redai-studio/Relax#334;
#    hongwei-2026/relax-straggler-rfc-assets 7a6df99, evidence/2026-09-29/bench_straggler_4gpu.py):
#    every rank runs the same matmul loop for 8 steps with its forward-compute timer (CUDA events)
#    and rank 0 gathers the totals (all_gather_object, so in rank order) and prints
#    ``print(json.dumps(result, indent=2))`` with ``"fwd_ms_by_rank": [item["fwd"] for item in
#    gathered]``: the list's n-th value is rank n's total, in ms. indent=2 puts each value on a
#    line of its own; a compact dump (as the RFC's text quotes it) keeps them on the key's line.
#    The same loop on every rank makes it a benchmark, one run of which suffices. Its
#    ``dp_grad_sync`` figures time the all-reduce: not compared. The needle is the key with
#    json.dumps's default ": " separator and the list's bracket, as both dumps print it: the
#    longer needle is the cheaper one to search for (13.1 vs 16.1 ms per 64 MB for the key alone).
_RELAX_KEY = '"fwd_ms_by_rank": ['
_RELAX_VALUE = re.compile(_FLOAT)
# A line that goes on with the list: values, commas and at most its closing bracket.
_RELAX_ROW = re.compile(rf"\s*(?:{_FLOAT}\s*,?\s*)*(?:\]\s*,?\s*)?")
# Values one list may hold before it is cut off (a rank each).
_MAX_LIST = 100_000

# 8. pytscope's run report (Sumu004/trainscope, named trainscope until 778ed87; PyPI pytscope),
#    ``pytscope analyze <run>``: under ``per-rank compute (ms/step) · % steps on critical path:``
#    one line per rank, ``f"    rank {rs.rank}: {rs.mean_compute * 1e3:7.2f} ms · "
#    f"{rs.slowest_fraction * 100:4.0f}% (z={rs.straggler_z:+.1f}){flag}"``
#    (trainscope/report/cli_report.py 58f0938); since 0a94f60 a terminal gets the rank styled
#    with ANSI colours and a bar after the dot (pytscope/report/cli_report.py c41a92d).
#    ``mean_compute`` is the rank's mean local compute per step, its collectives left out
#    (trainscope/analyzers/distributed.py), so it is compared. The header is the needle and the
#    rows its block: a needle of the rows' own text (`` ms · ``, which the report's other lines
#    share too) would cost 6% of the throughput, the header 2%.
_PYTSCOPE_HEADER = "per-rank compute (ms/step)"
_PYTSCOPE_ROW = re.compile(rf"\s*rank (?P<rank>\d+):\s+(?P<ms>{_FLOAT}) ms \u00b7 ")
# Ranks one block may list before it is cut off.
_MAX_ROWS = 100_000

# 9. The DDP lab of duoan/playground-cuda (bd8129de84, python/playground_cuda/ddp_lab.py): rank 0
#    gathers every rank's per-step times (all_gather_object) and prints their steady-state means,
#    ``f"rank={rank_id} step_ms={...:.2f} data_ms={...:.2f} compute_ms={...:.2f}"``. ``data_ms``
#    times the rank's own batch fetch and is compared; ``step_ms`` is the whole step (equal on
#    every rank) and ``compute_ms`` runs from the fetch to the end of optimizer.step(), the
#    gradient all-reduce included (the straggler waits least in it): neither is compared. The
#    lab's own ``Slowest steady-state rank:`` line picks the largest step_ms, so it is not read.
#    The needle is the row's longest fixed run (the longer, the cheaper to search for).
_DDP_LAB_KEY = " compute_ms="
_DDP_LAB = re.compile(
    rf"\brank=(?P<rank>\d+) step_ms={_FLOAT} data_ms=(?P<data>{_FLOAT}) compute_ms={_FLOAT}"
)

# Timers holding a collective, a point-to-point transfer or a wait, by the names Megatron
# (megatron/training/training.py timers_to_log: *-all-reduce, all-grads-sync,
# params-all-gather, *-send/-recv, and the optimizer steps that all-reduce a flag or a norm:
# optimizer-unscale-and-check-inf, optimizer-clip-main-grad, optimizer-count-zeros; the
# aggregates forward-backward and optimizer hold them) and DeepSpeed (backward_allreduce,
# optimizer_allgather) give them.
_WAITING_TIMER = re.compile(
    r"all[-_ ]?reduce|all[-_ ]?gather|reduce[-_ ]?scatter|all[-_ ]?to[-_ ]?all|broadcast"
    r"|send|recv|sync|wait|barrier|comm|check-inf|clip|count-zeros"
    r"|^forward-backward$|^optimizer$",
    re.IGNORECASE,
)

# rank_of's fallback is the file name's rank; a rank named in the message comes before it
_NO_HINT = Source("")

_PER_STEP, _REPORT, _VERDICT, _BENCHMARK, _SUMMARY = (
    "per-step",
    "report",
    "verdict",
    "benchmark",
    "summary",
)
_NEEDED = {
    _PER_STEP: MIN_SAMPLES,
    _REPORT: MIN_REPORTS,
    _VERDICT: MIN_VERDICTS,
    _BENCHMARK: MIN_BENCHMARKS,
    _SUMMARY: MIN_SUMMARIES,
}


@dataclass
class _Series:
    """One rank's samples of one timing, and where they were first seen."""

    samples: deque[float]
    first: Location
    kind: str
    scope: str  # "rank", or "node" where the log names nodes (DLRover)


@register
class StragglerDetector:
    """Per-rank timings; a rank whose median is well above its peers' is slow.

    Each timing (step_time, forward-compute, a DLRover check, ...) is compared separately so
    that a log that prints several never mixes them; a rank slow in several is one finding,
    named after the timing it is slowest in.
    """

    failure: ClassVar[Failure] = Failure.STRAGGLER
    # Literal keywords of the lines it reads. "_time" covers step_time, iter_time,
    # compute_time and batch_time; the rest are the other formats' fixed words.
    # TraceML's verdict and Greyhound's check hold no "time", hence their own (rare) needles.
    keywords: tuple[str, ...] = (
        "_time",
        "step time",
        "iteration time",
        "compute time",
        "batch time",
        "time per iteration",
        "time (ms) |",
        _MEGATRON_HEADER,
        "elapsed time",
        _TRACEML_KEY,
        _GREYHOUND_KEY,
        _RELAX_KEY,
        _PYTSCOPE_HEADER,
        _DDP_LAB_KEY,
    )
    # every keyword holds one of them
    needles: tuple[str, ...] = (
        "time",
        _TRACEML_KEY,
        _GREYHOUND_KEY,
        _RELAX_KEY,
        _PYTSCOPE_HEADER,
        _DDP_LAB_KEY,
    )

    @classmethod
    def from_thresholds(cls, thresholds: Thresholds) -> StragglerDetector:
        return cls(thresholds.straggler_factor, thresholds.straggler_min_ranks)

    def __init__(self, factor: float, min_ranks: int) -> None:
        self.dropped = 0
        self.factor = factor
        self.min_ranks = max(min_ranks, 2)  # a rank needs at least one peer to compare with
        self._series: dict[tuple[str, int], _Series] = {}
        # Inside a Megatron block: the timer whose rows come next (None before the first name)
        # and how many lines the block has run.
        self._block_timer: str | None = None
        self._block_lines = 0
        self._block_source = ""  # a block never runs on into the next file
        # Inside a Relax "fwd_ms_by_rank" list: the rank its next value belongs to (None outside).
        self._list_rank: int | None = None
        self._list_source = ""
        # Inside a pytscope per-rank block: the rows read so far (None outside).
        self._rows: int | None = None
        self._rows_source = ""

    # --- reading ----------------------------------------------------------------------------
    def feed(self, line: str, where: Location, source: Source) -> bool:
        if self._list_rank is not None:
            if self._list_source == source.name and _RELAX_ROW.fullmatch(line):
                return self._relax_values(line, where)
            self._list_rank = None  # cut short (a truncated excerpt): read the line below
        if self._rows is not None:
            if self._rows_source == source.name and self._pytscope_row(line, where):
                return True
            self._rows = None  # the block ended; the line may be anything, read it below
        if self._block_lines and self._block_source == source.name:
            if self._block_row(line, where):
                return True
            self._block_lines = 0  # the block ended; the line may be anything, read it below
        if _MEGATRON_HEADER in line:
            self._block_timer, self._block_lines, self._block_source = None, 1, source.name
            return True
        if "elapsed time" in line and "{" in line:
            self._dlrover(line, where)
            return False
        if "time (ms) |" in line:
            self._deepspeed(line, where)
            return False
        if _TRACEML_KEY in line:
            self._traceml(line, where)
            return False
        if _GREYHOUND_KEY in line:
            self._greyhound(line, where)
            return False
        if _PYTSCOPE_HEADER in line:
            self._rows, self._rows_source = 0, source.name
            return True
        if _DDP_LAB_KEY in line:
            self._ddp_lab(line, where)
            return False
        opened = line.find(_RELAX_KEY)
        if opened != -1:
            self._list_rank, self._list_source = 0, source.name
            return self._relax_values(line[opened + len(_RELAX_KEY) :], where)
        self._own_timing(line, where, source)
        return False

    def _own_timing(self, line: str, where: Location, source: Source) -> None:
        match = _TIMING.search(line)
        while match and match.start() and _in_name(line[match.start() - 1]):
            match = _TIMING.search(line, match.end())  # the end of a longer name: read on
        if not match:
            return
        rank = rank_of(line, _NO_HINT)  # prefix or "Rank N]" first, the file name last
        if rank is None:
            said = _RANK_WORD.search(line, 0, match.start())
            rank = int(said.group(1)) if said else source.rank_hint
        if rank is None:
            return
        seconds = float(match["value"])
        if match["ms"] or match["unit"] == "ms":
            seconds /= 1000.0
        key = match["key"].replace(" ", "_").replace("iteration_time", "iter_time")
        self._add(key, rank, seconds, where, _PER_STEP)

    def _deepspeed(self, line: str, where: Location) -> None:
        match = _DEEPSPEED.search(line)
        if not match:
            return
        rank = int(match["rank"])
        for timer in _DEEPSPEED_TIMER.finditer(match["timers"]):
            if not _WAITING_TIMER.search(timer["name"]):
                self._add(timer["name"], rank, float(timer["value"]) / 1000.0, where, _PER_STEP)

    def _dlrover(self, line: str, where: Location) -> None:
        match = _DLROVER.search(line)
        if not match:
            return
        for entry in _DLROVER_ENTRY.finditer(match["body"]):
            value = float(entry["value"])
            if value < _DLROVER_TIMEOUT:
                node = int(entry["node"])
                self._add("network_check_time", node, value, where, _REPORT, scope="node")

    def _traceml(self, line: str, where: Location) -> None:
        for verdict in _TRACEML.finditer(line):
            # named apart from the other formats' timers: its figures are window summaries
            metric = "traceml_" + verdict["phase"].replace(" ", "_")
            for rank, ms in (
                (verdict["rank"], verdict["worst"]),
                (verdict["peer"], verdict["median"]),
            ):
                self._add(metric, int(rank), float(ms) / 1000.0, where, _VERDICT)

    def _greyhound(self, line: str, where: Location) -> None:
        match = _GREYHOUND.search(line)
        if match:
            avg_ms = float(match["avg"])
            self._add("greyhound_gemm", int(match["rank"]), avg_ms / 1000.0, where, _BENCHMARK)

    def _pytscope_row(self, line: str, where: Location) -> bool:
        """A rank's line of a pytscope block; False when the block has ended."""
        match = _PYTSCOPE_ROW.match(line)
        if match is None or self._rows is None or self._rows >= _MAX_ROWS:
            return False
        self._rows += 1
        ms = float(match["ms"])
        self._add("pytscope_compute", int(match["rank"]), ms / 1000.0, where, _SUMMARY)
        return True

    def _ddp_lab(self, line: str, where: Location) -> None:
        match = _DDP_LAB.search(line)
        if match:
            ms = float(match["data"])
            self._add("ddp_lab_data", int(match["rank"]), ms / 1000.0, where, _SUMMARY)

    def _relax_values(self, text: str, where: Location) -> bool:
        """The values of a Relax list in ``text``; True while the list goes on past it."""
        rank = self._list_rank
        if rank is None:
            return False
        values, closed, _ = text.partition("]")
        for value in _RELAX_VALUE.findall(values):
            self._add("relax_fwd", rank, float(value) / 1000.0, where, _BENCHMARK)
            rank += 1
        self._list_rank = None if closed or rank >= _MAX_LIST else rank
        return self._list_rank is not None

    def _block_row(self, line: str, where: Location) -> bool:
        """A line inside a Megatron block; False when the line is not part of it."""
        self._block_lines += 1
        if self._block_lines > _MAX_BLOCK_LINES:
            return False
        row = _MEGATRON_ROW.search(line)
        if row:
            timer = self._block_timer
            if timer is not None and not _WAITING_TIMER.search(timer):
                value = float(row["value"]) / 1000.0
                self._add(timer, int(row["rank"]), value, where, _REPORT)
            return True
        name = _MEGATRON_NAME.search(line)
        if name:
            self._block_timer = name["name"]
            return True
        return False

    def _add(
        self,
        metric: str,
        rank: int,
        seconds: float,
        where: Location,
        kind: str,
        scope: str = "rank",
    ) -> None:
        series = bounded_get(
            self._series,
            (metric, rank),
            lambda: _Series(deque(maxlen=_SAMPLES_PER_RANK), where, kind, scope),
            self,
        )
        if series is not None:
            series.samples.append(seconds)

    # --- judging ----------------------------------------------------------------------------
    def findings(self) -> list[Finding]:
        by_metric: dict[str, dict[int, float]] = {}
        for (metric, rank), series in self._series.items():
            if len(series.samples) >= _NEEDED[series.kind]:
                by_metric.setdefault(metric, {})[rank] = statistics.median(series.samples)
        slow: dict[int, list[tuple[float, str, float, float, int]]] = {}
        for metric, medians in sorted(by_metric.items()):
            if len(medians) < self.min_ranks:
                continue
            for rank, median in sorted(medians.items()):
                peers = statistics.median(m for r, m in medians.items() if r != rank)
                if peers <= 0 or median < peers * self.factor:
                    continue
                slow.setdefault(rank, []).append(
                    (median / peers, metric, median, peers, len(medians))
                )
        return [
            self._finding(rank, sorted(hits, reverse=True)) for rank, hits in sorted(slow.items())
        ]

    def _finding(self, rank: int, hits: list[tuple[float, str, float, float, int]]) -> Finding:
        ratio, metric, median, peers, compared = hits[0]  # the timing it is slowest in
        series = self._series[(metric, rank)]
        fields = {
            "rank": rank,
            "scope": series.scope,
            "metric": metric,
            "median_seconds": round(median, 6),
            "peer_median_seconds": round(peers, 6),
            "slowdown": round(ratio, 3),
            "samples": len(series.samples),
            "ranks_compared": compared,
            "slow_metrics": [hit[1] for hit in hits][:MAX_LISTED],
        }
        who = f"node {rank}" if series.scope == "node" else f"rank {rank}"
        also = f"; also slow in {len(hits) - 1} other timing(s)" if len(hits) > 1 else ""
        return Finding(
            Failure.STRAGGLER,
            f"{who} is {ratio:.2f}x slower than its peers ({metric} median "
            f"{median:.3f}s vs {peers:.3f}s){also}",
            series.first,
            "Check that rank's node for GPU clock throttling (thermal/power), a slower "
            "PCIe/NVLink path, CPU contention in its data loader, or a shared GPU. If the node "
            "is at fault, exclude it and let torchrun elastic re-rendezvous; if it is "
            "data-bound, raise DataLoader num_workers. In synchronous training only local "
            "(compute) times differ between ranks; whole-step times are equal.",
            fields,
            len(series.samples),
        )
