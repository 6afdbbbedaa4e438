"""The report as Markdown (for people) and as JSON (for tools and the remediation service)."""

from __future__ import annotations

import dataclasses
import enum
import json
import math
import os
import re
from pathlib import Path
from typing import Any

from trainguard.contract import JobOutcome
from trainguard.diagnose.context import utc
from trainguard.diagnose.model import (
    INCIDENT_CLOSED,
    IncidentRecord,
    Prevention,
    Report,
    Validation,
)

CONFIDENCE_WORDS = ((0.85, "high"), (0.6, "medium"), (0.0, "low"))
# A setting named like an environment variable is shown as NAME=value.
_ENV_NAME = re.compile(r"[A-Z][A-Z0-9_]*")


def _confidence(value: float) -> str:
    word = next(w for bound, w in CONFIDENCE_WORDS if value >= bound)
    return f"{word} ({value:.2f})"


def _bullet(text: str) -> str:
    # Multi-line evidence (a stack in a code fence) stays inside its list item.
    lines = text.splitlines() or [""]
    return "\n".join([f"- {lines[0]}", *(f"  {line}" for line in lines[1:])])


def markdown(report: Report, relative_to: Path | None = None) -> str:
    r = report
    out = [
        f"# Incident report: job `{r.job_id}`",
        "",
        f"Window {utc(r.start)} to {utc(r.end)}; generated {utc(r.generated_at)} from "
        f"Prometheus {r.prometheus_url}.",
        "",
        "## 1. Symptom",
        "",
    ]
    if not r.symptoms:
        out.append("No failure found in the window: no straggler, OOM, hang or GPU fault.")
    for s in r.symptoms:
        since = f" (since {utc(s.since)})" if s.since is not None else ""
        out.append(f"- **{s.failure.value}**{since}: {s.summary}. Signals: {', '.join(s.signals)}.")
    out += ["", "## 2. Scope", ""]
    scope = r.scope
    where = []
    if scope.ranks:
        where.append("ranks " + ", ".join(map(str, scope.ranks)))
    if scope.nodes:
        where.append("nodes " + ", ".join(scope.nodes))
    if scope.gpus:
        where.append("GPUs " + ", ".join(scope.gpus))
    out.append(
        f"**{scope.level.value}**" + (f" ({'; '.join(where)})" if where else "") + ": "
        f"{scope.explanation}."
    )
    out += ["", "## 3. Root-cause candidates", ""]
    if not r.candidates:
        out.append("None.")
    for i, c in enumerate(r.candidates, 1):
        out.append(f"### {i}. {c.summary}")
        out.append("")
        out.append(f"Cause `{c.cause}`, confidence {_confidence(c.confidence)}. Evidence:")
        out.append("")
        out += [_bullet(e) for e in c.evidence]
        out.append("")
    out += ["## 4. What to do now", ""]
    now = [a for c in r.candidates for a in c.do_now]
    out += [_bullet(a) for a in dict.fromkeys(now)] or ["- Nothing to do."]
    out += ["", "## 5. Validate: what remediation did and whether training recovered", ""]
    out += _validation(r.validation)
    out += ["", "## 6. Prevent: what avoids each cause next time", ""]
    out += _prevention(r.prevention)
    out += ["", "## 7. Charts", ""]
    if not r.charts:
        out += ["No charts.", ""]
    for chart in r.charts:
        path = Path(chart.path)
        if relative_to is not None:
            path = Path(os.path.relpath(path, relative_to))
        out += [f"![{chart.title}]({path.as_posix()})", ""]
    out += ["## Inputs and notes", ""]
    notes = r.validation.notes if r.validation else []
    out += [f"- {line}" for line in r.inputs + r.notes + notes]
    return "\n".join(out).rstrip() + "\n"


def _duration(seconds: float | None) -> str:
    """``45 s``, ``3 min 10 s``, ``2 h 5 min``."""
    if seconds is None:
        return "unknown"
    sign, left = ("-" if seconds < 0 else ""), round(abs(seconds))
    if left < 60:
        return f"{sign}{left} s"
    if left < 3600:
        return f"{sign}{left // 60} min" + (f" {left % 60} s" if left % 60 else "")
    return f"{sign}{left // 3600} h" + (f" {left % 3600 // 60} min" if left % 3600 // 60 else "")


def _validation(v: Validation | None) -> list[str]:
    if v is None:
        return [
            "Not asked: give the remediation service (`--remediation-url`) or a saved copy of "
            "its incidents (`--incidents`) to see what was done and whether training recovered."
        ]
    out = []
    if v.gap:
        out += [f"**Not validated**: {v.gap}. The rest of this report stands.", ""]
    elif not v.incidents:
        out += [f"No incident of this job in {v.source}.", ""]
    else:
        out += [f"From {v.source}: {len(v.incidents)} incident(s) of this job.", ""]
    for i in v.incidents:
        out += _incident(i)
    return out[:-1] if out and not out[-1] else out


def _incident(i: IncidentRecord) -> list[str]:
    failure = i.failure.value if i.failure else "no failure named"
    verdict = i.outcome.value.replace("_", " ") if i.outcome else f"still {i.state}"
    out = [f"### Incident {i.id}: {i.alert} on {i.subject} ({failure}): {verdict}", ""]
    # Each milestone, with the duration the service measures up to it (detect, act, recover).
    steps: list[tuple[str, float | None, str]] = [
        ("first evidence", i.first_evidence_at, ""),
        ("detected (alert firing)", i.detected_at, _after(i.time_to_detect_seconds, "evidence")),
        ("received", i.received_at, ""),
        ("acted", i.acted_at, _after(i.time_to_act_seconds, "detection")),
        ("recovered", i.recovered_at, _after(i.time_to_recover_seconds, "detection")),
        ("closed", i.closed_at, ""),
    ]
    timeline = " -> ".join(f"{name} {utc(at)}{gap}" for name, at, gap in steps if at is not None)
    out.append(f"- Timeline: {timeline or 'no times recorded'}.")
    if i.recovered_at is not None:
        out.append(
            f"- Recovered {_duration(i.time_to_recover_seconds)} after detection"
            + (f" (time to act {_duration(i.time_to_act_seconds)})" if i.acted_at else "")
            + (f", by {i.recovered_by}" if i.recovered_by else "")
            + "."
        )
    elif i.state != INCIDENT_CLOSED:
        due = f"; the verdict is due by {utc(i.deadline_at)}" if i.deadline_at is not None else ""
        out.append(f"- Not recovered yet: the incident is {i.state}{due}.")
    else:
        out.append("- Training did not recover.")
    out.append("- Done (each rung tried):")
    out += [
        f"  - rung {t.rung}: `{t.action}` (action {t.action_id}"
        + (f" and {t.count - 1} more alike" if t.count > 1 else "")
        + f") {t.state} at {utc(t.at)}"
        + (f"; verdict {t.verdict}" if t.verdict else "")
        for t in i.tried
    ] or [f"  - nothing yet (rung {i.rung}: `{i.rung_action}` planned)"]
    if i.escalated:
        first = i.tried[0].action if i.tried else "the first plan"
        out.append(f"- Escalated: from rung 0 (`{first}`) to rung {i.rung} (`{i.rung_action}`).")
    else:
        out.append("- Escalated: no (rung 0, the first plan).")
    out.append("- Human paged: " + ("**yes**." if i.paged else "no."))
    outcome = i.outcome.value if i.outcome else "none yet"
    job = i.job_outcome.value if i.job_outcome else "none yet"
    baseline = ""
    if i.baseline_step is not None:
        passed = (
            "passed"
            if i.job_outcome is JobOutcome.RESUMED
            else "did not pass"
            if i.job_outcome is JobOutcome.LOST
            else "has yet to pass"
        )
        baseline = f": training {passed} step {i.baseline_step}, the step it had reached"
        if i.baseline_ranks_up is not None:
            baseline += f" with {i.baseline_ranks_up} ranks up"
    out.append(f"- Outcome: {outcome}; job outcome: {job}{baseline}.")
    if i.diagnosed is not None and i.failure is not None:
        out.append(
            f"- This report {'also finds' if i.diagnosed else 'finds no'} {i.failure.value} "
            "in its window" + ("." if i.diagnosed else " (cleared before it, or outside it).")
        )
    if i.note:
        out.append(f"- Note: {i.note}")
    return [*out, ""]


def _after(seconds: float | None, since: str) -> str:
    return "" if seconds is None else f" ({_duration(seconds)} after {since})"


def _prevention(items: list[Prevention]) -> list[str]:
    if not items:
        return ["Nothing to change: no root cause found."]
    out = []
    for p in items:
        failure = f", {p.failure.value}" if p.failure and p.failure.value != p.cause else ""
        out += [f"### {p.summary} (`{p.cause}`{failure})", ""]
        for setting in p.settings:
            what = (
                f"`{setting.name}={setting.value}`"
                if _ENV_NAME.fullmatch(setting.name)
                else f"{setting.name}: `{setting.value}`"
            )
            out.append(f"- {what} ({setting.where}). Evidence:")
            out += [f"  - {e}" for e in setting.evidence]
        out += [_bullet(line) for line in p.practices]
        if not (p.settings or p.practices):
            out.append("- No setting follows from this report's evidence.")
        out.append("")
    return out[:-1]


def _plain(value: Any) -> Any:
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        # JSON has no NaN or infinity; Prometheus answers both (an empty ratio, a quantile
        # above the highest bucket), and a reader takes null as "no value".
        return None
    return value


def as_dict(report: Report) -> dict[str, Any]:
    data = _plain(dataclasses.asdict(report))
    data["failure"] = report.failure.value if report.failure else None
    assert isinstance(data, dict)
    return data


def as_json(report: Report) -> str:
    return json.dumps(as_dict(report), indent=2, sort_keys=True, allow_nan=False)
