"""The catalogue of actions a policy may name, and what each needs.

An action is carried out by the executor its kind calls for: scheduler actions by the executor
of the job's scheduler (label ``scheduler``: local torchrun, Kubernetes, Slurm), directives by
the directive queue the ranks poll, recommendations by recording them in the audit trail.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from trainguard import contract


class ActionKind(str, enum.Enum):
    SCHEDULER = "scheduler"
    DIRECTIVE = "directive"
    RECOMMEND = "recommend"


@dataclass(frozen=True)
class ActionSpec:
    name: str
    kind: ActionKind
    destructive: bool
    # Alert labels the action cannot do without.
    needs: tuple[str, ...]
    description: str


def _spec(
    name: str, kind: ActionKind, destructive: bool, needs: tuple[str, ...], description: str
) -> ActionSpec:
    return ActionSpec(name, kind, destructive, needs, description)


_JOB = (contract.LABEL_JOB_ID,)
_NODE = (contract.LABEL_NODE,)

CATALOG: dict[str, ActionSpec] = {
    spec.name: spec
    for spec in (
        _spec(
            "restart_from_checkpoint",
            ActionKind.SCHEDULER,
            True,
            _JOB,
            "Restart the job's workers; the training script resumes from its last checkpoint.",
        ),
        _spec(
            "exclude_node",
            ActionKind.SCHEDULER,
            True,
            (*_JOB, *_NODE),
            "Take the alert's node out of the job and let the rest carry on without it.",
        ),
        _spec(
            "drain_node",
            ActionKind.SCHEDULER,
            True,
            _NODE,
            "Stop scheduling work on the node (Kubernetes cordon, Slurm drain).",
        ),
        _spec(
            "annotate",
            ActionKind.SCHEDULER,
            False,
            _JOB,
            "Mark the job with the alert (Kubernetes pod annotations, Slurm job comment).",
        ),
        _spec("checkpoint_now", ActionKind.DIRECTIVE, False, _JOB, "Ranks save a checkpoint."),
        _spec(
            "dump_diagnostics",
            ActionKind.DIRECTIVE,
            False,
            _JOB,
            "Ranks dump the Flight Recorder and every thread's stack.",
        ),
        _spec(
            "set_grad_compression",
            ActionKind.DIRECTIVE,
            False,
            _JOB,
            "Ranks switch the DDP gradient compression hook (params: compression).",
        ),
        _spec(
            "split_micro_batches",
            ActionKind.DIRECTIVE,
            False,
            _JOB,
            "Ranks split each batch into micro-batches, accumulating gradients (params: factor).",
        ),
        _spec(
            "set_collective_timeout",
            ActionKind.DIRECTIVE,
            False,
            _JOB,
            "Ranks set the collective timeout of their process group (params: seconds).",
        ),
        _spec(
            "recommend",
            ActionKind.RECOMMEND,
            False,
            (),
            "Record advice for a human in the audit trail (params: text, $label substitution).",
        ),
    )
}
