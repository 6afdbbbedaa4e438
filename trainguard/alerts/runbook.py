"""The runbook beside the rules (``runbook.md``) read as data, and checked against the catalogue.

Every alert's ``runbook_url`` points into ``runbook.md``: one ``## <failure>`` section per failure
of the catalogue, in its order, saying what the catalogue says of it, then one ``### <Alert>``
subsection per alert of that failure in the flow every subsection follows. :func:`check` lists
where the text and a catalogue disagree; ``trainguard rules --check`` runs it on the packaged
runbook, so an alert never links to a section that is missing or out of date.
"""

from __future__ import annotations

import re
from importlib import resources

from trainguard.contract import FAILURES, Catalogue, FailureSpec

PACKAGE = "trainguard.alerts"
FILE = "runbook.md"

# The flow every alert subsection follows, in order (the runbook's introduction names it).
ALERT_PARTS = ("Symptom", "Scope", "Root cause", "Fix", "Prevention")
# What each failure section says, in order, before its alerts' subsections.
FAILURE_PARTS = (
    "Alerts",
    "Signals",
    "Thresholds",
    "Dashboards",
    "Default actions",
    "Triage",
    "Diagnose",
)

_PART = re.compile(r"^- \*\*(.+?)\*\*: (.*?)(?=^- \*\*|\Z)", flags=re.M | re.S)


def packaged_text() -> str:
    """The runbook shipped beside the rules."""
    return (resources.files(PACKAGE) / FILE).read_text()


def anchor_of(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation but ``-`` and ``_`` dropped."""
    return re.sub(r"[^a-z0-9 _-]", "", heading.lower()).replace(" ", "-")


def sections(text: str) -> dict[str, str]:
    """Body of each section (up to the next heading of any level), keyed by its anchor."""
    chunks = re.split(r"^#+ (.+)$", text, flags=re.M)
    return {
        anchor_of(heading): body for heading, body in zip(chunks[1::2], chunks[2::2], strict=True)
    }


def outline(text: str) -> list[tuple[int, str]]:
    """(level, heading) of every heading, in order."""
    return [(len(m[1]), m[2]) for m in re.finditer(r"^(#+) (.+)$", text, flags=re.M)]


def failure_outline(text: str) -> tuple[list[tuple[int, str]], list[tuple[int, str]]]:
    """The outline up to the second top-level heading (the failures), and from there on (the
    remediation service's own alerts)."""
    found = outline(text)
    tops = [index for index, (level, _) in enumerate(found) if level == 1]
    end = tops[1] if len(tops) > 1 else len(found)
    return found[:end], found[end:]


def parts(body: str) -> dict[str, str]:
    """The ``- **Part**: text`` items of a section, whitespace folded, in order."""
    return {name: " ".join(value.split()) for name, value in _PART.findall(body)}


def check(text: str, catalogue: Catalogue = FAILURES) -> list[str]:
    """Where the runbook ``text`` and ``catalogue`` disagree (empty when they agree)."""
    problems: list[str] = []
    failures, _ = failure_outline(text)
    headings = [heading for level, heading in failures if level == 2]
    expected = [spec.runbook_anchor for spec in catalogue.values()]
    if headings != expected:
        problems.append(f"failure sections {headings} are not the catalogue's {expected}")
    under: dict[str, list[str]] = {}
    current = ""
    for level, heading in failures:
        if level == 2:
            current = heading
        elif level == 3:
            under.setdefault(current, []).append(heading)
        elif current:
            problems.append(f"unexpected heading {heading!r} among the failures")
    bodies = sections(text)
    for spec in catalogue.values():
        alerts = [alert.value for alert in spec.alerts]
        if under.get(spec.runbook_anchor, []) != alerts:
            problems.append(
                f"## {spec.runbook_anchor} holds {under.get(spec.runbook_anchor, [])}, "
                f"not its alerts {alerts}"
            )
        body = bodies.get(spec.runbook_anchor)
        if body is not None:
            problems += _failure_problems(spec, body)
        for alert in alerts:
            found = tuple(parts(bodies.get(anchor_of(alert), "")))
            if found != ALERT_PARTS:
                problems.append(f"### {alert} has the parts {found}, not {ALERT_PARTS}")
    return problems


def _failure_problems(spec: FailureSpec, body: str) -> list[str]:
    name = f"## {spec.runbook_anchor}"
    problems = []
    if spec.summary not in body:
        problems.append(f"{name} does not quote the catalogue's summary")
    said = parts(body)
    if tuple(said) != FAILURE_PARTS:
        return [*problems, f"{name} has the parts {tuple(said)}, not {FAILURE_PARTS}"]
    listed = {
        "Alerts": re.findall(r"\]\(#([a-z0-9_-]+)\)", said["Alerts"]),
        "Signals": re.findall(r"`([a-z0-9_]+)`", said["Signals"]),
        "Thresholds": re.findall(r"`([a-z0-9_]+)`", said["Thresholds"]),
        "Dashboards": re.findall(r"`(trainguard-[a-z0-9-]+)`", said["Dashboards"]),
        "Default actions": re.findall(r"`([a-z_]+)`", said["Default actions"]),
    }
    catalogued = {
        "Alerts": [alert.value.lower() for alert in spec.alerts],
        "Signals": [signal.name for signal in spec.signals],
        "Thresholds": list(spec.thresholds),
        "Dashboards": list(spec.dashboards),
        "Default actions": [action.value for action in spec.actions],
    }
    for part, names in listed.items():
        if names != catalogued[part]:
            problems.append(f"{name}: {part} lists {names}, the catalogue {catalogued[part]}")
    return problems
