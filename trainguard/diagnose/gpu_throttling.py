"""GPU throttling: clocks held down for a harmful reason (the thresholds' own list), sustained.
A throttled GPU whose ranks straggle is the straggler analysis' cause; this analysis reports the
throttling no straggler explains (its ranks not yet measurably slower)."""

from __future__ import annotations

from dataclasses import dataclass

from trainguard import contract
from trainguard.contract import Cause, Failure
from trainguard.diagnose.analysis import explains
from trainguard.diagnose.context import Context, runs, utc
from trainguard.diagnose.model import Candidate, Scope, ScopeLevel, Symptom
from trainguard.diagnose.signals import harmful_throttle_reason


@dataclass
class Window:
    """A GPU's clocks held down for ``what`` (a throttle reason) from ``since`` to ``until``."""

    node: str
    gpu: str
    what: str
    since: float
    until: float


def throttling(ctx: Context) -> list[Window]:
    """Sustained throttling of any GPU of the job's nodes, for a harmful reason."""
    out = []
    for s in ctx.sig.throttled:
        reason = s.label(contract.LABEL_REASON)
        if not harmful_throttle_reason(reason, ctx.thresholds):
            continue
        run = runs([(t, v >= 1) for t, v in s.points], ctx.min_points)
        if run is not None:
            out.append(
                Window(s.label(contract.LABEL_NODE), s.label(contract.LABEL_GPU), reason, *run)
            )
    return out


def max_temperature(ctx: Context, node: str, gpu: str) -> float | None:
    values = [
        v
        for s in ctx.sig.temperature
        if s.label(contract.LABEL_NODE) == node and s.label(contract.LABEL_GPU) == gpu
        for v in s.values()
    ]
    return max(values) if values else None


@explains(Failure.GPU_THROTTLING, after=(Failure.STRAGGLER,))
def analyse(ctx: Context) -> None:
    """GPU throttling that no straggler explains already (its ranks are not measurably slow)."""
    if ctx.has_cause(Cause.GPU_THROTTLING):
        return
    for window in throttling(ctx):
        ranks = ctx.ranks_on_gpu(window.node, window.gpu)
        ctx.symptom(
            Symptom(
                Failure.GPU_THROTTLING,
                f"GPU {window.gpu} of node {window.node} throttled ({window.what})",
                [contract.GPU_CLOCK_THROTTLED.name],
                window.since,
                ranks,
                [window.node],
                1,
            ),
            Scope(
                ScopeLevel.NODE,
                f"GPU {window.gpu} of node {window.node}",
                ranks,
                [window.node],
                [window.gpu],
            ),
        )
        ctx.candidate(
            Candidate(
                Cause.GPU_THROTTLING,
                f"GPU {window.gpu} of node {window.node} held its clocks down "
                f"({window.what}); its ranks are not (yet) measurably slower",
                0.4,
                [f"{window.what} from {utc(window.since)} to {utc(window.until)}"],
                [f"Check node {window.node}'s cooling and power capping."],
                ["Keep the GpuThermalThrottling alert routed to the cluster team."],
                {"node": window.node, "gpu": window.gpu},
            )
        )
