"""The failure catalogue agrees with every part that acts on it.

``contract.FAILURES`` says, per failure, which alerts report it, which metrics those alerts
read, where its runbook section is, what the default policy does, and which triage detector
and diagnose analysis find it. Each test here reads the other side (the rendered rules, the
runbook, the default policy, the action catalogue, the executors, the triage and diagnose
code) and fails when the two disagree.
"""

from __future__ import annotations

import importlib
import re
from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from tests.alerts.tools import ALERTS, RULES_FILE
from trainguard import contract
from trainguard.contract import Action, Alert, Failure, FailureSpec

SPECS = list(contract.FAILURES.values())
_RECORDED = re.compile(r"\b[a-z_]+:[a-z0-9_]+:[a-z0-9_]+\b")


def _rules() -> list[dict[str, Any]]:
    document = yaml.safe_load(RULES_FILE.read_text())
    return [rule for group in document["groups"] for rule in group["rules"]]


def _expanded(expr: str, recorded: dict[str, str], depth: int = 0) -> str:
    """``expr`` with every recording rule it reads replaced by that rule's own expression."""
    assert depth < 10, "recording rules refer to each other in a cycle"
    return _RECORDED.sub(
        lambda m: _expanded(recorded[m[0]], recorded, depth + 1) if m[0] in recorded else m[0],
        expr,
    )


def _resolve(reference: str) -> Any:
    module, _, attribute = reference.partition(":")
    return getattr(importlib.import_module(module), attribute)


def _runbook_sections() -> dict[str, list[str]]:
    """Failure heading (``## x``) -> the alert headings (``### X``) under it."""
    sections: dict[str, list[str]] = {}
    current: list[str] | None = None
    for line in (ALERTS / "runbook.md").read_text().splitlines():
        if line.startswith("## "):
            current = sections.setdefault(line[3:].strip(), [])
        elif line.startswith("### ") and current is not None:
            current.append(line[4:].strip())
    return sections


def test_every_failure_has_one_entry_and_every_alert_one_failure() -> None:
    assert set(contract.FAILURES) == set(Failure)
    for failure, spec in contract.FAILURES.items():
        assert spec.failure is failure
    owners = [spec.failure for spec in SPECS for _ in spec.alerts]
    alerts = [alert for spec in SPECS for alert in spec.alerts]
    assert sorted(alerts) == sorted(Alert), "each alert belongs to exactly one failure"
    for alert, failure in zip(alerts, owners, strict=True):
        assert contract.failure_of(alert) is failure


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: s.failure.value)
def test_the_rules_of_a_failure_read_its_signals(spec: FailureSpec) -> None:
    rules = _rules()
    recorded = {rule["record"]: rule["expr"] for rule in rules if "record" in rule}
    by_alert: dict[str, list[str]] = {}
    for rule in rules:
        if "alert" in rule:
            by_alert.setdefault(rule["alert"], []).append(_expanded(rule["expr"], recorded))
    assert set(by_alert) == {alert.value for alert in Alert}
    bases = [signal.client_name for signal in spec.signals]
    for alert in spec.alerts:
        for expr in by_alert[alert.value]:
            assert any(base in expr for base in bases), (alert.value, bases, expr)


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: s.failure.value)
def test_the_runbook_has_a_section_per_failure_holding_its_alerts(spec: FailureSpec) -> None:
    sections = _runbook_sections()
    assert spec.runbook_anchor in sections, f"runbook has no '## {spec.runbook_anchor}'"
    assert sorted(sections[spec.runbook_anchor]) == sorted(a.value for a in spec.alerts)


def test_the_runbook_has_no_section_outside_the_catalogue() -> None:
    sections = _runbook_sections()
    failures = {spec.runbook_anchor for spec in SPECS}
    alert_sections = [a for alerts in sections.values() for a in alerts]
    assert sorted(alert_sections) == sorted(alert.value for alert in Alert)
    for heading, alerts in sections.items():
        assert heading in failures or not alerts, f"alerts under '## {heading}'"


def _default_policy() -> Any:
    from trainguard.remediation.policy import load_policy

    return load_policy(None)


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: s.failure.value)
def test_the_default_policy_does_what_the_catalogue_says(spec: FailureSpec) -> None:
    policy = _default_policy()
    planned: list[Action] = []
    for rule in policy.rules:
        if rule.alert in {alert.value for alert in spec.alerts}:
            planned.extend(Action(step.action) for step in rule.actions)
    assert set(planned) == set(spec.actions)
    first_seen = list(dict.fromkeys(planned))
    assert first_seen == list(spec.actions), "catalogue lists the actions in the order tried"


def test_the_default_policy_answers_every_alert_and_no_other() -> None:
    assert _default_policy().alerts() == {alert.value for alert in Alert}


def _executors() -> Iterator[tuple[str, frozenset[Action]]]:
    from trainguard.remediation.executors import RecommendExecutor
    from trainguard.remediation.executors.directive import DirectiveExecutor
    from trainguard.remediation.executors.kubernetes import KubernetesExecutor
    from trainguard.remediation.executors.local import LocalExecutor
    from trainguard.remediation.executors.page import PageExecutor
    from trainguard.remediation.executors.slurm import SlurmExecutor

    for executor in (
        RecommendExecutor,
        PageExecutor,
        DirectiveExecutor,
        KubernetesExecutor,
        LocalExecutor,
        SlurmExecutor,
    ):
        yield executor.name, frozenset(executor.actions)


def test_every_action_is_catalogued_and_carried_out() -> None:
    from trainguard.remediation.actions import CATALOG

    assert set(CATALOG) == set(Action)
    carried: set[Action] = set()
    for name, actions in _executors():
        assert all(isinstance(action, Action) for action in actions), name
        carried |= actions
    assert carried == set(Action)


@pytest.mark.parametrize(
    "spec", [s for s in SPECS if s.triage_detector], ids=lambda s: s.failure.value
)
def test_triage_detector_finds_its_failure(spec: FailureSpec) -> None:
    from trainguard.triage.detectors import default_detectors

    assert spec.triage_detector is not None
    detector = _resolve(spec.triage_detector)
    assert detector.failure is spec.failure
    assert any(isinstance(d, detector) for d in default_detectors())


def test_every_triage_detector_is_in_the_catalogue() -> None:
    from trainguard.triage.detectors import default_detectors

    named = {_resolve(s.triage_detector) for s in SPECS if s.triage_detector}
    assert {type(d) for d in default_detectors()} <= named


@pytest.mark.parametrize(
    "spec", [s for s in SPECS if s.diagnose_analysis], ids=lambda s: s.failure.value
)
def test_diagnose_analysis_exists(spec: FailureSpec) -> None:
    assert spec.diagnose_analysis is not None
    assert callable(_resolve(spec.diagnose_analysis))
