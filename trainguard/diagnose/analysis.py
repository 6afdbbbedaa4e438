"""From signals and evidence to symptoms, scope and ranked root-cause candidates.

Each failure has its own analysis, a function of one :class:`~trainguard.diagnose.context.Context`
in the module named after the failure, registered with :func:`explains`. It looks at that
failure the way an on-call engineer would: GPU faults by Xid and ECC counters
(:mod:`~trainguard.diagnose.gpu_fault`); OOMs by the memory curve before the error, and the risk
of one by the headroom left (:mod:`~trainguard.diagnose.oom`); hangs and NCCL timeouts by the
oldest in-flight collective, the collective counts, and torch's Flight Recorder analyzer over the
dumps (:mod:`~trainguard.diagnose.hang`); a rank that died by the torchrun agents' lines joined
with the ranks' pids (:mod:`~trainguard.diagnose.rank_failure`); stragglers by compute time
against the job median, then the slow phase and what the GPUs of the same node did at the same
time (:mod:`~trainguard.diagnose.straggler`); data-bound ranks, whole-job slowdowns and GPU
throttling no straggler explains. They judge by the thresholds the rules were rendered from, so
the report and the alerts agree on what "slow" means.

:func:`run` runs them failure by failure in the catalogue's order (causes before what they
cause). An analysis that reads what another found names that failure in ``after``, and
:func:`run` refuses a catalogue whose order would run it first.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from trainguard.contract import FAILURES, Catalogue, Failure, Role
from trainguard.diagnose.context import Context
from trainguard.diagnose.evidence import LogEvidence, StallDump
from trainguard.diagnose.model import Report
from trainguard.diagnose.signals import Signals
from trainguard.thresholds import Thresholds


@dataclass(frozen=True)
class Analysis:
    """One failure's analysis, and the failures whose analyses it reads (their symptoms,
    candidates or the context fields they set), which must run before it."""

    analyse: Callable[[Context], None]
    after: tuple[Failure, ...] = ()


# What a failure's module in this package registers (``@explains(Failure.X)``).
ANALYSES: Role[Analysis] = Role("diagnose analysis", "trainguard.diagnose")


class AnalysisOrderError(RuntimeError):
    """An analysis would run before one it reads: the catalogue's order contradicts ``after``."""


def explains(
    *failures: Failure, after: tuple[Failure, ...] = ()
) -> Callable[[Callable[[Context], None]], Callable[[Context], None]]:
    """Decorator: the function is the analysis of ``failures``, run after those of ``after``."""

    def register(analyse: Callable[[Context], None]) -> Callable[[Context], None]:
        ANALYSES.register(*failures)(Analysis(analyse, after))
        return analyse

    return register


def ordered(catalogue: Catalogue = FAILURES) -> list[Analysis]:
    """Each registered analysis once, in the catalogue's order; ``AnalysisOrderError`` if one
    would run before an analysis it reads."""
    found: list[Analysis] = []
    done: set[Failure] = set()
    registered = catalogue.implementations(ANALYSES)
    analysed = {spec.failure for spec, _ in registered}
    for spec, entry in registered:
        if entry not in found:
            missing = [f.value for f in entry.after if f in analysed and f not in done]
            if missing:
                raise AnalysisOrderError(
                    f"the analysis of {spec.failure.value} reads {missing}, which the "
                    "catalogue's order runs after it"
                )
            found.append(entry)
        done.add(spec.failure)
    return found


def run(
    sig: Signals,
    logs: LogEvidence | None,
    dumps: list[StallDump],
    report: Report,
    thresholds: Thresholds,
    repairs: list[tuple[float, str]] | None = None,
    catalogue: Catalogue = FAILURES,
) -> Context:
    """Run every analysis over one job and order the report: most severe symptom first, most
    likely candidate first, the scope of the most severe symptom. ``thresholds``: the rules';
    ``repairs``: (when, action) of the remediation service's."""
    ctx = Context(sig, report, thresholds, logs or LogEvidence(), dumps, repairs=repairs or [])
    for entry in ordered(catalogue):
        entry.analyse(ctx)
    report.symptoms.sort(key=lambda s: -s.severity)
    report.candidates.sort(key=lambda c: -c.confidence)
    if ctx.scopes:
        report.scope = max(ctx.scopes, key=lambda item: item[0])[1]
    return ctx
