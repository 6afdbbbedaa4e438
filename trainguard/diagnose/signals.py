"""What Prometheus knows about one job over a time window, gathered into plain Python data.

Per-rank means and quantiles are read from trainguard's recording rules (``alerts/``) by name.
Prometheus only holds a recorded series from the time the rule was loaded, so each recording
rule whose expression reads raw series only is queried as ``rule or (its expression)``: the
recorded value where it exists, the same value computed from the raw series where it does not
(history older than the rules, or a Prometheus without them). Derived values (job medians,
ratios) are computed here from the per-rank series, which keeps the fallback simple.
Node series (GPU throttling, Xid, ECC, NCCL transport) are read for the nodes the job's ranks
ran on.
"""

from __future__ import annotations

import functools
import re
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field

from trainguard import contract
from trainguard.diagnose.prometheus import PrometheusClient, Series
from trainguard.thresholds import Thresholds

RANK_BY = ", ".join(contract.RANK_IDENTITY_LABELS)
# Selectors of raw series (not recording rules, whose names hold colons) in a rule expression.
_RAW_SELECTOR = re.compile(r"(?<![\w:])(trainguard_[a-z0-9_]+)(?![\w:{(])")
_RECORDED_NAME = re.compile(r"\b\w+:\w+:\w+\b")


class NoDataError(RuntimeError):
    """Prometheus holds no series of this job in the window."""


@functools.cache
def _rules(t: Thresholds) -> dict[str, str]:
    """Recording-rule name -> expression, as the rules are rendered from ``t``."""
    from trainguard.alerts.rules import recording_rules

    return {rule["record"]: rule["expr"] for rule in recording_rules(t)}


def harmful_throttle_reason(reason: str, limits: Thresholds) -> bool:
    """Whether a throttle reason holds clocks down harmfully: it matches the thresholds'
    ``thermal_throttle_reasons`` (the GpuThermalThrottling alert's anchored RE2 regex)."""
    pattern = limits.thermal_throttle_reasons
    return re.fullmatch(pattern, reason) is not None


def promql_string(value: str) -> str:
    """A PromQL double-quoted string literal."""
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def rule_query(name: str, matchers: str, t: Thresholds) -> str:
    """``name{matchers}``, or that ``or`` the rule's expression (as rendered from ``t``) on raw
    series with the same matchers when the rule reads raw series only."""
    recorded = f"{name}{{{matchers}}}"
    expr = _rules(t).get(name)
    if expr is None or _RECORDED_NAME.search(expr):
        return recorded
    raw = _RAW_SELECTOR.sub(lambda m: f"{m.group(1)}{{{matchers}}}", expr)
    return f"{recorded}\nor\n({raw})"


@dataclass(frozen=True, order=True)
class RankId:
    rank: int
    node: str
    local_rank: str


@dataclass
class Signals:
    """Every series the diagnosis reads, on one shared time grid."""

    job_id: str
    start: float
    end: float
    step: float
    # A condition counts once it has held this long (the alerts' own "for" is 5-10 minutes).
    sustain_seconds: float = 300.0
    ranks: list[RankId] = field(default_factory=list)
    compute: dict[int, Series] = field(default_factory=dict)
    # The raw compute histogram's sum and count per rank, on a grid of ``raw_step`` (the scrape
    # interval where the window allows): the mean of each interval's own steps (a change's first
    # evidence, not a window's mean of it); and when the sample each point reads was scraped
    # (PromQL timestamp()).
    raw_step: float = 15.0
    compute_sum: dict[int, Series] = field(default_factory=dict)
    compute_count: dict[int, Series] = field(default_factory=dict)
    compute_scraped: dict[int, Series] = field(default_factory=dict)
    # Each rank's recent compute share (the fast straggler rule's gauge), on the raw grid; a
    # rank that has none yet (0) left out.
    compute_share: dict[int, Series] = field(default_factory=dict)
    step_time: dict[int, Series] = field(default_factory=dict)
    sync_wait: dict[int, Series] = field(default_factory=dict)
    phases: dict[int, dict[str, Series]] = field(default_factory=dict)
    steps_rate: dict[int, Series] = field(default_factory=dict)
    allocated: dict[int, Series] = field(default_factory=dict)
    reserved: dict[int, Series] = field(default_factory=dict)
    capacity: dict[int, Series] = field(default_factory=dict)
    fragmentation: dict[int, Series] = field(default_factory=dict)
    # The OOM-risk alert's recorded series: 1 - reserved/capacity, and the allocated bytes
    # predicted at the horizon where that reaches capacity (absent where it does not).
    headroom: dict[int, Series] = field(default_factory=dict)
    at_capacity: dict[int, Series] = field(default_factory=dict)
    oom_events: dict[int, Series] = field(default_factory=dict)
    alloc_retries: dict[int, Series] = field(default_factory=dict)
    oldest_inflight: dict[int, Series] = field(default_factory=dict)
    launched: dict[int, Series] = field(default_factory=dict)
    stalls: dict[int, Series] = field(default_factory=dict)
    timeouts: dict[int, Series] = field(default_factory=dict)
    last_step: dict[int, Series] = field(default_factory=dict)
    # torchrun's restart count of each rank's worker group (TORCHELASTIC_RESTART_COUNT).
    elastic_restarts: dict[int, Series] = field(default_factory=dict)
    # The smallest world size the job's ranks report (one series; empty without the gauge): a
    # job that re-formed smaller shows it as soon as one survivor reports, while a gone rank's
    # last (larger) value can linger for Prometheus' lookback.
    world_size: list[Series] = field(default_factory=list)
    laggard: list[Series] = field(default_factory=list)
    stall_threshold: Series | None = None
    grad_sync_p99: Series | None = None
    grad_sync_p999_seconds: float | None = None
    step_p99_seconds: float | None = None
    throttled: list[Series] = field(default_factory=list)
    temperature: list[Series] = field(default_factory=list)
    xid: list[Series] = field(default_factory=list)
    ecc: list[Series] = field(default_factory=list)
    nccl_info: list[Series] = field(default_factory=list)
    gpu_of_rank: dict[int, str] = field(default_factory=dict)

    def node_of(self, rank: int) -> str:
        for r in self.ranks:
            if r.rank == rank:
                return r.node
        return ""

    def ranks_on(self, node: str) -> list[int]:
        return sorted(r.rank for r in self.ranks if r.node == node)

    @property
    def nodes(self) -> list[str]:
        return sorted({r.node for r in self.ranks if r.node})


def _by_rank(series: list[Series]) -> dict[int, Series]:
    out: dict[int, Series] = {}
    for s in series:
        try:
            rank = int(s.label(contract.LABEL_RANK))
        except ValueError:
            continue
        if rank in out:
            # Two series for one rank (a restart on another node): keep both points, in order.
            merged = sorted(out[rank].points + s.points)
            out[rank] = Series({**out[rank].labels, **s.labels}, merged)
        else:
            out[rank] = s
    return out


def _identities(groups: list[list[Series]]) -> list[RankId]:
    seen: dict[int, RankId] = {}
    for series in groups:
        for s in series:
            try:
                rank = int(s.label(contract.LABEL_RANK))
            except ValueError:
                continue
            seen.setdefault(
                rank,
                RankId(rank, s.label(contract.LABEL_NODE), s.label(contract.LABEL_LOCAL_RANK)),
            )
    return sorted(seen.values())


# Prometheus refuses a range query of more than 11,000 points per series.
_MAX_POINTS = 10_000


def grid_step(start: float, end: float, points: int = 360, minimum: float = 15.0) -> float:
    """A query step that gives about ``points`` points, never under ``minimum`` (a scrape
    interval)."""
    return max(minimum, round((end - start) / points))


def collect(
    client: PrometheusClient,
    job_id: str,
    start: float,
    end: float,
    thresholds: Thresholds,
    min_step: float = 15.0,
) -> Signals:
    """Query everything about ``job_id`` in [start, end]; NoDataError when there is nothing.
    ``min_step`` is the finest query step (the scrape interval); ``thresholds`` are those the
    rules were rendered from, whose expressions stand in for a recorded series not yet there."""
    c = contract
    step = grid_step(start, end, minimum=min_step)
    job = f"{c.LABEL_JOB_ID}={promql_string(job_id)}"

    def rng(query: str) -> list[Series]:
        return client.query_range(query, start, end, step)

    def rank_sum(metric: str, how: str = "sum") -> list[Series]:
        return rng(f"{how} by ({RANK_BY}) ({metric}{{{job}}})")

    sig = Signals(job_id=job_id, start=start, end=end, step=step)
    compute = rng(rule_query(c.REC_RANK_COMPUTE_MEAN, job, thresholds))
    step_time = rng(rule_query(c.REC_RANK_STEP_DURATION_MEAN, job, thresholds))
    steps = rank_sum(c.STEPS.name)
    last_step = rank_sum(c.LAST_STEP_TIMESTAMP.name, "max")
    allocated = rank_sum(c.MEMORY_ALLOCATED.name)
    oldest = rank_sum(c.COLLECTIVE_OLDEST_INFLIGHT.name, "max")
    sig.ranks = _identities([compute, step_time, steps, last_step, allocated, oldest])
    if not sig.ranks:
        raise NoDataError(
            f"Prometheus at {client.url} has no trainguard series for job_id={job_id!r} "
            "in the window; check the job id, --since, and that Prometheus scrapes the ranks"
        )
    sig.compute = _by_rank(compute)
    # At the scrape interval unless that asks Prometheus for more points than it answers.
    sig.raw_step = min_step if (end - start) / min_step <= _MAX_POINTS else step

    def raw(query: str) -> dict[int, Series]:
        return _by_rank(client.query_range(query, start, end, sig.raw_step))

    spec = c.STEP_COMPUTE_DURATION
    sig.compute_sum = raw(f"sum by ({RANK_BY}) ({spec.sum_name}{{{job}}})")
    sig.compute_count = raw(f"sum by ({RANK_BY}) ({spec.count_name}{{{job}}})")
    sig.compute_scraped = raw(f"max by ({RANK_BY}) (timestamp({spec.count_name}{{{job}}}))")
    # Past the rank's warm-up only, as TrainingStraggler's fast rule reads it: a rank's first
    # steps after a (re)start are slow (compiling, tuning) and say nothing of its pace.
    sig.compute_share = raw(
        f"max by ({RANK_BY}) ({c.STEP_COMPUTE_SHARE.name}{{{job}}} > 0)\n"
        f"and on ({RANK_BY}) (sum by ({RANK_BY}) ({c.STEPS.name}{{{job}}})"
        f" >= {thresholds.warmup_steps})"
    )
    sig.step_time = _by_rank(step_time)
    sig.last_step = _by_rank(last_step)
    sig.allocated = _by_rank(allocated)
    sig.oldest_inflight = _by_rank(oldest)
    sig.sync_wait = _by_rank(rng(rule_query(c.REC_RANK_SYNC_WAIT_MEAN, job, thresholds)))
    sig.steps_rate = _by_rank(rng(rule_query(c.REC_RANK_STEPS_RATE, job, thresholds)))
    phases: dict[int, dict[str, Series]] = defaultdict(dict)
    for s in rng(rule_query(c.REC_RANK_PHASE_MEAN, job, thresholds)):
        try:
            phases[int(s.label(c.LABEL_RANK))][s.label(c.LABEL_PHASE)] = s
        except ValueError:
            continue
    sig.phases = dict(phases)
    sig.reserved = _by_rank(rank_sum(c.MEMORY_RESERVED.name))
    sig.capacity = _by_rank(rank_sum(c.MEMORY_CAPACITY.name))
    sig.fragmentation = _by_rank(rank_sum(c.MEMORY_FRAGMENTATION.name, "max"))
    sig.headroom = _by_rank(rng(rule_query(c.REC_RANK_MEMORY_HEADROOM, job, thresholds)))
    sig.at_capacity = _by_rank(rng(rule_query(c.REC_RANK_MEMORY_AT_CAPACITY, job, thresholds)))
    sig.elastic_restarts = _by_rank(rank_sum(c.ELASTIC_RESTARTS.name, "max"))
    sig.world_size = rng(f"min({c.WORLD_SIZE.name}{{{job}}})")
    sig.oom_events = _by_rank(rank_sum(c.OOM_EVENTS.name))
    sig.alloc_retries = _by_rank(rank_sum(c.MEMORY_ALLOC_RETRIES.name))
    sig.launched = _by_rank(rank_sum(c.COLLECTIVES_LAUNCHED.name))
    sig.stalls = _by_rank(rank_sum(c.COLLECTIVE_STALLS.name))
    sig.timeouts = _by_rank(rank_sum(c.COLLECTIVE_TIMEOUTS.name))
    sig.laggard = rng(rule_query(c.REC_JOB_COLLECTIVE_LAGGARD, job, thresholds))
    threshold = rng(f"{c.REC_JOB_STALL_THRESHOLD}{{{job}}}")
    sig.stall_threshold = threshold[0] if threshold else None
    p99 = rng(rule_query(c.REC_JOB_GRAD_SYNC_P99, job, thresholds))
    sig.grad_sync_p99 = p99[0] if p99 else None
    window = f"{max(int(end - start), 60)}s"
    sig.grad_sync_p999_seconds = _instant(
        client,
        f"histogram_quantile(0.999, sum by (le) "
        f"(increase({c.GRAD_SYNC_DURATION.name}_bucket{{{job}}}[{window}])))",
        end,
    )
    sig.step_p99_seconds = _instant(
        client,
        f"histogram_quantile(0.99, sum by (le) "
        f"(increase({c.STEP_DURATION.name}_bucket{{{job}}}[{window}])))",
        end,
    )
    _collect_gpus(
        sig, rng(f"max by ({c.LABEL_RANK}, {c.LABEL_GPU}) ({c.GPU_PROCESS_INFO.name}{{{job}}})")
    )
    _collect_nodes(sig, rng)
    return sig


def _collect_gpus(sig: Signals, process_info: list[Series]) -> None:
    """Which GPU each rank ran on: the exporter's process info, else its local rank."""
    c = contract
    for s in process_info:
        if s.label(c.LABEL_RANK).isdigit() and s.label(c.LABEL_GPU):
            sig.gpu_of_rank[int(s.label(c.LABEL_RANK))] = s.label(c.LABEL_GPU)
    for r in sig.ranks:
        if r.rank not in sig.gpu_of_rank and r.local_rank:
            # torchrun runs one rank per GPU, local rank N on GPU N, unless told otherwise.
            sig.gpu_of_rank[r.rank] = r.local_rank


def _collect_nodes(sig: Signals, rng: Callable[[str], list[Series]]) -> None:
    c = contract
    nodes = [n for n in sig.nodes if "`" not in n]
    if not nodes:
        return
    node = f"{c.LABEL_NODE}=~`{'|'.join(re.escape(n) for n in nodes)}`"
    gpu = f"{c.LABEL_NODE}, {c.LABEL_GPU}"
    sig.throttled = rng(
        f"max by ({gpu}, {c.LABEL_REASON}) ({c.GPU_CLOCK_THROTTLED.name}{{{node}}})"
    )
    sig.temperature = rng(f"max by ({gpu}) ({c.GPU_TEMPERATURE.name}{{{node}}})")
    sig.xid = rng(f"sum by ({gpu}, {c.LABEL_XID}) ({c.GPU_XID_ERRORS.name}{{{node}}})")
    sig.ecc = rng(f"sum by ({gpu}, {c.LABEL_KIND}) ({c.GPU_ECC_ERRORS.name}{{{node}}})")
    sig.nccl_info = rng(
        f"max by ({c.LABEL_NODE}, {c.LABEL_TRANSPORT}) ({c.NCCL_INFO.name}{{{node}}})"
    )


def _instant(client: PrometheusClient, query: str, at: float) -> float | None:
    result = client.query(query, at)
    if not result:
        return None
    value = result[0].last()
    return value if value is not None and value == value and value != float("inf") else None


def increments(series: Series) -> list[tuple[float, float]]:
    """(time, amount) of every increase of a counter series; a reset counts its new value."""
    out = []
    previous: float | None = None
    for t, v in series.points:
        if v != v:
            continue
        if previous is not None:
            if v > previous:
                out.append((t, v - previous))
            elif v < previous and v > 0:
                out.append((t, v))
        previous = v
    return out
