"""The remediation policy: alert name + label matchers -> an ordered plan of actions.

A policy is a YAML document (see ``default_policy.yaml``, shipped with the package)::

    version: 1
    rules:
      - alert: TrainingStraggler
        matchers: ['severity=~"warning|critical"']
        actions:
          - action: recommend
            params: {text: "rank $rank on $node is slow"}
          - action: exclude_node
            after_seconds: 600      # only once the alert has been firing this long
            cooldown_seconds: 3600  # overrides the service-wide cooldown
        verify_seconds: 300         # how long the plan (rung 0) gets to recover the job
        escalate:                   # the ladder: one step per rung, tried while not recovered
          - action: page
            verify_seconds: 600

Matchers use Alertmanager's syntax (``=``, ``!=``, ``=~``, ``!~``; regexes are anchored). The
first rule whose alert name and matchers all match decides the plan.

A rule whose plan or ladder holds an action other than ``recommend`` opens an incident, which
the verifier (:mod:`trainguard.remediation.verify`) follows rung by rung: rung 0 is the plan,
rung k the k-th ``escalate`` step. No rule may answer the service's own page
(``contract.REMEDIATION_FAILED_ALERT``): the service never acts on it.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from importlib import resources
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from trainguard import contract
from trainguard.contract import Action
from trainguard.remediation.actions import CATALOG

_MATCHER = re.compile(r'^\s*([A-Za-z_][A-Za-z0-9_]*)\s*(=~|!~|!=|=)\s*(?:"(.*)"|(.*?))\s*$')


class PolicyError(ValueError):
    """The policy file is missing, not YAML, or does not describe a valid policy."""


class Matcher(BaseModel):
    model_config = ConfigDict(frozen=True)

    label: str
    op: Literal["=", "!=", "=~", "!~"]
    value: str

    @classmethod
    def parse(cls, text: str) -> Matcher:
        match = _MATCHER.match(text)
        if match is None:
            raise ValueError(f"matcher {text!r} is not of the form label=value, !=, =~ or !~")
        label, op, quoted, bare = match.groups()
        value = quoted if quoted is not None else bare
        if op in ("=~", "!~"):
            try:
                re.compile(value)
            except re.error as exc:
                raise ValueError(f"matcher {text!r}: bad regex: {exc}") from exc
        return cls.model_validate({"label": label, "op": op, "value": value})

    def matches(self, labels: Mapping[str, str]) -> bool:
        actual = labels.get(self.label, "")
        if self.op == "=":
            return actual == self.value
        if self.op == "!=":
            return actual != self.value
        found = re.fullmatch(self.value, actual) is not None
        return found if self.op == "=~" else not found


class Step(BaseModel):
    """One action of a plan."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    action: Action
    params: dict[str, Any] = Field(default_factory=dict)
    after_seconds: float = Field(default=0.0, ge=0)
    cooldown_seconds: float | None = Field(default=None, ge=0)

    @field_validator("action", mode="before")
    @classmethod
    def _known(cls, value: Any) -> Action:
        try:
            action = Action(value)
        except ValueError:
            known = ", ".join(sorted(a.value for a in Action))
            raise ValueError(f"unknown action {value!r}; valid actions: {known}") from None
        if action not in CATALOG:  # every Action has an entry; a gap is a bug of ours
            raise ValueError(f"action {action.value!r} has no entry in the action catalogue")
        return action


class Rung(Step):
    """One rung of a ladder: a step tried when the rung before it did not recover the job."""

    verify_seconds: float | None = Field(
        default=None, gt=0, description="The rung's verification deadline; the action's default."
    )


class Rule(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    alert: str = Field(min_length=1)
    matchers: tuple[Matcher, ...] = ()
    actions: tuple[Step, ...] = Field(min_length=1)
    verify_seconds: float | None = Field(
        default=None, gt=0, description="The plan's (rung 0's) verification deadline."
    )
    escalate: tuple[Rung, ...] = ()

    @field_validator("alert")
    @classmethod
    def _not_our_page(cls, value: str) -> str:
        if value == contract.REMEDIATION_FAILED_ALERT:
            # Acting on its own page could loop: page, act, fail, page again.
            raise ValueError(f"the service never acts on its own page ({value})")
        return value

    @property
    def rungs(self) -> int:
        """How many rungs the ladder has: the plan, then each escalation step."""
        return 1 + len(self.escalate)

    def steps_of(self, rung: int) -> tuple[Step, ...]:
        return self.actions if rung == 0 else (self.escalate[rung - 1],)

    def rung_action(self, rung: int) -> Action:
        """The repair action of a rung: its first action other than ``recommend``."""
        steps = self.steps_of(rung)
        return next((s.action for s in steps if s.action is not Action.RECOMMEND), steps[0].action)

    @property
    def opens_incidents(self) -> bool:
        """Whether the rule repairs anything (and so opens an incident to verify the repair)."""
        return any(step.action is not Action.RECOMMEND for step in (*self.actions, *self.escalate))

    @field_validator("matchers", mode="before")
    @classmethod
    def _parse_matchers(cls, value: Any) -> Any:
        if isinstance(value, list):
            return tuple(Matcher.parse(m) if isinstance(m, str) else m for m in value)
        return value

    def matches(self, alertname: str, labels: Mapping[str, str]) -> bool:
        return alertname == self.alert and all(m.matches(labels) for m in self.matchers)


class Policy(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    version: Literal[1]
    rules: tuple[Rule, ...]

    def plan(self, alertname: str, labels: Mapping[str, str]) -> Rule | None:
        """The first rule that matches the alert, or None when no rule does."""
        for rule in self.rules:
            if rule.matches(alertname, labels):
                return rule
        return None

    def alerts(self) -> set[str]:
        return {rule.alert for rule in self.rules}


def parse_policy(text: str, source: str = "<policy>") -> Policy:
    try:
        document = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise PolicyError(f"{source}: not valid YAML: {exc}") from exc
    try:
        return Policy.model_validate(document)
    except ValidationError as exc:
        raise PolicyError(f"{source}: {exc}") from exc


def default_policy_text() -> str:
    """The default policy shipped with trainguard, as written."""
    return (
        resources.files("trainguard.remediation").joinpath("default_policy.yaml").read_text("utf-8")
    )


def load_policy(path: Path | None) -> Policy:
    """The policy at ``path``, or the default policy shipped with trainguard."""
    if path is None:
        return parse_policy(default_policy_text(), "default_policy.yaml")
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise PolicyError(f"cannot read policy {path}: {exc}") from exc
    return parse_policy(text, str(path))
