"""What triage reports: one finding per distinct failure, with where it was seen and what to do."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, NamedTuple

from trainguard.contract import Failure


class Location(NamedTuple):
    """A line of an input: the name given on the command line (or found in a directory).

    A named tuple rather than a dataclass: one is made for every line a detector sees.
    """

    file: str
    line: int


@dataclass
class Finding:
    """One failure: what it is, the fields extracted from the log, where and what to do.

    ``failure`` is the contract's name for it (``failure`` in ``--json`` output), the same name
    alerts, diagnose and remediation give it.

    ``count`` is how many log lines reported this same failure (repeats are folded into one
    finding so that a log with a million identical warnings yields one line of output).
    """

    failure: Failure
    summary: str
    location: Location
    advice: str
    fields: dict[str, Any] = field(default_factory=dict)
    count: int = 1

    def to_json(self) -> dict[str, Any]:
        return {
            "failure": self.failure.value,
            "summary": self.summary,
            "file": self.location.file,
            "line": self.location.line,
            "count": self.count,
            "fields": self.fields,
            "advice": self.advice,
        }
