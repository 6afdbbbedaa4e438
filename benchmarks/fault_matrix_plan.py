"""What the fault matrix runs: its runs (a fault kind of ``trainguard.demo.faults`` at one
factor, on a rank at a time, seeded, or a healthy job), the settings they run at, and what each
should set off."""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from trainguard import contract
from trainguard.contract import Action, Alert, Failure
from trainguard.demo.config import DemoConfig
from trainguard.demo.faults import FaultKind, fault_kinds
from trainguard.demo.stack import DEMO_THRESHOLDS, demo_policy

JOB_PREFIX = "fm-"


STEP_SECONDS = 0.1


DATA_SECONDS = 0.01


# The healthy noise of every run (trainguard.demo.noise): the matrix's fast settings were set
# on +-10% compute jitter per rank and step (a standard deviation of 5.8%), so they keep that
# alone; the compute is a sleep (no matmul share), as those settings were measured with.
NOISE = "sigma=0.058,outlier_every=0,skewed_rank=none,batch_cv=0,gc_every=0"
COMPUTE_SHARE = 0.0


# A fault fires this long after its job's first step (uniform, seeded): past the warm-up and
# with a full rate window of healthy steps behind it.
FAULT_AFTER = (12.0, 20.0)


# How long a healthy run trains; faulty runs train until their incident closes.
HEALTHY_SECONDS = 60.0


# After the fault: the longest a run waits for detection and the service's verdict.
RUN_DEADLINE_SECONDS = 150.0


# Jobs start at least this far apart.
START_SPACING_SECONDS = 8.0


# A run that has not started training by then failed to start.
START_DEADLINE_SECONDS = 90.0


# Each rank's memory capacity (the hook's TRAINGUARD_MEMORY_CAPACITY_BYTES): a demo rank holds
# some 300-400 MB, so a creeping one nears capacity within seconds.
RANK_MEMORY_CAPACITY = 1 << 30


# What the matrix's alert settings are, on its last line: the demo's fast settings with
# THRESHOLDS on top ("fast"), not the shipped thresholds.yml and default policy ("shipped").
SETTINGS = "fast"


# The matrix's alert settings on top of the demo's (see docs/fault-matrix.md for why).
THRESHOLDS: dict[str, Any] = {
    # 1.2x compute reads about 1.17x of the step compute (the fixed cost of a step is not
    # slowed), and the healthy noise averages out over the rate window: 1.1 separates them.
    "straggler_factor": 1.1,
    "stalled_seconds": 15,
    "stalled_for": "0s",
    "oom_risk_predict_window": "20s",
    "oom_risk_predict_horizon_seconds": 120,
    "oom_risk_for": "0s",
    "dataloader_for": "20s",
}


# Seconds an alert waits by configuration from the fault to firing, per alert: the windows and
# `for` durations of THRESHOLDS/DEMO_THRESHOLDS; p95 time to detect is held to 2x this.
SCRAPE_AND_EVAL_SECONDS = 4.0


RESTART_SECONDS = 10.0


# The alerts the matrix policy repairs (the others only recommend, or nothing).
ACTED_ON = (
    Alert.TRAINING_STRAGGLER,
    Alert.TRAINING_COLLECTIVE_STALLED,
    Alert.TRAINING_NCCL_TIMEOUT,
    Alert.TRAINING_OOM,
    Alert.TRAINING_STALLED,
    Alert.TRAINING_RANK_DOWN,
    Alert.TRAINING_OOM_RISK,
)


def _seconds(duration: str | float | int) -> float:
    if isinstance(duration, (int, float)):
        return float(duration)
    units = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}
    for unit in ("ms", "s", "m", "h"):
        if duration.endswith(unit):
            return float(duration[: -len(unit)]) * units[unit]
    return float(duration)


def configured_delay(alert: Alert) -> float:
    """How long ``alert`` waits by configuration before it can fire, plus a scrape and an
    evaluation: the "configured threshold" the matrix holds p95 time to detect to (2x)."""
    t = {**DEMO_THRESHOLDS, **THRESHOLDS}
    by_alert = {
        Alert.TRAINING_STRAGGLER: _seconds(t["rate_window"]) + _seconds(t["straggler_for"]),
        Alert.TRAINING_COLLECTIVE_STALLED: _seconds(t["collective_stall_floor_seconds"])
        + _seconds(t["collective_stall_for"]),
        Alert.TRAINING_STALLED: _seconds(t["stalled_seconds"]) + _seconds(t["stalled_for"]),
        Alert.TRAINING_RANK_DOWN: _seconds(t["rank_down_for"]),
        # A restarted rank reports its new count once it has started again (imports, the
        # rendezvous, the process group): allow the demo's 10 s for that.
        Alert.TRAINING_RANK_RESTARTED: RESTART_SECONDS,
        Alert.TRAINING_OOM: 0.0,
        Alert.TRAINING_OOM_RISK: _seconds(t["oom_risk_predict_window"]) / 2
        + _seconds(t["oom_risk_for"]),
        Alert.TRAINING_NCCL_TIMEOUT: 0.0,
        Alert.TRAINING_DATALOADER_BOUND: _seconds(t["rate_window"]) + _seconds(t["dataloader_for"]),
    }
    return by_alert.get(alert, 0.0) + SCRAPE_AND_EVAL_SECONDS


@dataclass(frozen=True)
class FaultSpec:
    """One run kind of the matrix: a fault kind at one factor, and what should catch it."""

    name: str
    kind: FaultKind
    factor: float

    @property
    def failure(self) -> Failure:
        return self.kind.failure

    @property
    def alerts(self) -> tuple[Alert, ...]:
        return self.kind.alerts

    @property
    def threshold_s(self) -> float:
        return min(configured_delay(a) for a in self.alerts)


CATALOGUE: tuple[FaultSpec, ...] = tuple(
    FaultSpec(name, kind, factor) for kind in fault_kinds() for name, factor in kind.matrix_runs()
)


HEALTHY = "healthy"
# The drill's three faults (`make demo`'s plan), run this many times in the quick matrix: a
# repair that worked must never be followed by an escalation or a page, on any run.
DRILL_KINDS = ("straggler_1.5x", "hang", "oom")
QUICK_DRILL_RUNS = 3


def matrix_policy(cfg: DemoConfig) -> dict[str, Any]:
    """The demo's policy for every matrix job, plus repairs for the failures only it injects."""
    policy = demo_policy(cfg, jobs=f'{contract.LABEL_JOB_ID}=~"{JOB_PREFIX}.+"')
    matchers = policy["rules"][0]["matchers"]
    restart = {"action": Action.RESTART_FROM_CHECKPOINT.value}
    page = {"action": Action.PAGE.value}
    for alert in ACTED_ON[4:]:
        policy["rules"].append(
            {
                "alert": alert.value,
                "matchers": matchers,
                "actions": [restart],
                "verify_seconds": 60.0,
                "escalate": [page],
            }
        )
    return policy


@dataclass
class RunPlan:
    index: int
    fault: str  # a FaultSpec name, or HEALTHY
    rank: int
    at_s: float
    seed: int

    @property
    def job_id(self) -> str:
        return f"{JOB_PREFIX}{self.index:03d}-{self.fault.replace('.', '')}"


# The ranks of every matrix job (2 nodes x 2): rank-hours are its trained hours times this.
WORLD_SIZE = 4


@dataclass(frozen=True)
class FiredAlert:
    """One alert series that fired for a run's job: its name, where it points, when it first
    fired (Unix seconds)."""

    name: str
    first: float
    rank: int | None = None
    node: str | None = None

    def __str__(self) -> str:
        where = "" if self.rank is None else f" rank {self.rank}"
        where += "" if self.node is None else f" {self.node}"
        return self.name + where


@dataclass(frozen=True)
class Verdict:
    """How a run's alerts read against its fault: the first right alert, and the rest."""

    detect_at: float | None
    false_alerts: tuple[FiredAlert, ...]


def judge(
    spec: FaultSpec | None,
    injected: tuple[float, int, str] | None,
    alerts: Sequence[FiredAlert],
    repaired_at: float | None,
) -> Verdict:
    """Detection is an alert of the fault's that fired after the injection and points where
    the fault was (the injected rank, else its node, where the alert names one): a late or
    misplaced alert is a miss. Every other alert is false, of any name, on any run, unless it
    first fired after the service repaired the job (a restart, an excluded node's absence: the
    repair's doing, not a failure the fault left unexplained). ``injected`` is (when, rank,
    node)."""
    hits: list[float] = []
    false: list[FiredAlert] = []
    for alert in alerts:
        if repaired_at is not None and alert.first >= repaired_at:
            continue
        right = (
            spec is not None
            and injected is not None
            and alert.name in {a.value for a in spec.alerts}
            and alert.first >= injected[0]
            and (alert.rank is None or alert.rank == injected[1])
            and (alert.rank is not None or alert.node is None or alert.node == injected[2])
        )
        if right:
            hits.append(alert.first)
        else:
            false.append(alert)
    return Verdict(min(hits, default=None), tuple(false))


@dataclass
class RunResult:
    plan: RunPlan
    started: bool = False
    error: str | None = None
    injected_at: float | None = None
    injected_node: str | None = None
    trained_seconds: float = 0.0
    detected: bool = False
    detect_s: float | None = None
    # Each alert that fired ("name rank r node"), seconds from the job's start to its first firing.
    alerts: dict[str, float] = field(default_factory=dict)
    false_alerts: list[str] = field(default_factory=list)
    cause: str | None = None
    cause_rank: int | None = None
    diagnosis: list[str] = field(default_factory=list)  # its symptoms, most severe first
    root_cause_right: bool = False
    action: str | None = None
    outcome: str | None = None
    recover_s: float | None = None
    # Over the job's incidents: the rungs the service climbed past the first, and its pages.
    escalations: int = 0
    pages: int = 0


def plan_runs(
    seed: int, repeats: int, healthy: int, more: Mapping[str, int] | None = None
) -> list[RunPlan]:
    """Every fault kind ``repeats`` times (and those of ``more`` that many times more) and
    ``healthy`` healthy runs, shuffled, seeded."""
    rng = random.Random(seed)
    extra = more or {}
    kinds = [spec.name for spec in CATALOGUE for _ in range(repeats + extra.get(spec.name, 0))] + [
        HEALTHY
    ] * healthy
    rng.shuffle(kinds)
    return [
        RunPlan(
            i, kind, rng.randrange(4), round(rng.uniform(*FAULT_AFTER), 1), rng.randrange(1 << 30)
        )
        for i, kind in enumerate(kinds)
    ]


def acts_on(spec: FaultSpec) -> bool:
    """Whether the matrix policy repairs this fault (else its run ends once it is detected)."""
    return any(alert in ACTED_ON for alert in spec.alerts)


def spec_named(name: str) -> FaultSpec | None:
    return next((s for s in CATALOGUE if s.name == name), None)
