"""``trainguard diagnose``: the incident report that says what broke, where, why, what to do.

:func:`diagnose` reads one job's series from Prometheus, the hook's events and raw logs, and
the Flight Recorder dumps of a hang, and returns a :class:`Report`: symptom, scope, ranked
root-cause candidates with their evidence, what to do now, whether the remediation service's
repairs worked (validate, from its incidents), the settings that prevent each cause (prevent),
and (with ``charts_dir``) PNG charts.
Needs httpx and PyYAML (the ``diagnose`` extra, which adds matplotlib for the charts); torch
only to analyse Flight Recorder dumps.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from trainguard.contract import Failure
from trainguard.diagnose.model import Candidate, Chart, Report, Scope, ScopeLevel, Symptom
from trainguard.diagnose.prometheus import PrometheusClient, PrometheusError
from trainguard.diagnose.signals import NoDataError
from trainguard.diagnose.validate import IncidentsError
from trainguard.thresholds import Thresholds

__all__ = [
    "Candidate",
    "Chart",
    "Failure",
    "IncidentsError",
    "NoDataError",
    "PrometheusError",
    "Report",
    "Scope",
    "ScopeLevel",
    "Symptom",
    "diagnose",
]


def diagnose(
    prometheus_url: str,
    job_id: str,
    *,
    thresholds: Thresholds,
    since_seconds: float = 7200.0,
    until: float | None = None,
    dumps: Path | None = None,
    logs: Sequence[str] = (),
    charts_dir: Path | None = None,
    timeout: float = 30.0,
    sustain_seconds: float = 300.0,
    min_step_seconds: float = 15.0,
    incidents: Sequence[Any] | None = None,
    incidents_source: str = "the caller",
    incidents_gap: str | None = None,
) -> Report:
    """Diagnose ``job_id`` over ``[until - since_seconds, until]`` (``until`` defaults to now).

    A condition (a straggler, throttling, a data-bound rank) counts once it has held for
    ``sustain_seconds`` (default: the alerts' own scale; the demo uses seconds).
    ``min_step_seconds`` is the finest query step: the scrape interval.

    ``incidents`` are the remediation service's IncidentView documents of the job (from
    ``incidents_source``), which the Validate section reports; ``incidents_gap`` says why they
    could not be read, and the report names that gap instead. Malformed documents and other
    jobs' are left out with a note. ``thresholds`` are those the rules were rendered from, so
    the diagnosis judges as the alerts did.

    Raises PrometheusError when Prometheus cannot be queried and NoDataError when it holds
    nothing about the job in the window.
    """
    from trainguard.diagnose.analysis import run
    from trainguard.diagnose.evidence import read_dumps, read_logs
    from trainguard.diagnose.prevent import plan
    from trainguard.diagnose.signals import collect
    from trainguard.diagnose.validate import repairs, validate

    end = time.time() if until is None else until
    start = end - since_seconds
    with PrometheusClient(prometheus_url, timeout=timeout) as client:
        sig = collect(client, job_id, start, end, thresholds, min_step=min_step_seconds)
    sig.sustain_seconds = sustain_seconds
    report = Report(job_id, start, end, time.time(), prometheus_url)
    report.inputs.append(
        f"Prometheus: {len(sig.ranks)} ranks on {len(sig.nodes)} node(s), query step {sig.step:g} s"
    )
    log_evidence = None
    if logs:
        log_evidence = read_logs(logs, job_id, thresholds)
        report.inputs.append(
            f"logs: {log_evidence.files} file(s), {len(log_evidence.events)} hook event(s) of "
            f"this job, {len(log_evidence.findings)} triage finding(s)"
        )
        report.notes += [f"unreadable log {u}" for u in log_evidence.unreadable]
        if log_evidence.other_jobs_skipped:
            report.notes.append(
                f"{log_evidence.other_jobs_skipped} event(s) of other jobs in the logs ignored"
            )
    stall_dumps = []
    if dumps is not None:
        if not dumps.is_dir():
            report.notes.append(f"dump folder {dumps} does not exist")
        else:
            stall_dumps = read_dumps(dumps, job_id)
            report.inputs.append(
                f"Flight Recorder: {len(stall_dumps)} stall folder(s) under {dumps}"
            )
    ctx = run(sig, log_evidence, stall_dumps, report, thresholds, repairs(incidents or ()))
    if incidents is not None or incidents_gap is not None:
        # Validate reads the diagnosis (did it see what the service acted on); Prevent reads
        # what a restart cost.
        report.validation = validate(incidents or (), report, incidents_source, incidents_gap)
        report.inputs.append(
            f"remediation incidents: {len(report.validation.incidents)} of this job from "
            f"{incidents_source}" + (f" (not read: {incidents_gap})" if incidents_gap else "")
        )
    plan(ctx)
    if charts_dir is not None:
        from trainguard.diagnose.charts import draw_all

        report.charts, notes = draw_all(ctx, charts_dir)
        report.notes += notes
    return report
