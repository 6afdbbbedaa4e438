"""What triage reports: one finding per distinct failure, with where it was seen and what to do."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any, NamedTuple


class Category(str, enum.Enum):
    """The kinds of failure triage recognises (``category`` in ``--json`` output)."""

    CUDA_OOM = "cuda_oom"
    NCCL_TIMEOUT = "nccl_timeout"
    NCCL_ERROR = "nccl_error"
    XID = "xid"
    ELASTIC_FAILURE = "elastic_failure"
    STRAGGLER = "straggler"


class Location(NamedTuple):
    """A line of an input: the name given on the command line (or found in a directory).

    A named tuple rather than a dataclass: one is made for every line a detector sees.
    """

    file: str
    line: int


@dataclass
class Finding:
    """One failure: what it is, the fields extracted from the log, where and what to do.

    ``count`` is how many log lines reported this same failure (repeats are folded into one
    finding so that a log with a million identical warnings yields one line of output).
    """

    category: Category
    summary: str
    location: Location
    advice: str
    fields: dict[str, Any] = field(default_factory=dict)
    count: int = 1

    def to_json(self) -> dict[str, Any]:
        return {
            "category": self.category.value,
            "summary": self.summary,
            "file": self.location.file,
            "line": self.location.line,
            "count": self.count,
            "fields": self.fields,
            "advice": self.advice,
        }
