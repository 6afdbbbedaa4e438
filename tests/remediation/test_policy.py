"""The policy: the shipped default covers every alert; matchers and errors behave."""

from __future__ import annotations

from pathlib import Path

import pytest

from trainguard import contract
from trainguard.cli import main as trainguard_main
from trainguard.contract import Action
from trainguard.remediation.actions import CATALOG, ActionKind
from trainguard.remediation.policy import Matcher, PolicyError, load_policy, parse_policy


def test_default_policy_covers_every_alert_of_the_contract() -> None:
    policy = load_policy(None)
    assert policy.alerts() == {alert.value for alert in contract.Alert}
    for alert in contract.Alert:
        rule = policy.plan(alert.value, {"job_id": "j", "node": "n"})
        assert rule is not None and rule.actions, alert


def test_default_policy_follows_the_design() -> None:
    policy = load_policy(None)

    def plan(name: str) -> list[Action]:
        rule = policy.plan(name, {})
        assert rule is not None
        return [step.action for step in rule.actions]

    assert plan("TrainingCollectiveStalled") == [
        Action.DUMP_DIAGNOSTICS,
        Action.RESTART_FROM_CHECKPOINT,
    ]
    assert plan("TrainingStraggler")[-1] is Action.EXCLUDE_NODE
    assert plan("TrainingOOM")[0] is Action.SPLIT_MICRO_BATCHES
    assert plan("TrainingDataLoaderBound") == [Action.RECOMMEND]
    straggler = policy.plan("TrainingStraggler", {})
    assert straggler is not None and straggler.actions[-1].after_seconds > 0


def test_catalogue_marks_scheduler_changes_destructive() -> None:
    destructive = {name for name, spec in CATALOG.items() if spec.destructive}
    assert destructive == {Action.RESTART_FROM_CHECKPOINT, Action.EXCLUDE_NODE, Action.DRAIN_NODE}
    assert all(
        not spec.destructive for spec in CATALOG.values() if spec.kind is ActionKind.DIRECTIVE
    )


@pytest.mark.parametrize(
    ("text", "labels", "expected"),
    [
        ("severity=critical", {"severity": "critical"}, True),
        ('severity="critical"', {"severity": "warning"}, False),
        ("severity!=critical", {"severity": "warning"}, True),
        ("node=~gpu-[0-9]+", {"node": "gpu-12"}, True),
        ("node=~gpu-[0-9]+", {"node": "xgpu-12"}, False),  # anchored like Prometheus
        ("node!~gpu-.*", {"node": "cpu-1"}, True),
        ("job_id=", {}, True),  # a missing label is the empty string
    ],
)
def test_matchers(text: str, labels: dict[str, str], expected: bool) -> None:
    assert Matcher.parse(text).matches(labels) is expected


def test_first_matching_rule_wins() -> None:
    policy = parse_policy(
        """
version: 1
rules:
  - alert: TrainingOOM
    matchers: ['job_id=~"big-.*"']
    actions: [{action: recommend, params: {text: big}}]
  - alert: TrainingOOM
    actions: [{action: split_micro_batches}]
"""
    )
    big = policy.plan("TrainingOOM", {"job_id": "big-1"})
    small = policy.plan("TrainingOOM", {"job_id": "small"})
    assert big is not None and big.actions[0].action is Action.RECOMMEND
    assert small is not None and small.actions[0].action is Action.SPLIT_MICRO_BATCHES
    assert policy.plan("TrainingStraggler", {}) is None


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("version: 1\nrules: [{alert: X, actions: [{action: reboot}]}]", "unknown action 'reboot'"),
        ("version: 2\nrules: []", "version"),
        ("version: 1\nrules: [{alert: X, actions: []}]", "actions"),
        (
            "version: 1\nrules: [{alert: X, matchers: ['a=~('], actions: [{action: recommend}]}]",
            "bad regex",
        ),
        (
            "version: 1\nrules: [{alert: X, matchers: ['not a matcher'], "
            "actions: [{action: recommend}]}]",
            "not of the form",
        ),
        ("version: 1\nrules: [{alert: X, actions: [{action: recommend, after: 3}]}]", "after"),
        ("version: [1", "not valid YAML"),
    ],
    ids=["action", "version", "empty", "regex", "matcher", "extra-key", "yaml"],
)
def test_invalid_policies_are_refused(text: str, message: str) -> None:
    with pytest.raises(PolicyError, match=message):
        parse_policy(text)


def test_check_policy_command(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert trainguard_main(["remediation", "--check-policy"]) == 0
    assert f"for {len(contract.Alert)} alerts" in capsys.readouterr().out
    bad = tmp_path / "bad.yaml"
    bad.write_text("version: 1\nrules: [{alert: X, actions: [{action: reboot}]}]\n")
    assert trainguard_main(["remediation", "--check-policy", "--policy", str(bad)]) == 1
    assert "unknown action" in capsys.readouterr().err
    assert trainguard_main(["remediation", "--db", str(tmp_path / "db")]) == 2
    assert "no bearer token" in capsys.readouterr().err
    missing = ["--insecure-no-auth", "--policy", str(tmp_path / "none.yaml")]
    assert trainguard_main(["remediation", *missing]) == 2
    assert "cannot read policy" in capsys.readouterr().err
