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

Matchers use Alertmanager's syntax (``=``, ``!=``, ``=~``, ``!~``; regexes are anchored). The
first rule whose alert name and matchers all match decides the plan.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from importlib import resources
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

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


class Rule(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    alert: str = Field(min_length=1)
    matchers: tuple[Matcher, ...] = ()
    actions: tuple[Step, ...] = Field(min_length=1)

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


def load_policy(path: Path | None) -> Policy:
    """The policy at ``path``, or the default policy shipped with trainguard."""
    if path is None:
        text = (
            resources.files("trainguard.remediation")
            .joinpath("default_policy.yaml")
            .read_text("utf-8")
        )
        return parse_policy(text, "default_policy.yaml")
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise PolicyError(f"cannot read policy {path}: {exc}") from exc
    return parse_policy(text, str(path))
