"""Prevent: for each root cause the report found, the configuration that avoids it next time.

Each cause (``contract.Cause``) may have a rule, registered with :func:`prevents` in the module
of the failure whose analysis names it, that turns the report's facts into concrete settings
(an environment variable, an argument of the training script, a launcher or scheduler option),
each with the evidence it rests on: a value is computed from what was observed (the
allocator's free share before the OOM, the step's peak against the GPU's capacity, the
gradient-sync tail, the data wait against the step, the time a restart cost) wherever the
report has it. The candidate's own ``prevention`` advice follows as practices: the analyses
keep there only what no setting expresses, so nothing is said twice. A setting two causes
share is listed once, under the first, with the evidence of both. Every cause whose failure
restarted the job also gets a checkpoint interval sized from what the restart cost.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable
from dataclasses import dataclass

from trainguard.contract import FAILURES, Action, Cause, EventKind, Failure
from trainguard.diagnose.analysis import ANALYSES
from trainguard.diagnose.context import Context, job_median
from trainguard.diagnose.model import Candidate, IncidentRecord, Prevention, Setting

Rule = Callable[[Context, Candidate], list[Setting]]

ENV = "every rank's environment"
SCRIPT = "the training script"
SCHEDULER = (
    "the scheduler's node health check: Slurm HealthCheckProgram, Kubernetes node-problem-detector"
)
# A checkpoint interval is never advised below this: saving has a cost of its own.
MIN_CHECKPOINT_SECONDS = 60.0


@dataclass(frozen=True)
class Prevents:
    """A cause's rule, and the failure its prevention answers (``None``: nothing failed, as in
    a restart the service's own repair explains)."""

    rule: Rule
    answers: Callable[[Context], Failure | None]


PREVENTIONS: dict[Cause, Prevents] = {}


def prevents(
    *causes: Cause, answers: Callable[[Context], Failure | None] | None = None
) -> Callable[[Rule], Rule]:
    """Decorator: the rule's settings prevent ``causes``; the prevention answers each cause's
    own failure unless ``answers`` says which, from the report."""

    def register(rule: Rule) -> Rule:
        for cause in causes:
            if cause in PREVENTIONS:
                raise ValueError(f"{cause.value} has a prevention rule already")
            PREVENTIONS[cause] = Prevents(rule, answers or _own(cause.failure))
        return rule

    return register


def _own(failure: Failure) -> Callable[[Context], Failure | None]:
    def answers(ctx: Context) -> Failure | None:
        return failure

    return answers


def nothing(ctx: Context, c: Candidate) -> list[Setting]:
    """The rule of a cause no setting prevents."""
    return []


def elastic_minimum(ctx: Context, nodes: list[str], why: str) -> Setting:
    """torchrun's node range with a minimum below the job's size: what lets ``exclude_node``
    continue without a bad node."""
    count = len(ctx.sig.nodes)
    return Setting(
        "torchrun --nnodes",
        f"{max(1, count - 1)}:{count}" if count > 1 else "MIN:MAX with MIN below the job's size",
        "the launcher",
        [
            f"{why} on {', '.join(nodes) or 'one node'}; the job ran on {count} node(s): an "
            "elastic minimum below that lets exclude_node continue without it"
        ],
    )


def plan(ctx: Context) -> None:
    """``ctx.report.prevention``: one entry per candidate, in the candidates' order."""
    FAILURES.implementations(ANALYSES)  # the failures' modules, where the rules register
    seen: dict[tuple[str, str], Setting] = {}
    for candidate in ctx.report.candidates:
        entry = PREVENTIONS.get(candidate.cause)
        rule, failure = (
            (entry.rule, entry.answers(ctx)) if entry else (nothing, candidate.cause.failure)
        )
        settings = []
        for setting in rule(ctx, candidate) + _checkpointing(ctx, failure):
            first = seen.get((setting.name, setting.value))
            if first is None:
                seen[(setting.name, setting.value)] = setting
                settings.append(setting)
            else:
                first.evidence += [e for e in setting.evidence if e not in first.evidence]
        ctx.report.prevention.append(
            Prevention(candidate.cause, failure, candidate.summary, settings, candidate.prevention)
        )


# --- checkpointing, from what a restart cost -------------------------------------------------
def _checkpointing(ctx: Context, failure: Failure | None) -> list[Setting]:
    """A checkpoint interval from the time a restart of this failure lost: recomputing the
    steps since the last checkpoint should cost no more than the restart itself."""
    validation = ctx.report.validation
    if failure is None or validation is None:
        return []
    same = {failure, *FAILURES[failure].same_fault_as}
    restarts = [
        i
        for i in validation.incidents
        if i.failure in same
        and i.acted_at is not None
        and i.recovered_at is not None
        and any(t.action == Action.RESTART_FROM_CHECKPOINT.value for t in i.tried)
    ]
    step = _step_seconds(ctx)
    if not restarts or step is None:
        return []
    incident = restarts[-1]
    return [_interval(ctx, incident, step)]


def _interval(ctx: Context, incident: IncidentRecord, step: float) -> Setting:
    assert incident.acted_at is not None and incident.recovered_at is not None
    lost = incident.recovered_at - incident.acted_at
    evidence = [
        f"incident {incident.id}: the restart from checkpoint took {lost:.0f} s from the action "
        f"to training passing step {incident.baseline_step} again (its step before the failure)"
        if incident.baseline_step is not None
        else f"incident {incident.id}: {lost:.0f} s from the restart to verified recovery"
    ]
    saved = [
        e.step
        for e in ctx.events(EventKind.CHECKPOINT.value)
        if e.step is not None
        and (incident.baseline_step is None or e.step <= incident.baseline_step)
    ]
    if saved and incident.baseline_step is not None:
        redone = incident.baseline_step - max(saved)
        overhead = max(MIN_CHECKPOINT_SECONDS, lost - redone * step)
        evidence.append(
            f"the last checkpoint was of step {max(saved)}: {redone} steps "
            f"({redone * step:.0f} s at {step:.3g} s per step) were computed again; the rest, "
            f"{lost - redone * step:.0f} s, is the restart itself"
        )
    else:
        overhead = max(MIN_CHECKPOINT_SECONDS, lost / 2)
        evidence.append(
            "no checkpoint event in the logs (Instrumentation.record_checkpoint) says which "
            f"share was recomputation; at most half of it ({overhead:.0f} s) is advised"
        )
    every = max(1, math.floor(overhead / step))
    evidence.append(
        f"every {every} steps x {step:.3g} s (the job's median step time) = "
        f"{every * step / 60:.1f} min of recomputation at most per restart"
    )
    return Setting("checkpoint interval", f"every {every} steps", SCRIPT, evidence)


def _step_seconds(ctx: Context) -> float | None:
    median = job_median(ctx.sig.step_time, 1)
    return statistics.median(median.values()) if median else None
