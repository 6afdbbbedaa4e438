"""What every detector is and shares: the protocol, the registry, and the parsing of rank,
time and size that several detectors need.

A detector names the literal keywords its lines always contain; the scanner only hands it lines
holding one of them, found by searching whole chunks for the detectors' needles (the keywords,
or words they share), which is what keeps triage fast on gigabytes of noise. Each detector keeps
a bounded number of distinct failures (``MAX_GROUPS``) and counts what it had to leave out.
Each failure's detector lives in the module named after it (``detectors/oom.py``, ...) and
registers itself under :data:`DETECTORS` (``@register``); triage builds one of each, failure by
failure in the catalogue's order, which is the order findings are reported in.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol, TypeVar

from trainguard.contract import Failure, Role
from trainguard.thresholds import Thresholds
from trainguard.triage.findings import Finding, Location

MAX_GROUPS = 10_000
MAX_LISTED = 64  # ranks/hosts listed per finding; the count says how many there were
MAX_MESSAGE = 400

K = TypeVar("K")
V = TypeVar("V")


@dataclass
class Source:
    """The input a line comes from, and the rank its file name implies (if any)."""

    name: str
    rank_hint: int | None = None


class Detector(Protocol):
    failure: ClassVar[Failure]  # what its findings report (the contract's catalogue names it)
    # Lines holding one of ``keywords`` are handed to the detector. ``needles`` are what the
    # scanner searches the input for to find them: the keywords, or fewer, shorter words that
    # every line the detector must see holds (each needle is one pass over every chunk).
    keywords: tuple[str, ...]
    needles: tuple[str, ...]
    dropped: int

    def feed(self, line: str, where: Location, source: Source) -> bool:
        """Inspect one line; True asks for the next line too (multi-line blocks)."""

    def findings(self) -> list[Finding]: ...


class DetectorType(Protocol):
    """A detector class as the registry holds it: built from the thresholds it judges by."""

    @property
    def failure(self) -> Failure: ...

    def from_thresholds(self, thresholds: Thresholds) -> Detector: ...


# What a failure's module in this package registers: its detector class.
DETECTORS: Role[DetectorType] = Role("triage detector", "trainguard.triage.detectors")

D = TypeVar("D", bound=DetectorType)


def register(detector: D) -> D:
    """Class decorator: ``detector`` is triage's detector of its ``failure``."""
    DETECTORS.register(detector.failure)(detector)
    return detector


def bounded_get(groups: dict[K, V], key: K, make: Callable[[], V], owner: Detector) -> V | None:
    """``groups[key]``, made if missing, unless the detector already holds ``MAX_GROUPS``."""
    value = groups.get(key)
    if value is None:
        if len(groups) >= MAX_GROUPS:
            owner.dropped += 1
            return None
        value = groups[key] = make()
    return value


def add_listed(values: set[Any], value: Any) -> None:
    if len(values) < MAX_LISTED:
        values.add(value)


# --- shared parsing -----------------------------------------------------------------------
_UNITS = {"bytes": 1, "B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30, "TiB": 1 << 40}
SIZE = r"[\d.]+ (?:bytes|B|KiB|MiB|GiB|TiB)"

# torchrun prefixes each worker line with [rank<global>]: or [<role><local_rank>]: (--tee,
# --local-ranks-filter; torch/distributed/elastic/multiprocessing/api.py); a log collector may
# put a timestamp or a stream name before it, so it is looked for near the start of the line.
_RANK_PREFIX = re.compile(r"\[(rank|[a-z_]+?)(\d+)\]:")
_RANK_PREFIX_WITHIN = 64
_RANK_IN_MESSAGE = re.compile(r"\bRank (\d+)\]")


def parse_size(text: str) -> int:
    number, unit = text.split()
    return round(float(number) * _UNITS[unit])


def rank_of(line: str, source: Source) -> int | None:
    """The global rank a line belongs to, from torchrun's prefix, the message or the file."""
    prefix = _RANK_PREFIX.search(line, 0, _RANK_PREFIX_WITHIN)
    if prefix and prefix.group(1) == "rank":
        return int(prefix.group(2))
    in_message = _RANK_IN_MESSAGE.search(line)
    if in_message:
        return int(in_message.group(1))
    if prefix:  # [default3]: is a local rank; better than nothing on a single node
        return int(prefix.group(2))
    return source.rank_hint


def trim(text: str) -> str:
    text = text.strip()
    return text if len(text) <= MAX_MESSAGE else text[: MAX_MESSAGE - 3] + "..."


def gib(n: int) -> str:
    return f"{n / (1 << 30):.2f} GiB"
