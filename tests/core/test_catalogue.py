"""The failure catalogue agrees with every part that acts on it, and the code dispatches through it.

``contract.FAILURES`` says, per failure, which alerts report it, which metrics those alerts read
and who emits them, which thresholds and dashboards belong to it, where its runbook section and
its promtool tests are, and what the default policy does; the components register their code
for it in modules named after it. Each test here reads the other side (the rendered rules, the
runbook, the default policy, the action catalogue, the executors, the registrations of triage,
diagnose and the demo, the dashboards, the thresholds file) and fails when the two disagree.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.alerts.tools import RULE_TESTS, RULES_FILE
from trainguard import contract
from trainguard.alerts import runbook
from trainguard.contract import FAILURES, Action, Alert, Cause, Failure, FailureSpec
from trainguard.diagnose.analysis import ANALYSES, AnalysisOrderError, ordered
from trainguard.thresholds import GENERAL_KEYS, Thresholds
from trainguard.triage.detectors import DETECTORS, default_detectors
from trainguard.triage.detectors.base import DetectorType

SPECS = list(FAILURES.values())
_RECORDED = re.compile(r"\b[a-z_]+:[a-z0-9_]+:[a-z0-9_]+\b")
DASHBOARD_DIR = Path(__file__).resolve().parents[2] / "trainguard" / "dashboards"


def _rules() -> list[dict[str, Any]]:
    document = yaml.safe_load(RULES_FILE.read_text())
    return [rule for group in document["groups"] for rule in group["rules"]]


_RECORDING = {rule["record"]: rule["expr"] for rule in _rules() if "record" in rule}


def _expanded(expr: str, depth: int = 0) -> str:
    """``expr`` with every recording rule it reads replaced by that rule's own expression."""
    assert depth < 10, "recording rules refer to each other in a cycle"
    return _RECORDED.sub(
        lambda m: _expanded(_RECORDING[m[0]], depth + 1) if m[0] in _RECORDING else m[0],
        expr,
    )


def test_every_failure_has_one_entry_and_every_alert_one_failure() -> None:
    assert set(FAILURES) == set(Failure)
    assert [spec.failure for spec in SPECS] == list(FAILURES)
    alerts = FAILURES.alerts()
    assert sorted(alerts) == sorted(Alert), "each alert belongs to exactly one failure"
    for spec in SPECS:
        for alert in spec.alerts:
            assert contract.failure_of(alert) is spec.failure


def test_a_catalogue_refuses_a_failure_twice_and_an_alert_of_two_failures() -> None:
    oom = FAILURES[Failure.OOM]
    with pytest.raises(ValueError, match="twice"):
        FAILURES.with_failure(oom)
    borrowed = dataclasses.replace(FAILURES[Failure.HANG], alerts=(Alert.TRAINING_OOM,))
    with pytest.raises(ValueError, match="two failures"):
        contract.Catalogue((oom, borrowed))


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: s.failure.value)
def test_the_rules_of_a_failure_read_its_signals(spec: FailureSpec) -> None:
    by_alert: dict[str, list[str]] = {}
    for rule in _rules():
        if "alert" in rule:
            by_alert.setdefault(rule["alert"], []).append(_expanded(rule["expr"]))
    assert set(by_alert) == {alert.value for alert in Alert}
    bases = [signal.client_name for signal in spec.signals]
    for alert in spec.alerts:
        for expr in by_alert[alert.value]:
            assert any(base in expr for base in bases), (alert.value, bases, expr)


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: s.failure.value)
def test_every_signal_has_a_producer(spec: FailureSpec) -> None:
    produced = set(contract.RANK_METRICS) | set(contract.NODE_METRICS)
    assert spec.signals and set(spec.signals) <= produced
    assert spec.producers


def test_every_threshold_belongs_to_a_failure_or_to_all_of_them() -> None:
    keys = [f.name for f in dataclasses.fields(Thresholds)]
    named = [key for spec in SPECS for key in spec.thresholds]
    assert len(named) == len(set(named)), "a threshold is named by two failures"
    assert set(named) <= set(keys), set(named) - set(keys)
    assert set(named) | set(GENERAL_KEYS) == set(keys)
    assert not set(named) & set(GENERAL_KEYS)


@pytest.mark.parametrize("spec", [s for s in SPECS if s.alerts], ids=lambda s: s.failure.value)
def test_a_failures_alerts_judge_by_its_thresholds(spec: FailureSpec) -> None:
    """Change each of the failure's thresholds and its alerts' rules change."""
    from trainguard.alerts.rules import rules_of
    from trainguard.thresholds import load_default

    shipped = load_default()
    before = [rule.render(shipped.runbook_base_url) for rule in rules_of(spec, shipped)]
    for key in spec.thresholds:
        t = dataclasses.replace(shipped, **{key: _changed(getattr(shipped, key))})
        after = [rule.render(t.runbook_base_url) for rule in rules_of(spec, t)]
        recorded = _recording_of(t)
        assert after != before or recorded != _recording_of(shipped), key


def _changed(value: Any) -> Any:
    """Another valid value of a threshold: a longer duration, a bigger number, a longer list,
    another regular expression."""
    if isinstance(value, str):
        return value + "1" if value[-1].isalpha() else value + "x"
    if isinstance(value, tuple):
        return (*value, 999)
    return value * 1.5 if isinstance(value, float) else value + 1


def _recording_of(t: Thresholds) -> list[dict[str, str]]:
    from trainguard.alerts.recording import recording_rules

    return recording_rules(t)


def _dashboards() -> dict[str, str]:
    """Dashboard uid -> every query of its panels, recording rules expanded."""
    found = {}
    for path in DASHBOARD_DIR.glob("*.json"):
        board = json.loads(path.read_text())
        exprs = [
            target.get("expr", "")
            for panel in board.get("panels", [])
            for target in panel.get("targets", [])
        ]
        found[board["uid"]] = "\n".join(_expanded(expr) for expr in exprs)
    return found


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: s.failure.value)
def test_the_dashboards_of_a_failure_show_its_signals(spec: FailureSpec) -> None:
    boards = _dashboards()
    assert spec.dashboards
    for uid in spec.dashboards:
        assert uid in boards, uid
        assert any(signal.client_name in boards[uid] for signal in spec.signals), uid


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: s.failure.value)
def test_a_failure_with_alerts_has_promtool_tests_that_fire_each(spec: FailureSpec) -> None:
    path = next((p for p in RULE_TESTS if p.name == f"{spec.failure.value}.test.yml"), None)
    if not spec.alerts:
        assert path is None
        return
    assert path is not None, f"tests/alerts/{spec.failure.value}.test.yml"
    fired: set[str] = set()
    for case in yaml.safe_load(path.read_text())["tests"]:
        for check in case.get("alert_rule_test", []):
            if check.get("exp_alerts"):
                fired.add(check["alertname"])
    assert fired == {alert.value for alert in spec.alerts}


def test_every_promtool_file_named_after_a_failure_is_of_a_catalogued_one() -> None:
    values = {failure.value for failure in Failure}
    areas = {"scheduler", "reliability", "reliability-week"}
    for path in RULE_TESTS:
        name = path.name.removesuffix(".test.yml")
        assert name in values or name in areas, path.name


def test_the_runbook_says_what_the_catalogue_and_the_registrations_say() -> None:
    text = runbook.packaged_text()
    assert runbook.check(text) == []
    sections = runbook.sections(text)
    detectors = dict(FAILURES.implementations(DETECTORS))
    analyses = dict(FAILURES.implementations(ANALYSES))
    for spec in SPECS:
        said = runbook.parts(sections[spec.runbook_anchor])
        detector = detectors.get(spec)
        if detector is None:
            assert said["Triage"].startswith("none"), spec.failure
        else:
            assert f"`{detector.__module__}`" in said["Triage"], spec.failure
            assert f"`{getattr(detector, '__name__', '')}`" in said["Triage"], spec.failure
        entry = analyses.get(spec)
        if entry is None:
            assert said["Diagnose"].startswith("none"), spec.failure
        else:
            assert f"`{entry.analyse.__module__}`" in said["Diagnose"], spec.failure


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


def test_each_triage_detector_is_registered_in_its_failures_module() -> None:
    from trainguard.thresholds import load_default

    registered: list[tuple[FailureSpec, DetectorType]] = FAILURES.implementations(DETECTORS)
    assert registered
    for spec, detector in registered:
        assert detector.failure is spec.failure
        assert detector.__module__ == f"trainguard.triage.detectors.{spec.failure.value}"
    built = default_detectors(load_default())
    classes: list[object] = [detector for _, detector in registered]
    assert [type(d) for d in built] == classes


def test_each_analysis_is_registered_in_the_module_of_a_failure_it_explains() -> None:
    registered = FAILURES.implementations(ANALYSES)
    explained: dict[str, set[Failure]] = {}
    for spec, entry in registered:
        explained.setdefault(entry.analyse.__module__, set()).add(spec.failure)
    for module, failures in explained.items():
        assert module.rsplit(".", 1)[1] in {f.value for f in failures}, module
    # The catalogue's order runs every analysis after those it reads.
    assert len(ordered()) == len(explained)


def test_an_analysis_ordered_before_one_it_reads_is_refused() -> None:
    straggler = FAILURES[Failure.STRAGGLER]
    first = contract.Catalogue((straggler, *(s for s in SPECS if s is not straggler)))
    with pytest.raises(AnalysisOrderError, match="straggler reads"):
        ordered(first)


def test_every_cause_belongs_to_a_catalogued_failure() -> None:
    for cause in Cause:
        assert cause.failure in FAILURES, cause


def test_the_catalogue_page_is_what_the_code_has() -> None:
    from trainguard.catalogue import render

    page = Path(__file__).resolve().parents[2] / "docs" / "catalogue.md"
    assert page.read_text() == render(), "stale: run `trainguard catalogue`"
    for spec in SPECS:
        assert f"[`{spec.failure.value}`]" in page.read_text()
