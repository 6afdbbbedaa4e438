"""Helpers of the rules and dashboards tests: finding binaries, and metric names in PromQL."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from trainguard import contract

REPO = Path(__file__).resolve().parents[2]
ALERTS = REPO / "trainguard" / "alerts"
RULES_FILE = ALERTS / "trainguard.rules.yml"
THRESHOLDS_FILE = REPO / "trainguard" / "thresholds.yml"
RULE_TESTS = sorted((REPO / "tests" / "alerts").glob("*.test.yml"))


def binary(name: str) -> str:
    """Path of a Prometheus/Alertmanager binary; skips (fails under CI's flag) when missing."""
    path = shutil.which(name)
    if path is None:
        message = f"{name} not installed (Debian: prometheus / prometheus-alertmanager)"
        if os.environ.get("TRAINGUARD_REQUIRE_BINARIES") == "1":
            pytest.fail(message)
        pytest.skip(message)
    return path


def run(*args: str | Path, cwd: Path = REPO) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(a) for a in args], cwd=cwd, capture_output=True, text=True, timeout=120, check=False
    )


# PromQL words that are not metric names.
_KEYWORDS = {
    "and", "or", "unless", "by", "without", "on", "ignoring", "group_left", "group_right",
    "bool", "offset", "inf", "nan",
}  # fmt: skip
_STRING = re.compile(r'"(?:[^"\\]|\\.)*"|`[^`]*`')
_BRACES = re.compile(r"\{[^}]*\}")
_RANGE = re.compile(r"\[[^\]]*\]")
_GROUPING = re.compile(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)")
_IDENT = re.compile(r"(?<![\w:.$])([A-Za-z_:][\w:]*)(\s*\()?")


def metric_names(expr: str) -> set[str]:
    """Metric names an expression selects (bare or with a ``{...}`` selector)."""
    text = _STRING.sub('""', expr)
    text = _BRACES.sub(" {} ", text)
    text = _RANGE.sub(" ", text)
    text = _GROUPING.sub(" ", text)
    names = set()
    for match in _IDENT.finditer(text):
        word, call = match.group(1), match.group(2)
        if call or word.lower() in _KEYWORDS or re.fullmatch(r"\d.*", word):
            continue
        names.add(word)
    return names


def exposed_names() -> set[str]:
    """Every series name the contract's metrics produce (histograms: _bucket/_sum/_count)."""
    specs = contract.RANK_METRICS + contract.NODE_METRICS + contract.REMEDIATION_METRICS
    return {name for spec in specs for name in spec.sample_names}


def recording_names() -> set[str]:
    """Every recording rule the contract names: ``REC_*`` strings, and the values of ``REC_*``
    dicts (one rule per window, such as the reliability rules)."""
    names: set[str] = set()
    for key, value in vars(contract).items():
        if key.startswith("REC_"):
            names.update(value.values() if isinstance(value, dict) else {value})
    return names


# Series Prometheus itself makes: target health and the alerts it evaluates.
PROMETHEUS_SERIES = {"up", "ALERTS"}
