"""The catalogue of actions a policy may name, and what each needs.

An action is carried out by the executor its kind calls for: scheduler actions by the executor
of the job's scheduler (label ``scheduler``: local torchrun, Kubernetes, Slurm), directives by
the directive queue the ranks poll, recommendations by recording them in the audit trail, pages
by posting the service's own alert to Alertmanager.
"""

from __future__ import annotations

import enum
import functools
from dataclasses import dataclass

from trainguard import contract
from trainguard.contract import Action


class ActionKind(str, enum.Enum):
    SCHEDULER = "scheduler"
    DIRECTIVE = "directive"
    RECOMMEND = Action.RECOMMEND.value
    PAGE = Action.PAGE.value


@dataclass(frozen=True)
class ActionSpec:
    name: Action
    kind: ActionKind
    destructive: bool
    # Alert labels the action cannot do without.
    needs: tuple[str, ...]
    description: str


def _spec(
    name: Action, kind: ActionKind, destructive: bool, needs: tuple[str, ...], description: str
) -> ActionSpec:
    return ActionSpec(name, kind, destructive, needs, description)


_JOB = (contract.LABEL_JOB_ID,)
_NODE = (contract.LABEL_NODE,)

CATALOG: dict[Action, ActionSpec] = {
    spec.name: spec
    for spec in (
        _spec(
            Action.RESTART_FROM_CHECKPOINT,
            ActionKind.SCHEDULER,
            True,
            _JOB,
            "Restart the job's workers; the training script resumes from its last checkpoint.",
        ),
        _spec(
            Action.EXCLUDE_NODE,
            ActionKind.SCHEDULER,
            True,
            (*_JOB, *_NODE),
            "Take the alert's node out of the job and let the rest carry on without it.",
        ),
        _spec(
            Action.DRAIN_NODE,
            ActionKind.SCHEDULER,
            True,
            _NODE,
            "Stop scheduling work on the node (Kubernetes cordon, Slurm drain).",
        ),
        _spec(
            Action.ANNOTATE,
            ActionKind.SCHEDULER,
            False,
            _JOB,
            "Mark the job with the alert (Kubernetes pod annotations, Slurm job comment).",
        ),
        _spec(Action.CHECKPOINT_NOW, ActionKind.DIRECTIVE, False, _JOB, "Ranks save a checkpoint."),
        _spec(
            Action.DUMP_DIAGNOSTICS,
            ActionKind.DIRECTIVE,
            False,
            _JOB,
            "Ranks dump the Flight Recorder and every thread's stack.",
        ),
        _spec(
            Action.SET_GRAD_COMPRESSION,
            ActionKind.DIRECTIVE,
            False,
            _JOB,
            "Ranks switch the DDP gradient compression hook (params: compression).",
        ),
        _spec(
            Action.SPLIT_MICRO_BATCHES,
            ActionKind.DIRECTIVE,
            False,
            _JOB,
            "Ranks split each batch into micro-batches, accumulating gradients (params: factor).",
        ),
        _spec(
            Action.SET_COLLECTIVE_TIMEOUT,
            ActionKind.DIRECTIVE,
            False,
            _JOB,
            "Ranks set the collective timeout of their process group (params: seconds).",
        ),
        _spec(
            Action.RECOMMEND,
            ActionKind.RECOMMEND,
            False,
            (),
            "Record advice for a human in the audit trail (params: text, $label substitution).",
        ),
        _spec(
            Action.PAGE,
            ActionKind.PAGE,
            False,
            (),
            "Post the incident to Alertmanager as a critical alert, for a human (a ladder's last "
            "rung).",
        ),
    )
}


@functools.lru_cache(maxsize=256)
def failure_of(alertname: str) -> contract.Failure | None:
    """The failure an alert reports (``contract.failure_of``); None when the alert is not one
    of trainguard's (a policy may have rules for anyone's alerts). Cached: the webhook asks for
    every decision, and the answer is fixed by the contract."""
    try:
        return contract.failure_of(contract.Alert(alertname))
    except (ValueError, KeyError):
        return None
