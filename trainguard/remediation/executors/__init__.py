"""Executors: what carries out an action on the scheduler a job runs on.

Each executor implements two steps. ``prepare`` looks at the world without changing it and
returns a *snapshot* of the targets (the worker processes, the pods and their UIDs, the Slurm
job's restart count); the worker commits the snapshot with the ``running`` state before it calls
``execute``. ``execute`` acts only on what the snapshot names and is idempotent given it: run
twice (because the service was killed between acting and recording the result) it changes
nothing the second time. That is how an action runs exactly once across ``kill -9``.

Some actions are not done when ``execute`` returns: a directive is only carried out once the
ranks acknowledge it. Their executors (:class:`AwaitingExecutor`) also answer ``progress``: given
what ``execute`` returned (stored with the action, so a restarted worker resumes the wait rather
than acting again), is the action still waiting, or finished, and how.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from trainguard.contract import Action, Failure
from trainguard.remediation.actions import failure_of


class ExecutionError(RuntimeError):
    """The action could not be carried out; the message says why."""


@dataclass(frozen=True)
class ActionRecord:
    """What an executor gets to know about an action."""

    id: int
    action: Action
    executor: str
    subject: str
    params: Mapping[str, Any]
    alertname: str
    labels: Mapping[str, str]

    def __post_init__(self) -> None:
        # The store holds the name; executors compare against Action members.
        object.__setattr__(self, "action", Action(self.action))

    @property
    def failure(self) -> Failure | None:
        """The failure the action's alert reports; None for an alert not of trainguard's."""
        return failure_of(self.alertname)


class Executor(Protocol):
    """Carries out the actions it names for one scheduler or channel."""

    name: str
    actions: frozenset[Action]

    def prepare(self, action: ActionRecord) -> dict[str, Any]: ...

    def execute(self, action: ActionRecord, snapshot: Mapping[str, Any]) -> dict[str, Any]: ...


@dataclass(frozen=True)
class Waiting:
    """The action is carried out but not done; ``until`` (a ``time.time()`` instant) is when its
    outcome can next change without news from outside (a timeout)."""

    until: float
    note: str


@dataclass(frozen=True)
class Finished:
    """How an action that waited ended; ``seconds`` from carrying it out to the outcome."""

    succeeded: bool
    note: str
    output: dict[str, Any]
    seconds: float


@runtime_checkable
class AwaitingExecutor(Executor, Protocol):
    """An executor whose actions finish after ``execute`` returns, when others report back."""

    def progress(
        self, action: ActionRecord, output: Mapping[str, Any], now: float
    ) -> Waiting | Finished: ...


class RecommendExecutor:
    """Records advice; nothing outside the audit trail changes."""

    name = Action.RECOMMEND.value
    actions: frozenset[Action] = frozenset({Action.RECOMMEND})

    def prepare(self, action: ActionRecord) -> dict[str, Any]:
        return {}

    def execute(self, action: ActionRecord, snapshot: Mapping[str, Any]) -> dict[str, Any]:
        return {"recommendation": str(action.params.get("text", ""))}
