"""Scoring ``trainguard triage`` on a corpus of real log excerpts with expected findings.

The corpus layout and the rules of the score are in ``tests/triage/corpus/README.md``: one
folder per category (a ``contract.Failure`` value, or ``clean``), each excerpt a ``.log`` with a
``.yml`` beside it naming its source, its thread and the findings triage must give. Used by the
corpus test and by ``benchmarks/triage_accuracy.py``.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from trainguard.contract import Failure
from trainguard.thresholds import Thresholds
from trainguard.triage.detectors import default_detectors
from trainguard.triage.scanner import Scanner

CLEAN = "clean"
_MISSING = object()


class CorpusError(ValueError):
    """An excerpt's metadata is missing or malformed."""


@dataclass(frozen=True)
class Expected:
    failure: str
    fields: Mapping[str, Any]


@dataclass(frozen=True)
class Excerpt:
    path: Path
    category: str
    source: str
    thread: str
    expect: tuple[Expected, ...]


@dataclass
class Verdict:
    excerpt: Excerpt
    correct: bool
    reasons: list[str] = field(default_factory=list)


def load(root: Path) -> list[Excerpt]:
    """Every excerpt under ``root`` (``<category>/<stem>.log`` with ``<stem>.yml``)."""
    excerpts = []
    categories = {f.value for f in Failure} | {CLEAN}
    for log in sorted(root.glob("*/*.log")):
        category = log.parent.name
        if category not in categories:
            raise CorpusError(f"{log}: {category!r} is not a category ({sorted(categories)})")
        meta_path = log.with_suffix(".yml")
        if not meta_path.is_file():
            raise CorpusError(f"{log}: no {meta_path.name} beside it")
        try:
            meta = yaml.safe_load(meta_path.read_text(encoding="utf-8")) or {}
        except yaml.YAMLError as exc:
            raise CorpusError(f"{meta_path}: not YAML: {exc}") from exc
        excerpts.append(_excerpt(log, category, meta, categories))
    return excerpts


def _excerpt(log: Path, category: str, meta: Any, categories: set[str]) -> Excerpt:
    if not isinstance(meta, dict):
        raise CorpusError(f"{log}: its metadata is not a mapping")
    source, thread = meta.get("source"), meta.get("thread")
    if not isinstance(source, str) or not source.startswith("http"):
        raise CorpusError(f"{log}: 'source' must be the URL the text was copied from")
    expect = meta.get("expect")
    if not isinstance(expect, list):
        raise CorpusError(f"{log}: 'expect' must be a list ([] for a clean log)")
    expected = []
    for entry in expect:
        failure = entry.get("failure") if isinstance(entry, dict) else None
        if failure not in categories - {CLEAN}:
            raise CorpusError(f"{log}: unknown failure {failure!r} in 'expect'")
        fields = entry.get("fields") or {}
        if not isinstance(fields, dict):
            raise CorpusError(f"{log}: 'fields' of {failure} must be a mapping")
        expected.append(Expected(failure, fields))
    if (category == CLEAN) != (not expected):
        raise CorpusError(f"{log}: only clean logs expect no finding")
    if category != CLEAN and category not in {e.failure for e in expected}:
        raise CorpusError(f"{log}: a {category} excerpt must expect a {category} finding")
    return Excerpt(
        log,
        category,
        source,
        str(thread) if thread else source.split("#", 1)[0],
        tuple(expected),
    )


def triage(path: Path, thresholds: Thresholds) -> list[dict[str, Any]]:
    """What ``trainguard triage --json`` reports for one file, judging by ``thresholds``."""
    scanner = Scanner(default_detectors(thresholds))
    scanner.scan_paths([str(path)])
    return [finding.to_json() for finding in scanner.findings()]


def _field(fields: Mapping[str, Any], dotted: str) -> Any:
    value: Any = fields
    for part in dotted.split("."):
        if not isinstance(value, Mapping) or part not in value:
            return _MISSING
        value = value[part]
    return value


def judge(excerpt: Excerpt, findings: Iterable[Mapping[str, Any]]) -> Verdict:
    """Whether triage's findings for an excerpt are what its metadata expects."""
    found = list(findings)
    verdict = Verdict(excerpt, correct=True)
    got = {f["failure"] for f in found}
    wanted = {e.failure for e in excerpt.expect}
    if got != wanted:
        verdict.reasons.append(f"categories {sorted(got)}, expected {sorted(wanted)}")
    for expected in excerpt.expect:
        candidates = [f["fields"] for f in found if f["failure"] == expected.failure]
        if candidates and not any(
            all(_field(c, k) == v for k, v in expected.fields.items()) for c in candidates
        ):
            seen = [{k: _field(c, k) for k in expected.fields} for c in candidates]
            verdict.reasons.append(
                f"{expected.failure}: expected {dict(expected.fields)}, found "
                f"{[{k: v for k, v in s.items() if v is not _MISSING} for s in seen]}"
            )
    verdict.correct = not verdict.reasons
    return verdict


@dataclass
class Score:
    verdicts: list[Verdict]

    def by_category(self) -> dict[str, tuple[float, int, int]]:
        """Per category: (score, excerpts, threads); a thread scores the share of its
        excerpts that are correct, a category the mean over its threads."""
        threads: dict[str, dict[str, list[bool]]] = defaultdict(lambda: defaultdict(list))
        for verdict in self.verdicts:
            threads[verdict.excerpt.category][verdict.excerpt.thread].append(verdict.correct)
        return {
            category: (
                statistics.fmean(sum(v) / len(v) for v in per_thread.values()),
                sum(len(v) for v in per_thread.values()),
                len(per_thread),
            )
            for category, per_thread in sorted(threads.items())
        }

    @property
    def accuracy(self) -> float:
        """Over every failure category's threads (clean logs excluded), one vote per thread."""
        threads: dict[tuple[str, str], list[bool]] = defaultdict(list)
        for verdict in self.verdicts:
            if verdict.excerpt.category != CLEAN:
                key = (verdict.excerpt.category, verdict.excerpt.thread)
                threads[key].append(verdict.correct)
        return statistics.fmean(sum(v) / len(v) for v in threads.values()) if threads else 0.0

    @property
    def clean_false(self) -> int:
        """Clean logs on which triage reported anything."""
        return sum(1 for v in self.verdicts if v.excerpt.category == CLEAN and not v.correct)

    @property
    def threads(self) -> int:
        return len({v.excerpt.thread for v in self.verdicts})

    def failures(self) -> list[Verdict]:
        return [v for v in self.verdicts if not v.correct]


def score(excerpts: Iterable[Excerpt], thresholds: Thresholds) -> Score:
    """Each excerpt judged on what triage reports for it, judging by ``thresholds``."""
    return Score([judge(excerpt, triage(excerpt.path, thresholds)) for excerpt in excerpts])
