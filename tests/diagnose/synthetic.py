"""Synthetic history for a real Prometheus: training jobs with one injected fault each.

Every job is simulated at a 15 s scrape interval over the last hour: per step, each rank's
phases (data, forward, backward compute, optimizer), the synchronous step time (the slowest
rank's compute plus the gradient sync), and the counters and histograms the hook exports,
plus the node exporter's GPU series. The result is written as OpenMetrics text, which
``promtool tsdb create-blocks-from openmetrics`` turns into TSDB blocks.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field

from trainguard import contract
from trainguard.thresholds import load_default

# The thresholds the synthetic jobs are diagnosed by: the shipped ones.
SHIPPED = load_default()
INTERVAL = 15.0
POINTS = 236  # the last hour, ending a minute before "now"
GIB = float(1 << 30)
SYNC = 0.05  # gradient sync time on the critical path, seconds per step
GRAD_SYNC_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
BASE = {"data": 0.01, "forward": 0.1, "backward": 0.2, "optimizer": 0.03}


@dataclass(frozen=True)
class Rank:
    rank: int
    node: str
    local_rank: int

    def labels(self, job_id: str) -> dict[str, str]:
        return {
            contract.LABEL_JOB_ID: job_id,
            contract.LABEL_RANK: str(self.rank),
            contract.LABEL_LOCAL_RANK: str(self.local_rank),
            contract.LABEL_NODE: self.node,
        }


def layout(prefix: str, nodes: int, per_node: int) -> list[Rank]:
    return [
        Rank(n * per_node + i, f"{prefix}-{chr(ord('a') + n)}", i)
        for n in range(nodes)
        for i in range(per_node)
    ]


@dataclass
class Samples:
    """Series grouped by metric family; each series a list of (time, value)."""

    types: dict[str, str] = field(default_factory=dict)
    series: dict[str, dict[tuple[tuple[str, str], ...], list[tuple[float, float]]]] = field(
        default_factory=lambda: defaultdict(lambda: defaultdict(list))
    )

    def add(
        self, family: str, kind: str, name: str, labels: dict[str, str], t: float, value: float
    ) -> None:
        self.types[family] = kind
        key = (("__name__", name), *sorted(labels.items()))
        self.series[family][key].append((t, value))

    def openmetrics(self) -> str:
        lines = []
        for family, by_series in self.series.items():
            lines.append(f"# TYPE {family} {self.types[family]}")
            for key, points in by_series.items():
                name = key[0][1]
                labels = ",".join(f'{k}="{v}"' for k, v in key[1:])
                for t, v in points:
                    lines.append(f"{name}{{{labels}}} {v!r} {t:.3f}")
        lines.append("# EOF")
        return "\n".join(lines) + "\n"


# Per-rank phase seconds at point i: returns {"data", "forward", "backward", "optimizer"}.
Phases = Callable[[Rank, int], dict[str, float]]


@dataclass
class Job:
    job_id: str
    ranks: list[Rank]
    phases: Phases = lambda rank, i: dict(BASE)
    # Last point at which a rank still reports (the process died after it).
    alive_until: Callable[[Rank], int] = lambda rank: POINTS
    # Progress stops for everyone from this point on (a hang), until ``hang_until`` if given
    # (the group restarted).
    hang_from: int | None = None
    hang_until: int | None = None
    # Points at which a rank does not report (its process is gone until a restart).
    absent: Callable[[Rank, int], bool] = lambda rank, i: False
    # A rank's oldest in-flight collective at a point, over what the hang says (None: as it
    # says): a restarted rank waiting for its peers to start, say.
    inflight: Callable[[Rank, int], float | None] = lambda rank, i: None
    # Collectives a rank launches fewer than the others once hung (the laggard).
    laggard: int | None = None
    grad_sync_tail: bool = False
    memory: Callable[[Rank, int], tuple[float, float, float]] | None = None
    oom_at: dict[int, int] = field(default_factory=dict)
    alloc_retries_from: dict[int, int] = field(default_factory=dict)
    # The worker group's restart count at point i (None: a hook too old to export it).
    restarts: Callable[[int], float] | None = None
    # The job's world size at point i, as its ranks report it (None: not exported).
    world_size: Callable[[int], float] | None = None


def histogram(
    s: Samples,
    spec: contract.MetricSpec,
    labels: dict[str, str],
    t: float,
    count: float,
    total: float,
    buckets: dict[float, float] | None = None,
) -> None:
    family = spec.name
    for le, c in (buckets or {}).items():
        s.add(family, "histogram", f"{family}_bucket", {**labels, "le": f"{le:g}"}, t, c)
    s.add(family, "histogram", f"{family}_bucket", {**labels, "le": "+Inf"}, t, count)
    s.add(family, "histogram", f"{family}_sum", labels, t, total)
    s.add(family, "histogram", f"{family}_count", labels, t, count)


def counter(
    s: Samples, spec: contract.MetricSpec, labels: dict[str, str], t: float, value: float
) -> None:
    s.add(spec.client_name, "counter", spec.name, labels, t, value)


def gauge(
    s: Samples, spec: contract.MetricSpec, labels: dict[str, str], t: float, value: float
) -> None:
    s.add(spec.name, "gauge", spec.name, labels, t, value)


def simulate(job: Job, s: Samples, t0: float) -> None:
    c = contract
    totals: dict[tuple[int, str], float] = defaultdict(float)
    sync_buckets: dict[int, dict[float, float]] = defaultdict(lambda: defaultdict(float))
    for i in range(POINTS):
        t = t0 + i * INTERVAL
        alive = [r for r in job.ranks if i <= job.alive_until(r) and not job.absent(r, i)]
        if not alive:
            break
        phases = {r.rank: job.phases(r, i) for r in alive}
        compute = {r: p["data"] + p["forward"] + p["backward"] for r, p in phases.items()}
        step = max(compute.values()) + SYNC + max(p["optimizer"] for p in phases.values())
        hung = job.hang_from is not None and job.hang_from <= i < (job.hang_until or POINTS)
        steps = 0.0 if hung else INTERVAL / step
        for r in alive:
            labels = r.labels(job.job_id)
            p = phases[r.rank]
            key = r.rank

            def acc(name: str, amount: float, key: int = key) -> float:
                totals[(key, name)] += amount
                return totals[(key, name)]

            n = acc("steps", steps)
            counter(s, c.STEPS, labels, t, n)
            last_step = t0 + job.hang_from * INTERVAL if job.hang_from is not None and hung else t
            gauge(s, c.LAST_STEP_TIMESTAMP, labels, t, last_step)
            histogram(s, c.STEP_DURATION, labels, t, n, acc("step_sum", steps * step))
            histogram(
                s, c.STEP_COMPUTE_DURATION, labels, t, n, acc("compute", steps * compute[key])
            )
            wait = step - compute[key] - p["optimizer"]
            histogram(s, c.SYNC_WAIT_DURATION, labels, t, n, acc("wait", steps * wait))
            gauge(s, c.STEP_COMPUTE_SHARE, labels, t, compute[key] / (compute[key] + wait))
            for phase in ("data", "forward", "optimizer"):
                total = acc(phase, steps * p[phase])
                histogram(s, c.STEP_PHASE_DURATION, {**labels, "phase": phase}, t, n, total)
            backward = acc("backward", steps * (p["backward"] + wait))
            histogram(s, c.STEP_PHASE_DURATION, {**labels, "phase": "backward"}, t, n, backward)
            # Gradient sync latency: mostly fast, and with a slow tail when asked for.
            buckets = sync_buckets[key]
            for le in GRAD_SYNC_BUCKETS:
                share = 1.0 if le >= 0.1 else 0.5
                if job.grad_sync_tail and le < 10.0:
                    share *= 0.995
                buckets[le] += steps * share
            histogram(s, c.GRAD_SYNC_DURATION, labels, t, n, acc("sync", steps * SYNC), buckets)
            launched = acc("launched", 4 * steps)
            if hung and job.laggard is not None and key != job.laggard:
                launched += 4
            counter(s, c.COLLECTIVES_LAUNCHED, labels, t, launched)
            counter(s, c.COLLECTIVES_COMPLETED, labels, t, totals[(key, "launched")])
            age = (i - job.hang_from) * INTERVAL if hung and job.hang_from is not None else 0.0
            if key == job.laggard:
                age = 0.0
            override = job.inflight(r, i)
            age = age if override is None else override
            gauge(s, c.COLLECTIVE_OLDEST_INFLIGHT, labels, t, age)
            gauge(s, c.COLLECTIVE_INFLIGHT, labels, t, 1.0 if age else 0.0)
            stalled = hung and age >= 60 and key != job.laggard
            counter(s, c.COLLECTIVE_STALLS, labels, t, 1.0 if stalled else 0.0)
            if job.memory is not None:
                allocated, reserved, capacity = job.memory(r, i)
            else:
                allocated, reserved, capacity = 30 * GIB, 34 * GIB, 80 * GIB
            gauge(s, c.MEMORY_ALLOCATED, labels, t, allocated)
            gauge(s, c.MEMORY_RESERVED, labels, t, reserved)
            gauge(s, c.MEMORY_CAPACITY, labels, t, capacity)
            gauge(s, c.MEMORY_FRAGMENTATION, labels, t, (reserved - allocated) / reserved)
            oom = 1.0 if key in job.oom_at and i >= job.oom_at[key] else 0.0
            counter(s, c.OOM_EVENTS, labels, t, oom)
            since = job.alloc_retries_from.get(key)
            counter(s, c.MEMORY_ALLOC_RETRIES, labels, t, max(0, i - since) if since else 0)
            if job.restarts is not None:
                gauge(s, c.ELASTIC_RESTARTS, labels, t, job.restarts(i))
            if job.world_size is not None:
                gauge(s, c.WORLD_SIZE, labels, t, job.world_size(i))


def gpus(
    s: Samples,
    t0: float,
    nodes: list[str],
    per_node: int,
    throttled: Callable[[str, int, int], bool] = lambda n, g, i: False,
    xid: tuple[str, int, int, int] | None = None,
    ecc: dict[tuple[str, int, str], tuple[int, float]] | None = None,
) -> None:
    """Exporter series: temperature, throttle reasons, Xid counters per GPU of each node, and
    ECC counters where ``ecc`` maps (node, gpu, kind) to (from point, errors counted since)."""
    c = contract
    for node in nodes:
        for g in range(per_node):
            labels = {
                c.LABEL_NODE: node,
                c.LABEL_GPU: str(g),
                c.LABEL_UUID: f"GPU-{node}-{g}",
                c.LABEL_MODEL_NAME: "NVIDIA H100 80GB HBM3",
            }
            for i in range(POINTS):
                t = t0 + i * INTERVAL
                hot = throttled(node, g, i)
                gauge(s, c.GPU_TEMPERATURE, labels, t, 91.0 if hot else 62.0)
                for reason in ("hw_thermal_slowdown", "sw_power_cap"):
                    value = 1.0 if hot and reason == "hw_thermal_slowdown" else 0.0
                    gauge(s, c.GPU_CLOCK_THROTTLED, {**labels, c.LABEL_REASON: reason}, t, value)
                if xid is not None and (node, g) == xid[:2]:
                    count = 1.0 if i >= xid[3] else 0.0
                    counter(s, c.GPU_XID_ERRORS, {**labels, c.LABEL_XID: str(xid[2])}, t, count)
                for (ecc_node, ecc_gpu, kind), (since, errors) in (ecc or {}).items():
                    if (node, g) == (ecc_node, ecc_gpu):
                        count = errors if i >= since else 0.0
                        counter(s, c.GPU_ECC_ERRORS, {**labels, c.LABEL_KIND: kind}, t, count)


def slow(factor: float, phase: str, ranks: set[int], from_point: int) -> Phases:
    def phases(rank: Rank, i: int) -> dict[str, float]:
        p = dict(BASE)
        if rank.rank in ranks and i >= from_point:
            p[phase] *= factor
        return p

    return phases


def mildly_slow(factor: float, rank: int, from_point: int, until_point: int = POINTS) -> Phases:
    """``rank``'s forward and backward ``factor`` times as long from ``from_point`` on (until
    ``until_point``)."""

    def phases(r: Rank, i: int) -> dict[str, float]:
        if r.rank != rank or not from_point <= i < until_point:
            return dict(BASE)
        return {**BASE, "forward": BASE["forward"] * factor, "backward": BASE["backward"] * factor}

    return phases


def slow_warm_up(factor: float, rank: int, until_point: int) -> Phases:
    """Steps of some 3.4 s (so the 50 warm-up steps take 11 points); ``rank``'s forward and
    backward ``factor`` times as long until ``until_point`` (compiling, tuning), then like the
    others'."""

    def phases(r: Rank, i: int) -> dict[str, float]:
        p = {name: 10 * seconds for name, seconds in BASE.items()}
        if r.rank == rank and i < until_point:
            p["forward"] *= factor
            p["backward"] *= factor
        return p

    return phases


def fragmenting(oom_rank: int, oom_at: int) -> Callable[[Rank, int], tuple[float, float, float]]:
    """Allocated steady near 40 GiB; reserved creeps up to the 80 GiB capacity (cache held in
    blocks too fragmented to reuse) until the allocation that fails."""

    def memory(rank: Rank, i: int) -> tuple[float, float, float]:
        allocated = (40 + (i % 3) * 0.5) * GIB
        if rank.rank != oom_rank:
            return allocated, 44 * GIB, 80 * GIB
        reserved = min(79.0, 44 + 35 * min(i, oom_at) / oom_at) * GIB
        return allocated, reserved, 80 * GIB

    return memory


def scaled(factor: float, phase: str, from_point: int = 0) -> Phases:
    """Every rank's ``phase`` takes ``factor`` times as long from ``from_point`` on."""

    def phases(rank: Rank, i: int) -> dict[str, float]:
        p = dict(BASE)
        if i >= from_point:
            p[phase] *= factor
        return p

    return phases


def steady(
    allocated_gib: float, reserved_gib: float
) -> Callable[[Rank, int], tuple[float, float, float]]:
    """Flat memory on every rank of an 80 GiB GPU."""

    def memory(rank: Rank, i: int) -> tuple[float, float, float]:
        return allocated_gib * GIB, reserved_gib * GIB, 80 * GIB

    return memory


def growing(rank_grows: int) -> Callable[[Rank, int], tuple[float, float, float]]:
    """Allocated on ``rank_grows`` climbs from 30 GiB at the start to 60 GiB at point 200 (a
    leak: tensors kept across steps), with reserved just above it; other ranks stay at 30."""

    def memory(rank: Rank, i: int) -> tuple[float, float, float]:
        allocated = 30 + (30 * i / 200 if rank.rank == rank_grows else 0.0)
        return allocated * GIB, (allocated + 2) * GIB, 80 * GIB

    return memory


def creeping(ranks: set[int], from_point: int) -> Callable[[Rank, int], tuple[float, float, float]]:
    """Allocated on ``ranks`` climbs from 30 GiB at ``from_point`` to 74 of 80 GiB at the last
    point (reserved 2 GiB above it): below 25% free from about point 193, no OOM in the
    window; other ranks stay at 30."""

    def memory(rank: Rank, i: int) -> tuple[float, float, float]:
        grown = 44 * max(0, i - from_point) / (POINTS - 1 - from_point)
        allocated = 30 + (grown if rank.rank in ranks else 0.0)
        return allocated * GIB, (allocated + 2) * GIB, 80 * GIB

    return memory


def restarted_at(point: int) -> Callable[[int], float]:
    """torchrun restarted the worker group once, at ``point``."""
    return lambda i: 1.0 if i >= point else 0.0


# The jobs of the synthetic history (job id -> what is injected).
STRAGGLER_RANK = "strag-rank"  # rank 5 forward 2.2x from minute 20
STRAGGLER_NODE = "strag-node"  # every rank of node sn-b backward 1.5x; no GPU fault
# rank 2 forward and backward 1.2x from point 80: 1.19x in step compute (data is not slowed),
# under straggler_factor; 1.19x in compute share, over straggler_recent_factor
STRAGGLER_MILD = "strag-mild"
THERMAL = "thermal"  # node th-b's GPUs throttle (hw_thermal_slowdown), its ranks slow
OOM_FRAG = "oom-frag"  # rank 1 OOMs with reserved-but-unallocated memory and retries
XID = "xid"  # Xid 79 on GPU 2 of node xi-b; rank 6 dies, the others hang
HANG = "job-hang"  # rank 2 never joins (the job id of the real gloo run's dumps)
RECORDED = "recorded-only"  # history only as recording-rule series: rank 2 slow
DATA_BOUND = "data-bound"  # every rank waits 0.3 s per step for data (step ~0.68 s)
JOB_SLOW = "job-slow"  # every rank's backward 2x from point JOB_SLOW_FROM
OOM_GROWTH = "oom-growth"  # rank 1's allocated memory grows 30 -> 60 GiB, then it OOMs
OOM_NO_FIT = "oom-no-fit"  # allocated 74 of 80 GiB from the start; rank 1 then rank 0 OOM
OOM_UNEXPLAINED = "oom-unexplained"  # OOM at 40 of 80 GiB, no fragmentation or growth
ECC = "ecc"  # 2 uncorrectable ECC errors on GPU 0 of node ec-b; corrected ones on ec-a
HEALTHY = "healthy"
# Rank 1 is 1.3x slower while the job warms up (points 0-9, its first 44 steps), then healthy.
WARM_UP = "warm-up"
MEMORY_CREEP = "mem-creep"  # rank 2's allocated memory creeps toward capacity; no OOM yet
# The same creep, and the rank 1.25x slower for 30 s at points 200-201 (a leak can slow it).
MEMORY_CREEP_SLOW = "mem-creep-slow"
OOM_AND_RISK = "oom-and-risk"  # rank 1 grows until it OOMs; rank 3 creeps, no OOM yet
# Rank 2 dies (the logs in tests/diagnose/logs/<job>/ say how) and torchrun restarts the worker
# group at point RESTART_AT: SIGKILL, or an error in its process group.
RANK_KILL = "rank-kill"
RANK_PG_ERROR = "rank-pgerr"
# The same death as RANK_PG_ERROR from a hook that exports no restart count.
RANK_OLD_HOOK = "rank-old-hook"
# Rank 2 dies mid-collective at point DEATH_AT (its process group fails; SIGABRT); its peers wait
# in the collective for it, past the stall threshold, until torchrun restarts the group at
# RESTART_AT. Restarted, rank 2 waits 45 s in its first collective for its peers to start.
RANK_DEATH_STALL = "rank-death-stall"
DEATH_AT = 174
# Rank 2 of 4 (node ex-b) is a straggler; node ex-b is excluded at RESTART_AT and node ex-a's
# ranks restart and re-form the job at world size 2.
EXCLUDED = "excluded"
JOB_SLOW_FROM = 120
RESTART_AT = 180


def history(t0: float) -> str:
    s = Samples()
    simulate(Job(STRAGGLER_RANK, layout("sr", 2, 4), slow(2.2, "forward", {5}, 80)), s, t0)
    gpus(s, t0, ["sr-a", "sr-b"], 4)
    simulate(
        Job(STRAGGLER_NODE, layout("sn", 3, 4), slow(1.5, "backward", {4, 5, 6, 7}, 80)), s, t0
    )
    gpus(s, t0, ["sn-a", "sn-b", "sn-c"], 4)
    simulate(Job(STRAGGLER_MILD, layout("sm", 1, 4), mildly_slow(1.2, 2, 80)), s, t0)
    simulate(Job(THERMAL, layout("th", 3, 4), slow(1.6, "backward", {4, 5, 6, 7}, 75)), s, t0)
    gpus(s, t0, ["th-a", "th-b", "th-c"], 4, throttled=lambda n, g, i: n == "th-b" and i >= 70)
    simulate(
        Job(
            OOM_FRAG,
            layout("of", 1, 2),
            memory=fragmenting(1, 200),
            oom_at={1: 200},
            alloc_retries_from={1: 180},
            alive_until=lambda r: 200,
        ),
        s,
        t0,
    )
    gpus(s, t0, ["of-a"], 2)
    simulate(
        Job(
            XID,
            layout("xi", 2, 4),
            alive_until=lambda r: 150 if r.rank == 6 else POINTS,
            hang_from=151,
        ),
        s,
        t0,
    )
    gpus(s, t0, ["xi-a", "xi-b"], 4, xid=("xi-b", 2, 79, 150))
    simulate(Job(HANG, layout("hg", 1, 3), hang_from=200, laggard=2, grad_sync_tail=True), s, t0)
    simulate(Job(HEALTHY, layout("ok", 1, 2), restarts=lambda i: 0.0), s, t0)
    simulate(Job(WARM_UP, layout("wu", 1, 4), slow_warm_up(1.3, 1, 10)), s, t0)
    simulate(Job(MEMORY_CREEP, layout("mc", 2, 2), memory=creeping({2}, 120)), s, t0)
    simulate(
        Job(
            MEMORY_CREEP_SLOW,
            layout("ms", 2, 2),
            mildly_slow(1.25, 2, 200, 202),
            memory=creeping({2}, 120),
        ),
        s,
        t0,
    )
    grow_then_oom = growing(1)
    creep = creeping({3}, 120)
    simulate(
        Job(
            OOM_AND_RISK,
            layout("or", 1, 4),
            memory=lambda r, i: grow_then_oom(r, i) if r.rank == 1 else creep(r, i),
            oom_at={1: 200},
            alive_until=lambda r: 200 if r.rank == 1 else POINTS,
        ),
        s,
        t0,
    )
    for job_id in (RANK_KILL, RANK_PG_ERROR):
        simulate(Job(job_id, layout(job_id, 2, 2), restarts=restarted_at(RESTART_AT)), s, t0)
    simulate(Job(RANK_OLD_HOOK, layout("oh", 2, 2)), s, t0)
    simulate(
        Job(
            RANK_DEATH_STALL,
            layout(RANK_DEATH_STALL, 2, 2),
            hang_from=DEATH_AT,
            hang_until=RESTART_AT,
            laggard=2,
            absent=lambda r, i: r.rank == 2 and DEATH_AT <= i < RESTART_AT,
            inflight=lambda r, i: 45.0 if r.rank == 2 and i == RESTART_AT else None,
            restarts=restarted_at(RESTART_AT),
        ),
        s,
        t0,
    )
    simulate(
        Job(
            EXCLUDED,
            layout("ex", 2, 2),
            slow(2.0, "forward", {2}, 80),
            alive_until=lambda r: RESTART_AT - 1 if r.rank >= 2 else POINTS,
            restarts=restarted_at(RESTART_AT),
            world_size=lambda i: 4.0 if i < RESTART_AT else 2.0,
        ),
        s,
        t0,
    )
    simulate(Job(DATA_BOUND, layout("db", 2, 1), scaled(30.0, "data")), s, t0)
    simulate(Job(JOB_SLOW, layout("js", 2, 1), scaled(2.0, "backward", JOB_SLOW_FROM)), s, t0)
    simulate(
        Job(
            OOM_GROWTH,
            layout("og", 1, 2),
            memory=growing(1),
            oom_at={1: 200},
            alive_until=lambda r: 200,
        ),
        s,
        t0,
    )
    simulate(
        Job(
            OOM_NO_FIT,
            layout("nf", 1, 2),
            memory=steady(74, 76),
            oom_at={1: 60, 0: 62},
            alive_until=lambda r: 62 if r.rank == 0 else 60,
        ),
        s,
        t0,
    )
    simulate(
        Job(
            OOM_UNEXPLAINED,
            layout("ou", 1, 1),
            memory=steady(40, 42),
            oom_at={0: 100},
            alive_until=lambda r: 100,
        ),
        s,
        t0,
    )
    simulate(Job(ECC, layout("ec", 2, 1)), s, t0)
    gpus(
        s,
        t0,
        ["ec-a", "ec-b"],
        1,
        ecc={("ec-b", 0, "uncorrected"): (150, 2.0), ("ec-a", 0, "corrected"): (50, 7.0)},
    )
    for r in layout("rc", 1, 4):
        for i in range(POINTS):
            value = 0.45 if r.rank == 2 and i >= 60 else 0.3
            s.add(
                contract.REC_RANK_COMPUTE_MEAN,
                "gauge",
                contract.REC_RANK_COMPUTE_MEAN,
                r.labels(RECORDED),
                t0 + i * INTERVAL,
                value,
            )
    return s.openmetrics()


OOM_LOG = (
    "[rank1]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 1 "
    "has a total capacity of 79.10 GiB of which 1.06 GiB is free. Including non-PyTorch memory, "
    "this process has 78.03 GiB memory in use. Of the allocated memory 40.12 GiB is allocated "
    "by PyTorch, and 37.02 GiB is reserved by PyTorch but unallocated. If reserved but "
    "unallocated memory is large try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True "
    "to avoid fragmentation.\n"
)
