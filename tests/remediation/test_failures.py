"""Remediation records speak the failure vocabulary: every decision, action and audit record
names the failure (``contract.Failure``) of the alert it answers, and actions are
``contract.Action`` members whose wire values stay plain strings."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest

from tests.remediation.conftest import (
    AUTH,
    alert,
    both_backends,
    drained,
    notify,
    payload,
    serve,
    wait_for,
)
from trainguard import contract
from trainguard.contract import Action, Failure
from trainguard.remediation.actions import CATALOG, failure_of
from trainguard.remediation.executors import ActionRecord
from trainguard.remediation.policy import PolicyError, load_policy, parse_policy
from trainguard.remediation.settings import Settings


def _events(caplog: pytest.LogCaptureFixture, kind: contract.EventKind) -> list[logging.LogRecord]:
    return [
        r for r in caplog.records if getattr(r, contract.FIELD_EVENT_ACTION, None) == kind.value
    ]


def _actions(client: Any) -> list[dict[str, Any]]:
    listed: list[dict[str, Any]] = client.get("/v1/actions", headers=AUTH).json()["actions"]
    return listed


@both_backends
def test_a_training_oom_alert_yields_records_of_failure_oom(
    settings: Settings, caplog: pytest.LogCaptureFixture
) -> None:
    live = settings.model_copy(update={"dry_run": False, "directive_ack_settle_seconds": 0.0})
    caplog.set_level(logging.INFO)
    with serve(live) as client:
        planned = notify(
            client, payload(alert(contract.Alert.TRAINING_OOM.value, job_id="j", rank="0"))
        )["planned_actions"]
        # The default policy's plan for TrainingOOM: split micro-batches, then advise.
        actions = _actions(client)
        assert [a["action"] for a in reversed(actions)] == [
            Action.SPLIT_MICRO_BATCHES.value,
            Action.RECOMMEND.value,
        ]
        assert {a["failure"] for a in actions} == {Failure.OOM.value}
        for action_id in planned:
            view = client.get(f"/v1/actions/{action_id}", headers=AUTH).json()
            assert view["failure"] == Failure.OOM.value
        # The directive reaches the ranks as the action's wire value.
        offered: list[dict[str, Any]] = []

        def poll() -> bool:
            offered[:] = client.get(
                "/v1/directives", params={"job_id": "j", "rank": 0, "wait": 0}, headers=AUTH
            ).json()["directives"]
            return bool(offered)

        wait_for(poll)
        (directive,) = offered
        assert directive["kind"] == Action.SPLIT_MICRO_BATCHES.value
        client.post(
            f"/v1/directives/{directive['id']}/ack", json={"rank": 0}, headers=AUTH
        ).raise_for_status()
        wait_for(lambda: {a["state"] for a in _actions(client)} == {"succeeded"})

    decisions = _events(caplog, contract.EventKind.DECISION)
    assert len(decisions) == 2
    assert {getattr(r, contract.FIELD_FAILURE) for r in decisions} == {Failure.OOM.value}
    assert {getattr(r, contract.FIELD_DETAILS)["action"] for r in decisions} == {
        Action.SPLIT_MICRO_BATCHES.value,
        Action.RECOMMEND.value,
    }
    executed = _events(caplog, contract.EventKind.ACTION)
    assert len(executed) == 2
    assert {getattr(r, contract.FIELD_FAILURE) for r in executed} == {Failure.OOM.value}
    # Messages and details carry the value, never the enum's repr.
    assert all("Action." not in r.getMessage() for r in decisions + executed)


def test_an_alert_that_is_not_ours_has_no_failure(
    settings: Settings, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    policy = tmp_path / "policy.yaml"
    policy.write_text(
        "version: 1\nrules:\n"
        "  - alert: SomeoneElsesAlert\n"
        "    actions: [{action: recommend, params: {text: look at $job_id}}]\n"
    )
    caplog.set_level(logging.INFO)
    with serve(settings.model_copy(update={"policy_file": policy})) as client:
        client.post(
            "/v1/alertmanager", json=payload(alert("SomeoneElsesAlert", job_id="j")), headers=AUTH
        ).raise_for_status()
        drained(client)
        (action,) = _actions(client)
    assert action["action"] == Action.RECOMMEND.value and action["failure"] is None
    (decision,) = _events(caplog, contract.EventKind.DECISION)
    assert not hasattr(decision, contract.FIELD_FAILURE)


def test_failure_of_an_alertname() -> None:
    for spec in contract.FAILURES.values():
        for alert_ in spec.alerts:
            assert failure_of(alert_.value) is spec.failure
    assert failure_of("SomeoneElsesAlert") is None
    record = ActionRecord(
        id=1,
        action=Action.RECOMMEND,
        executor="recommend",
        subject="j",
        params={},
        alertname=contract.Alert.GPU_XID_ERROR.value,
        labels={},
    )
    assert record.failure is Failure.GPU_FAULT


def test_an_action_record_holds_an_action() -> None:
    record = ActionRecord(
        id=1,
        action="exclude_node",  # type: ignore[arg-type]  # as the store hands it over
        executor="local",
        subject="j",
        params={},
        alertname="TrainingStraggler",
        labels={},
    )
    assert record.action is Action.EXCLUDE_NODE


def test_policy_steps_are_actions_and_unknown_names_list_the_valid_ones() -> None:
    policy = parse_policy("version: 1\nrules: [{alert: X, actions: [{action: drain_node}]}]")
    assert policy.rules[0].actions[0].action is Action.DRAIN_NODE
    with pytest.raises(PolicyError) as raised:
        parse_policy("version: 1\nrules: [{alert: X, actions: [{action: reboot}]}]")
    message = str(raised.value)
    assert "unknown action 'reboot'" in message
    assert all(action.value in message for action in Action)


def test_every_action_is_catalogued() -> None:
    assert set(CATALOG) == set(Action)
    assert all(spec.name is action for action, spec in CATALOG.items())


@pytest.mark.parametrize("spec", list(contract.FAILURES.values()), ids=lambda s: s.failure.value)
def test_the_default_policy_plans_the_catalogued_actions(spec: contract.FailureSpec) -> None:
    policy = load_policy(None)
    planned = {
        step.action
        for rule in policy.rules
        if rule.alert in {a.value for a in spec.alerts}
        for step in rule.actions
    }
    assert planned == set(spec.actions)
