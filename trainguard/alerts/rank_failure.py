"""Alert and recording rules of the ``rank_failure`` failure: a rank's process died or stopped
answering."""

from __future__ import annotations

from trainguard import contract
from trainguard.alerts.promql import RANK, RANK_UP, J, R, on_scheduler_of_job
from trainguard.alerts.rule import (
    ALERT_RULES,
    RECORDING_RULES,
    WHO,
    AlertRule,
    Recorded,
    RecordingGroup,
)
from trainguard.contract import Alert, Failure, Severity
from trainguard.thresholds import Thresholds


def _left_out(window: str) -> str:
    """Ranks (job_id, rank) the job re-formed without: the last index a rank reported (kept for
    ``window``, so a vanished target still has one) at or above the world size its job's live
    ranks report now.

    A job that excludes a node or scales down re-forms smaller; the ranks it left behind are at
    or above the new world size. Where either value is unknown (a hook without the gauges,
    ranks that have not reported yet) no rank is taken for left out.
    """
    return (
        f"  max by ({J}, {R}) (last_over_time({contract.RANK_INDEX.name}[{window}]))\n"
        f"  >= on ({J}) group_left ()\n"
        f"  max by ({J}) ({contract.WORLD_SIZE.name})"
    )


def _complete() -> str:
    """Jobs whose every member is up: as many distinct live ranks as their world size. Any
    other rank of such a job is not a member, however long ago it reported its index (a killed
    rank's ``file_sd`` target can stay listed, and down, for the rest of the job)."""
    return (
        f"  count by ({J}) (group by ({J}, {R}) ({RANK_UP} == 1))\n"
        f"  >= on ({J})\n"
        f"  max by ({J}) ({contract.WORLD_SIZE.name})"
    )


def _rank_down(t: Thresholds) -> AlertRule:
    """A member rank's endpoint down (up 0) or gone (target vanished) while its job still
    runs; ranks the job re-formed without are not down, they were left out.

    Down or gone is one set: every rank seen within ``rank_absent_window`` unless it is up
    now (a rank whose target is up again elsewhere, with another node or local rank, is up).
    """
    up_now = f"{RANK_UP} == 1"
    rank_down = (
        f"group by ({RANK}) (max_over_time({RANK_UP}[{t.rank_absent_window}]))\n"
        f"unless on ({J}, {R}) ({up_now})\n"
        f"and on ({J}) ({up_now})\n"
        f"unless on ({J}, {R}) (\n{_left_out(t.rank_absent_window)}\n)\n"
        f"unless on ({J}) (\n{_complete()}\n)"
    )
    return AlertRule(
        alert=Alert.TRAINING_RANK_DOWN,
        severity=Severity.CRITICAL,
        expr=on_scheduler_of_job(rank_down, up_now),
        for_=t.rank_down_for,
        summary="Rank {{ $labels.rank }} of job {{ $labels.job_id }} is down",
        description=f"The metrics endpoint of {WHO} is down or gone while other ranks of the "
        "job still run; the survivors will block at their next collective.",
    )


def _rank_restarted(t: Thresholds) -> AlertRule:
    """A job whose elastic agents restarted its worker group within ``rank_restart_window``: a
    rank died and torchrun brought the group back (``TrainingRankDown`` cannot see it: every
    rank restarts, none stays down while the others run). One alert per restart, labelled with
    the job's restart count, firing for the window.

    The count is the job's (the highest of its ranks': every agent counts the group's restarts,
    and a rank that comes back on another port is the same rank), read over the window rather
    than at the instant, so the scrapes a restart misses (its ranks are down meanwhile) neither
    resolve the alert nor fire it again. Restarts that re-formed the job at another world size
    (a node excluded, drained or added: the survivors restart with it) are the membership's:
    each change of the world size in the window explains one restart, so a restart after an
    exclusion still fires at once. A count that drops (the job relaunched by its scheduler,
    counting from 0 again) is no restart.
    """
    window = t.rank_restart_window
    count = f"last_over_time({contract.REC_JOB_ELASTIC_RESTARTS}[{window}])"
    rose = f"{count} - min_over_time({contract.REC_JOB_ELASTIC_RESTARTS}[{window}])"
    resized = f"changes({contract.REC_JOB_WORLD_SIZE}[{window}])"
    return AlertRule(
        alert=Alert.TRAINING_RANK_RESTARTED,
        severity=Severity.WARNING,
        # Cover: the jobs whose ranks report the count (the condition needs it).
        expr=on_scheduler_of_job(
            f"{count}\nand on ({J}) (\n  {rose}\n  > on ({J})\n  {resized}\n)",
            contract.REC_JOB_ELASTIC_RESTARTS,
        ),
        labels={contract.LABEL_RESTARTS: "{{ $value }}"},
        summary="The workers of job {{ $labels.job_id }} were restarted (restart {{ $value }})",
        description="torchrun's elastic agents restarted the worker group of job "
        "{{ $labels.job_id }} within the last " + window + " (TORCHELASTIC_RESTART_COUNT rose "
        "to {{ $value }}, and the job re-formed at the same size): a rank of the "
        "job died, every rank was restarted and the job resumed from its last checkpoint. The "
        "agents' logs name the worker that failed first (`trainguard triage` on them, "
        "`trainguard diagnose --logs` with them).",
    )


@RECORDING_RULES.register(Failure.RANK_FAILURE)
def recording(t: Thresholds) -> list[Recorded]:
    """The job's restart count and world size, one series per job: the restart alert reads
    their history over its window, whichever ranks and ports reported them."""
    health = RecordingGroup.RANKS_HEALTH
    return [
        Recorded(
            health,
            contract.REC_JOB_ELASTIC_RESTARTS,
            f"max by ({J}) ({contract.ELASTIC_RESTARTS.name})",
        ),
        Recorded(health, contract.REC_JOB_WORLD_SIZE, f"max by ({J}) ({contract.WORLD_SIZE.name})"),
    ]


@ALERT_RULES.register(Failure.RANK_FAILURE)
def rules(t: Thresholds) -> list[AlertRule]:
    return [_rank_down(t), _rank_restarted(t)]
