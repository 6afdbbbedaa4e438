"""Alert rules of the ``rank_failure`` failure: a rank's process died or stopped answering."""

from __future__ import annotations

from trainguard import contract
from trainguard.alerts.promql import RANK, RANK_UP, J, R, on_scheduler_of_job
from trainguard.alerts.rule import ALERT_RULES, WHO, AlertRule
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
    """The ranks whose elastic agent restarted them within ``rank_restart_window``: a rank of
    the job died and torchrun brought the worker group back (``TrainingRankDown`` cannot see
    it: every rank restarts, none stays down while the others run). A job that re-formed
    smaller in the window (an excluded node: the survivors restart without it) is left to the
    membership rules.
    """
    restarts, world = contract.ELASTIC_RESTARTS.name, contract.WORLD_SIZE.name
    window = t.rank_restart_window
    rose = (
        f"max by ({RANK}) (\n  max_over_time({restarts}[{window}])"
        f" - min_over_time({restarts}[{window}])\n) > 0"
    )
    shrank = f"max by ({J}) (max_over_time({world}[{window}]))\n> max by ({J}) ({world})"
    return AlertRule(
        alert=Alert.TRAINING_RANK_RESTARTED,
        severity=Severity.WARNING,
        # Cover: the jobs whose ranks report the gauge (the condition needs it).
        expr=on_scheduler_of_job(f"{rose}\nunless on ({J}) (\n{shrank}\n)", restarts),
        summary="Rank {{ $labels.rank }} of job {{ $labels.job_id }} was restarted",
        description=f"torchrun's elastic agent restarted {WHO} within the last {window} "
        "(TORCHELASTIC_RESTART_COUNT rose): a rank of the job died, every rank of its worker "
        "group was restarted and the job resumed from its last checkpoint. The agents' logs "
        "name the worker that failed first (`trainguard triage` on them, `trainguard diagnose "
        "--logs` with them).",
    )


@ALERT_RULES.register(Failure.RANK_FAILURE)
def rules(t: Thresholds) -> list[AlertRule]:
    return [_rank_down(t), _rank_restarted(t)]
