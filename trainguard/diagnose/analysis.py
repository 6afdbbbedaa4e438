"""From signals and evidence to symptoms, scope and ranked root-cause candidates.

Each failure has its own analysis, a function of one :class:`~trainguard.diagnose.context.Context`
(``contract.FAILURES[...].diagnose_analysis`` names it), looking at that failure the way an
on-call engineer would: GPU faults by Xid and ECC counters (:mod:`~trainguard.diagnose.gpu`);
hangs by the oldest in-flight collective, the collective counts, and torch's Flight Recorder
analyzer over the dumps (:mod:`~trainguard.diagnose.hang`); OOMs by the memory curve before
the error, and the risk of one by the headroom left (:mod:`~trainguard.diagnose.oom`); a rank
that died by the torchrun agents' lines joined with the ranks' pids
(:mod:`~trainguard.diagnose.rank_failure`); stragglers by compute time against the job median,
then the slow phase and what the GPUs of the same node did at the same time
(:mod:`~trainguard.diagnose.straggler`); data-bound ranks, whole-job slowdowns and GPU
throttling no straggler explains. Thresholds come from the rules' ``thresholds.yml`` so the
report and the alerts agree on what "slow" means.
"""

from __future__ import annotations

from collections.abc import Callable

from trainguard.diagnose import dataloader, gpu, hang, oom, rank_failure, slowdown, straggler
from trainguard.diagnose.context import Context
from trainguard.diagnose.evidence import LogEvidence, StallDump
from trainguard.diagnose.model import Report
from trainguard.diagnose.signals import Signals
from trainguard.thresholds import Thresholds

# In this order: a later analysis reads what an earlier one found (a rank's death that an
# OOM, an Xid or a hang explains is their consequence; the straggler analysis lowers its
# confidence on a node with an Xid; the data-loader analysis leaves the worst straggler to the
# straggler analysis; throttling alone is what no straggler explains).
ANALYSES: tuple[Callable[[Context], None], ...] = (
    gpu.analyse_faults,
    hang.analyse,
    oom.analyse,
    rank_failure.analyse,
    straggler.analyse,
    dataloader.analyse,
    slowdown.analyse,
    gpu.analyse_throttling,
)


def run(
    sig: Signals,
    logs: LogEvidence | None,
    dumps: list[StallDump],
    report: Report,
    thresholds: Thresholds | None = None,
    repairs: list[tuple[float, str]] | None = None,
) -> Context:
    """Run every analysis over one job and order the report: most severe symptom first, most
    likely candidate first, the scope of the most severe symptom. ``thresholds``: the rules'
    (default the shipped ones); ``repairs``: (when, action) of the remediation service's."""
    ctx = Context(sig, report, logs or LogEvidence(), dumps, repairs=repairs or [])
    if thresholds is not None:
        ctx.thresholds = thresholds
    for analyse in ANALYSES:
        analyse(ctx)
    report.symptoms.sort(key=lambda s: -s.severity)
    report.candidates.sort(key=lambda c: -c.confidence)
    if ctx.scopes:
        report.scope = max(ctx.scopes, key=lambda item: item[0])[1]
    return ctx
