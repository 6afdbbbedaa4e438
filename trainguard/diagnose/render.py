"""The report as Markdown (for people) and as JSON (for tools and the remediation service)."""

from __future__ import annotations

import dataclasses
import enum
import json
import math
import os
from pathlib import Path
from typing import Any

from trainguard.diagnose.context import utc
from trainguard.diagnose.model import Report

CONFIDENCE_WORDS = ((0.85, "high"), (0.6, "medium"), (0.0, "low"))


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
    out += ["## 4. What to do", "", "### Now", ""]
    now = [a for c in r.candidates for a in c.do_now]
    out += [_bullet(a) for a in dict.fromkeys(now)] or ["- Nothing to do."]
    out += ["", "### Next time", ""]
    later = [a for c in r.candidates for a in c.prevention]
    out += [_bullet(a) for a in dict.fromkeys(later)] or ["- Nothing to change."]
    out += ["", "## 5. Charts", ""]
    if not r.charts:
        out.append("No charts.")
    for chart in r.charts:
        path = Path(chart.path)
        if relative_to is not None:
            path = Path(os.path.relpath(path, relative_to))
        out += [f"![{chart.title}]({path.as_posix()})", ""]
    out += ["## Inputs and notes", ""]
    out += [f"- {line}" for line in r.inputs + r.notes]
    return "\n".join(out).rstrip() + "\n"


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
