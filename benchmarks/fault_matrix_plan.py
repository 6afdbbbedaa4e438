"""What the fault matrix runs: its runs (a fault kind of ``trainguard.demo.faults`` at one
factor, on a rank at a time, seeded, or a healthy job), the settings they run at, and what each
should set off."""

from __future__ import annotations

import functools
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from benchmarks.scale_config import shipped_config
from trainguard import contract
from trainguard.contract import Action, Alert, Failure
from trainguard.demo.config import NODES, DemoConfig
from trainguard.demo.faults import FaultKind, fault_kinds
from trainguard.demo.stack import DEMO_PACE, Pace, demo_policy, demo_thresholds
from trainguard.remediation.policy import Policy, default_policy_text, parse_policy
from trainguard.thresholds import Thresholds, duration_seconds

JOB_PREFIX = "fm-"


STEP_SECONDS = 0.1


DATA_SECONDS = 0.01


# The healthy noise of every run (trainguard.demo.noise). At the shipped defaults: the whole
# model (heavy-tailed steps, a rank 4% slower all run, batch-dependent cost, whole-job pauses)
# with a noisy neighbour on the second node. At the fast settings, which were set on +-10%
# compute jitter per rank and step (a standard deviation of 5.8%), that jitter alone.
SHIPPED_NOISE = f"neighbour_node={NODES[1]}"
FAST_NOISE = "sigma=0.058,outlier_every=0,skewed_rank=none,batch_cv=0,gc_every=0"
# The compute is a sleep (no matmul share): sixteen ranks of four jobs on two cores would
# contend for arithmetic as ranks with a GPU each do not (docs/fault-matrix.md).
COMPUTE_SHARE = 0.0


# A fault fires this long after its job's first step (uniform, seeded): past the warm-up and
# with a full rate window of healthy steps behind it.
FAULT_AFTER = (12.0, 20.0)


# Jobs start at least this far apart.
START_SPACING_SECONDS = 8.0


# A run that has not started training by then failed to start.
START_DEADLINE_SECONDS = 90.0


# Each rank's memory capacity (the hook's TRAINGUARD_MEMORY_CAPACITY_BYTES): a demo rank holds
# some 300-400 MB, so a creeping one nears capacity within seconds.
RANK_MEMORY_CAPACITY = 1 << 30


# The fast matrix's alert settings on top of the demo's (see docs/fault-matrix.md for why).
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
# `for` durations of the fast settings; their p95 time to detect is held to 2x this.
SCRAPE_AND_EVAL_SECONDS = 4.0


RESTART_SECONDS = 10.0


# The alerts the fast matrix's policy repairs beyond the demo's (which only recommend, or
# nothing, in the demo's policy).
MATRIX_REPAIRS = (
    Alert.TRAINING_STALLED,
    Alert.TRAINING_RANK_DOWN,
    Alert.TRAINING_OOM_RISK,
)


# At the shipped defaults, p95 time to detect is held to issue 33's targets: an OOM within
# 15 s, a dead rank within 30 s, a straggler, a hang or slow communication within 60 s.
SHIPPED_DETECT_TARGET_SECONDS: dict[Alert, float] = {
    Alert.TRAINING_OOM: 15.0,
    Alert.TRAINING_RANK_RESTARTED: 30.0,
    Alert.TRAINING_RANK_DOWN: 30.0,
}
DEFAULT_DETECT_TARGET_SECONDS = 60.0


def shipped_detect_target(alert: Alert, t: Thresholds) -> float:
    """Issue 33's target for ``alert``; a predicted OOM, for which it sets none, is held to
    its own ``for`` (the prediction must last that long before it is worth acting on) plus
    the 60 s every other alert gets."""
    if alert is Alert.TRAINING_OOM_RISK:
        return _seconds(t.oom_risk_for) + DEFAULT_DETECT_TARGET_SECONDS
    return SHIPPED_DETECT_TARGET_SECONDS.get(alert, DEFAULT_DETECT_TARGET_SECONDS)


def _seconds(value: str | float) -> float:
    """A threshold in seconds: a number of seconds, or a Prometheus duration (``20s``)."""
    return float(value) if isinstance(value, (int, float)) else duration_seconds(value)


def configured_delay(alert: Alert, t: Thresholds) -> float:
    """How long ``alert`` waits by configuration before it can fire, plus a scrape and an
    evaluation: the "configured threshold" the fast matrix holds p95 time to detect to (2x)."""
    by_alert = {
        Alert.TRAINING_STRAGGLER: _seconds(t.rate_window) + _seconds(t.straggler_for),
        Alert.TRAINING_COLLECTIVE_STALLED: _seconds(t.collective_stall_floor_seconds)
        + _seconds(t.collective_stall_for),
        Alert.TRAINING_STALLED: _seconds(t.stalled_seconds) + _seconds(t.stalled_for),
        Alert.TRAINING_RANK_DOWN: _seconds(t.rank_down_for),
        # A restarted rank reports its new count once it has started again (imports, the
        # rendezvous, the process group): allow the demo's 10 s for that.
        Alert.TRAINING_RANK_RESTARTED: RESTART_SECONDS,
        Alert.TRAINING_OOM: 0.0,
        Alert.TRAINING_OOM_RISK: _seconds(t.oom_risk_predict_window) / 2 + _seconds(t.oom_risk_for),
        Alert.TRAINING_NCCL_TIMEOUT: 0.0,
        Alert.TRAINING_DATALOADER_BOUND: _seconds(t.rate_window) + _seconds(t.dataloader_for),
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
    for alert in MATRIX_REPAIRS:
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


@dataclass(frozen=True)
class Settings:
    """What a matrix runs at, named on its last line (``defaults=``).

    ``shipped`` (what is scored): ``thresholds.yml`` and ``default_policy.yaml`` as shipped,
    ``deploy/prometheus.yml``'s scrape and evaluation intervals, the hook's and the service's
    defaults. ``fast`` (the quick matrix of ``make test``): the demo's pace (2 s scrapes,
    windows of seconds) with :data:`THRESHOLDS` over it and :func:`matrix_policy`."""

    name: str
    pace: Pace
    thresholds: Mapping[str, Any]  # over the pace's
    shipped_policy: bool
    # How long a healthy run trains; faulty runs train until their incident closes.
    healthy_seconds: float
    # After the fault: the longest a run waits for detection and the service's verdict.
    run_deadline_seconds: float
    noise: str  # the trainer's --noise
    # How long a condition must hold for `trainguard diagnose` to count it: its default at the
    # shipped settings, seconds at the fast ones (the demo's faults last seconds).
    diagnose_sustain_seconds: float

    def policy(self, cfg: DemoConfig) -> dict[str, Any]:
        if self.shipped_policy:
            document: dict[str, Any] = yaml.safe_load(default_policy_text())
            return document
        return matrix_policy(cfg)

    @functools.cached_property
    def rule_thresholds(self) -> Thresholds:
        """Every threshold the rules are rendered from, and diagnose judges by: the shipped
        ones with the pace's and these settings' over them (read once)."""
        return demo_thresholds(self.thresholds, self.pace)

    @functools.cached_property
    def _parsed_policy(self) -> Policy:
        """The policy as the service reads it (which rules match a matrix job does not depend
        on the demo's paths)."""
        return parse_policy(yaml.safe_dump(self.policy(DemoConfig(Path()))))

    def acts_on(self, spec: FaultSpec) -> bool:
        """Whether the policy repairs this fault (else its run ends once it is detected)."""
        labels = {contract.LABEL_JOB_ID: f"{JOB_PREFIX}000"}
        rules = (self._parsed_policy.plan(alert.value, labels) for alert in spec.alerts)
        return any(rule is not None and rule.opens_incidents for rule in rules)

    def detect_bound_s(self, spec: FaultSpec) -> float:
        """What p95 time to detect is held to: issue 33's targets at the shipped defaults, 2x
        the alert's configured delay at the fast ones."""
        thresholds = self.rule_thresholds
        if self.name == SHIPPED:
            return min(shipped_detect_target(a, thresholds) for a in spec.alerts)
        return 2 * min(configured_delay(a, thresholds) for a in spec.alerts)


SHIPPED = "shipped"
FAST = "fast"


def shipped_pace(config: Mapping[str, Any] | None = None) -> Pace:
    """The shipped pace: the scrape and evaluation intervals of ``deploy/prometheus.yml`` (or
    ``config``; its global ones, and its rank job's), every threshold, floor and timer at its
    default."""
    document = shipped_config() if config is None else config
    overall = document["global"]
    jobs = document["scrape_configs"]
    ranks = next(j for j in jobs if j["job_name"] == contract.SCRAPE_JOB_RANKS)
    return Pace(
        name=SHIPPED,
        scrape_seconds=duration_seconds(overall["scrape_interval"]),
        rank_scrape_seconds=duration_seconds(
            ranks.get("scrape_interval", overall["scrape_interval"])
        ),
        evaluation_seconds=duration_seconds(overall["evaluation_interval"]),
    )


def settings_named(name: str) -> Settings:
    if name == SHIPPED:
        # A straggler is excluded 900 s after it is found (the default policy), then the job
        # re-forms and must step for a minute (verify_progress_seconds): 1,500 s covers it.
        return Settings(SHIPPED, shipped_pace(), {}, True, 300.0, 1500.0, SHIPPED_NOISE, 300.0)
    if name == FAST:
        # diagnose holds a condition no longer than the straggler rule's `for`: the fast
        # policy excludes a straggler as its alert fires, and the job as it was (what diagnose
        # judges) ends there, sometimes 8 s after the ratio first crossed the factor.
        sustain = duration_seconds(demo_thresholds(THRESHOLDS, DEMO_PACE).straggler_for)
        return Settings(FAST, DEMO_PACE, THRESHOLDS, False, 60.0, 150.0, FAST_NOISE, sustain)
    raise ValueError(f"unknown settings {name!r}: {SHIPPED} or {FAST}")


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
    is one the fault also explains (``FaultKind.also_explains``), fired after the injection
    where the fault was, or first fired after the service repaired the job (a restart, an
    excluded node's absence: the repair's doing, not a failure the fault left unexplained).
    ``injected`` is (when, rank, node)."""
    catches = set() if spec is None else {a.value for a in spec.alerts}
    explains = set() if spec is None else {a.value for a in spec.kind.also_explains}
    hits: list[float] = []
    false: list[FiredAlert] = []
    for alert in alerts:
        if repaired_at is not None and alert.first >= repaired_at:
            continue
        there = (
            injected is not None
            and alert.first >= injected[0]
            and (alert.rank is None or alert.rank == injected[1])
            and (alert.rank is not None or alert.node is None or alert.node == injected[2])
        )
        if there and alert.name in catches:
            hits.append(alert.first)
        elif not (there and alert.name in explains):
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


def spec_named(name: str) -> FaultSpec | None:
    return next((s for s in CATALOGUE if s.name == name), None)
