"""The verifier: did a repair work? Climbs the ladder when it did not, and closes each incident.

An action's executor returning says nothing about training. The verifier, on a thread of its
own, looks at every open incident (:mod:`trainguard.remediation.incidents`) every
``verify_interval_seconds``:

- baseline: once, from Prometheus when one is configured: the job's highest ``trainguard_step``
  and its ranks up when the failure was detected (the alert's startsAt), and the first evidence
  (``ALERTS_FOR_STATE``, the alert's pending start);
- recovered, each alert of the incident by its catalogue's rule (:class:`contract.Recovery`):
  a state alert once it is resolved (Alertmanager said so, or Prometheus no longer has it
  firing); an event alert (an OOM, a timeout, a restart, an Xid: a count over a window, which
  keeps firing for its window whatever the job does) once no new event has been counted since
  the latest repair (since detection before any), a restart the repair itself made aside; and,
  for a job, once its step has passed its baseline and the step it had reached when the latest
  repair was carried out, and it has kept stepping for ``verify_progress_seconds`` since that
  repair (since detection for an event nothing repaired yet); without Prometheus, by the
  alerts resolving alone (the note says so);
- job ended: a job whose every rank withdrew cleanly (no target of it left, none down at its
  last scrape) is closed at once with the job's outcome ``finished``, never escalated: recovered
  when it had passed its target step with no new event, else ``job_ended``; what its rungs
  still had queued is cancelled;
- while a rung's actions are not done (pending, running, plan steps still to come) it waits;
  once they are, the rung has its verification deadline (the rule's or step's
  ``verify_seconds``, else the action's default) to recover; past it, the next rung is decided
  through the engine's guards (:meth:`Engine.escalate`). A rung the guards held back entirely
  (suppressed, skipped, rejected) is noted and the ladder moves on at once (actions cancelled
  because the alert resolved are not held back: the job still gets the deadline to progress);
- ladder exhausted: closed ``worse`` if fewer ranks are up than at detection (less those removed
  on purpose since), else ``not_recovered``; the job ``resumed`` if its step passed the baseline,
  else ``lost``.

Everything it knows is in the store, so a restarted service resumes where it was. Only the
process holding the store's worker lock verifies (replicas on one Postgres); each change is a
compare-and-set on the incident's rung and state, so no rung is climbed twice.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection

from trainguard import contract
from trainguard.background import BackgroundThread
from trainguard.contract import Action, IncidentOutcome, JobOutcome
from trainguard.remediation import decisions, incidents
from trainguard.remediation.actions import CATALOG, ActionKind
from trainguard.remediation.engine import Engine
from trainguard.remediation.incidents import UNFINISHED_STATES, OpenIncident
from trainguard.remediation.metrics import Metrics
from trainguard.remediation.models import IncidentState
from trainguard.remediation.policy import Rule
from trainguard.remediation.prometheus import Query, QueryError, Reads
from trainguard.remediation.recovery import Baseline, Ending, Judge, iso, repairs_done
from trainguard.remediation.settings import Settings
from trainguard.remediation.store import Store

log = logging.getLogger(__name__)

_ALONE = " (no Prometheus configured: verified by alert resolution alone)"


@dataclass(frozen=True)
class Deadlines:
    """Default verification deadlines by the kind of action a rung repairs with, and how long
    a job must keep training after a repair before it counts as recovered."""

    directive: float = 180.0
    restart: float = 300.0
    exclude: float = 300.0
    drain: float = 600.0
    other: float = 300.0
    progress: float = 60.0

    @classmethod
    def from_settings(cls, settings: Settings) -> Deadlines:
        return cls(
            directive=settings.verify_directive_seconds,
            restart=settings.verify_restart_seconds,
            exclude=settings.verify_exclude_seconds,
            drain=settings.verify_drain_seconds,
            other=settings.verify_page_seconds,
            progress=settings.verify_progress_seconds,
        )

    def of(self, action: Action) -> float:
        if CATALOG[action].kind is ActionKind.DIRECTIVE:
            return self.directive
        return {
            Action.RESTART_FROM_CHECKPOINT: self.restart,
            Action.EXCLUDE_NODE: self.exclude,
            Action.DRAIN_NODE: self.drain,
        }.get(action, self.other)


def _label(incident: OpenIncident) -> str:
    return "" if incident.failure is None else incident.failure.value


class Verifier(BackgroundThread):
    """Follows open incidents to their verdict; see the module's docstring."""

    def __init__(
        self,
        store: Store,
        engine: Engine,
        metrics: Metrics,
        deadlines: Deadlines,
        query: Query | None,
        *,
        interval: float,
        wake_worker: Callable[[], None],
    ) -> None:
        super().__init__("trainguard-remediation-verifier")
        self._store = store
        self._engine = engine
        self._metrics = metrics
        self._deadlines = deadlines
        self._reads = None if query is None else Reads(query)
        self._judge = Judge(self._reads, deadlines.progress)
        self._interval = interval
        self._wake_worker = wake_worker

    def run(self) -> None:
        while not self.stopping:
            try:
                # Replicas on one Postgres: only the one that executes actions verifies them.
                if self._store.hold_worker_lock():
                    self.verify_all()
                    self.follow_removals()
            except Exception:
                log.exception("remediation verifier turn failed")
            self.sleep(self._interval)

    def verify_all(self, now: float | None = None) -> None:
        """Look at every open incident once."""
        for incident in self._store.read(incidents.open_incidents):
            try:
                self._verify(incident, time.time() if now is None else now)
            except Exception:
                # One incident's trouble (a bad label, a store hiccup) must not stall the others.
                log.exception("verifying incident %d failed", incident.id)

    def follow_removals(self, now: float | None = None) -> None:
        """End the removals whose node is back in its job (see :mod:`.incidents`): vacated
        once no rank of the job is up on the node, rejoined when one is up there again.
        Without Prometheus a removal lasts for the life of the job's records."""
        if self._reads is None:
            return
        at = time.time() if now is None else now
        for removal in self._store.read(incidents.active_removals):
            try:
                up = self._reads.ranks_up(removal.job_id, at, removal.node)
            except Exception:
                log.exception("reading the ranks of %s on %s failed", removal.job_id, removal.node)
                continue
            action_id = removal.action_id
            if removal.vacated_at is None and up == 0:
                self._store.write_sync(
                    functools.partial(incidents.vacate, action_id=action_id, at=at)
                )
            elif removal.vacated_at is not None and up > 0:
                self._store.write_sync(
                    functools.partial(incidents.rejoin, action_id=action_id, at=at)
                )
                log.info(
                    "node %s is back in job %s (%d rank(s) up): its alerts are acted on again "
                    "(removed by action #%d)",
                    removal.node,
                    removal.job_id,
                    up,
                    removal.action_id,
                )

    # --- one incident ----------------------------------------------------------------------
    def _verify(self, incident: OpenIncident, now: float) -> None:
        changes: dict[str, Any] = {}
        baseline = Baseline(
            incident.baseline_step, incident.baseline_ranks_up, incident.baseline_at
        )
        notes: list[str] = []
        if self._reads is not None and baseline.at is None:
            try:
                changes.update(self._read_baseline(incident, baseline, now))
            except QueryError as exc:
                notes.append(f"no baseline yet (Prometheus: {exc})")
        acted = self._acted(incident)
        if acted is not None and incident.acted_at is None:
            changes["acted_at"] = acted[0]
        try:
            recovered, why = self._judge.recovered(incident, baseline, now)
        except QueryError as exc:
            recovered, why = False, f"cannot tell whether it recovered (Prometheus: {exc})"
        if self._reads is None:
            why += _ALONE
        if recovered:
            job = JobOutcome.RESUMED if baseline.step is not None else None
            self._close(incident, now, IncidentOutcome.RECOVERED, job, why, changes, True)
            return
        if incident.job_id is not None and self._reads is not None:
            try:
                ending = self._judge.ended(incident, baseline, now, self._removed_nodes(incident))
            except QueryError as exc:
                notes.append(f"cannot tell whether the job ended (Prometheus: {exc})")
            else:
                if ending is not None:
                    self._close_ended(incident, now, ending, changes)
                    return
        why = "; ".join([*notes, why])
        rule = self._engine.policy.plan(incident.ladder.name, incident.ladder.labels)
        on_rung = [a for a in incident.actions if a.rung == incident.rung]
        pending = [a for a in on_rung if a.state in UNFINISHED_STATES]
        if pending or (incident.rung == 0 and incident.deferred):
            waiting = ", ".join(f"#{a.id} {a.action.value} ({a.state.value})" for a in pending)
            note = f"rung {incident.rung} acting: waiting for {waiting or 'plan steps still due'}"
            acting = IncidentState.ACTING.value
            self._update(incident, changes, state=acting, deadline_at=None, note=f"{note}; {why}")
            return
        # Every repair of the rung held back (its actions read here are those not held back).
        if incident.held_repairs and not any(a.action is not Action.RECOMMEND for a in on_rung):
            self._climb(incident, rule, now, {}, f"rung {incident.rung} held back", changes)
            return
        finished = [a.updated_at for a in on_rung]
        if incident.held_last_at is not None:
            finished.append(incident.held_last_at)
        finished_at = max(finished, default=incident.rung_started_at)
        seconds = self._verify_seconds(incident, rule)
        deadline = finished_at + seconds
        if now < deadline:
            note = (
                f"verifying rung {incident.rung} ({incident.rung_action}) until "
                f"{iso(deadline)}: {why}"
            )
            verifying = IncidentState.VERIFYING.value
            self._update(incident, changes, state=verifying, deadline_at=deadline, note=note)
            return
        verdicts = {a.id: f"did not recover within {seconds:g}s" for a in on_rung}
        failed = f"rung {incident.rung} ({incident.rung_action}) did not recover it: {why}"
        self._climb(incident, rule, now, verdicts, failed, changes)

    def _verify_seconds(self, incident: OpenIncident, rule: Rule | None) -> float:
        if rule is not None and incident.rung < rule.rungs:
            own = (
                rule.verify_seconds
                if incident.rung == 0
                else rule.escalate[incident.rung - 1].verify_seconds
            )
            if own is not None:
                return own
        tried = {
            a.action
            for a in incident.actions
            if a.rung == incident.rung and a.action is not Action.RECOMMEND
        }
        # Several repairs on one rung (dump, then restart): the slowest one's deadline.
        return max(
            (self._deadlines.of(action) for action in tried),
            default=self._deadlines.of(Action(incident.rung_action)),
        )

    def _climb(
        self,
        incident: OpenIncident,
        rule: Rule | None,
        now: float,
        verdicts: Mapping[int, str],
        why: str,
        changes: dict[str, Any],
    ) -> None:
        rung = incident.rung + 1
        if rule is None or rung >= rule.rungs:
            self._close_unrecovered(incident, now, verdicts, why, changes)
            return
        step = rule.escalate[rung - 1]
        due = incident.ladder.starts_at + step.after_seconds
        if now < due:
            note = f"{why}; rung {rung} ({step.action.value}) is due at {iso(due)}"
            self._update(incident, changes, note=note)
            return
        if changes:
            self._update(incident, changes)
        note = f"{why}; escalated to rung {rung}: {step.action.value}"
        planned = self._store.write_sync(
            self._engine.escalate(
                incident.id,
                incident.rung,
                step,
                len(rule.actions) + rung - 1,
                incident.ladder,
                verdicts,
                note,
                now,
            )
        )
        if planned is None:
            return
        self._metrics.escalations.labels(_label(incident), step.action.value).inc()
        self._metrics.record_decisions(planned.decisions)
        log.warning("incident %d: %s", incident.id, note)
        if planned.queued:
            self._wake_worker()

    def _close_unrecovered(
        self,
        incident: OpenIncident,
        now: float,
        verdicts: Mapping[int, str],
        why: str,
        changes: dict[str, Any],
    ) -> None:
        outcome, job = IncidentOutcome.NOT_RECOVERED, None
        step = changes.get("baseline_step", incident.baseline_step)
        ranks = changes.get("baseline_ranks_up", incident.baseline_ranks_up)
        note = f"{why}; the ladder is exhausted"
        if self._reads is not None and incident.job_id is not None and step is not None:
            try:
                current = self._reads.step(incident.job_id, now)
                passed = current is not None and current > step
                job = JobOutcome.RESUMED if passed else JobOutcome.LOST
                if ranks is not None:
                    up = self._reads.ranks_up(incident.job_id, now)
                    removed = self._removed_ranks(incident)
                    if up < ranks - removed:
                        outcome = IncidentOutcome.WORSE
                        note += f"; {up} rank(s) up against {ranks} at detection" + (
                            f" less {removed} removed on purpose" if removed else ""
                        )
            except QueryError as exc:
                note += f"; could not judge the job's state (Prometheus: {exc})"
        self._close(incident, now, outcome, job, note, changes, False, verdicts)

    def _close_ended(
        self, incident: OpenIncident, now: float, ending: Ending, changes: dict[str, Any]
    ) -> None:
        """The job ended normally: closed with the job's outcome, never escalated; whatever its
        rungs still had queued is cancelled."""
        recovered = ending.outcome is IncidentOutcome.RECOVERED
        verdicts = (
            None
            if recovered
            else {a.id: "the job ended" for a in incident.actions if a.rung == incident.rung}
        )
        self._close(
            incident,
            now,
            ending.outcome,
            JobOutcome.FINISHED,
            ending.note,
            changes,
            recovered,
            verdicts,
            cancel="the job ended normally before it ran",
        )

    def _close(
        self,
        incident: OpenIncident,
        now: float,
        outcome: IncidentOutcome,
        job: JobOutcome | None,
        note: str,
        changes: dict[str, Any],
        recovered: bool,
        verdicts: Mapping[int, str] | None = None,
        cancel: str | None = None,
    ) -> None:
        """Close the incident; ``cancel``: the reason its actions not yet carried out are
        cancelled with (none are otherwise: a resolving alert cancels its own)."""
        if recovered:
            verdicts = {a.id: "recovered" for a in incident.actions if a.rung == incident.rung}
        values = {
            **changes,
            "state": IncidentState.CLOSED.value,
            "outcome": outcome.value,
            "job_outcome": None if job is None else job.value,
            "recovered_at": now if recovered else None,
            "closed_at": now,
            "deadline_at": None,
            "note": note,
        }

        def unit(conn: Connection) -> bool:
            if not incidents.update(conn, incident.id, incident.rung, **values):
                return False
            incidents.set_verdicts(conn, verdicts or {})
            if cancel is not None:
                decisions.cancel_pending_of_incident(conn, incident.id, cancel)
            return True

        if not self._store.write_sync(unit):
            return
        self._observe(incident, now, outcome, job, changes, recovered)
        level = logging.INFO if recovered else logging.WARNING
        log.log(level, "incident %d closed %s: %s", incident.id, outcome.value, note)

    def _observe(
        self,
        incident: OpenIncident,
        now: float,
        outcome: IncidentOutcome,
        job: JobOutcome | None,
        changes: Mapping[str, Any],
        recovered: bool,
    ) -> None:
        failure, m = _label(incident), self._metrics
        m.incidents.labels(failure, outcome.value).inc()
        if job is not None:
            m.incident_jobs.labels(failure, job.value).inc()
        first = changes.get("first_evidence_at", incident.first_evidence_at)
        if first is not None:
            m.time_to_detect.labels(failure).observe(max(0.0, incident.received_at - first))
        acted = self._acted(incident)
        if acted is not None:
            m.time_to_act.labels(failure, acted[1].value).observe(
                max(0.0, acted[0] - incident.detected_at)
            )
        if recovered:
            m.time_to_recover.labels(failure, incident.rung_action).observe(
                max(0.0, now - incident.detected_at)
            )

    def _update(self, incident: OpenIncident, changes: dict[str, Any], **columns: Any) -> None:
        values = {**changes, **columns}
        current = {
            "state": incident.state.value,
            "deadline_at": incident.deadline_at,
            "note": incident.note,
        }
        if all(current.get(name, object()) == value for name, value in values.items()):
            return  # nothing new: no write every turn for an incident that waits
        self._store.write_sync(
            lambda conn: incidents.update(conn, incident.id, incident.rung, **values)
        )
        changes.clear()

    # --- what the world says ---------------------------------------------------------------
    @staticmethod
    def _acted(incident: OpenIncident) -> tuple[float, Action] | None:
        """When the first repair was carried out, and which."""
        return min(repairs_done(incident), key=lambda found: found[0], default=None)

    def _read_baseline(
        self, incident: OpenIncident, baseline: Baseline, now: float
    ) -> dict[str, Any]:
        assert self._reads is not None
        if incident.job_id is not None:
            baseline.step = self._reads.step(incident.job_id, incident.detected_at)
            baseline.ranks_up = self._reads.ranks_up(incident.job_id, incident.detected_at)
        baseline.at = now
        opener = incident.alerts[0]
        identity = {
            name: opener.labels[name]
            for name in (*contract.RANK_IDENTITY_LABELS, contract.LABEL_GPU)
            if opener.labels.get(name)
        }
        pending = self._reads.pending_since(opener.name, identity, incident.received_at)
        first = incident.detected_at if pending is None else pending
        return {
            "baseline_step": baseline.step,
            "baseline_ranks_up": baseline.ranks_up,
            "baseline_at": now,
            "first_evidence_at": min(first, incident.detected_at),
        }

    def _removed_nodes(self, incident: OpenIncident) -> set[str]:
        """The job's nodes removed on purpose since the failure was detected."""
        assert incident.job_id is not None
        job_id = incident.job_id
        removals = self._store.read(
            lambda conn: incidents.removals_since(conn, job_id, incident.detected_at)
        )
        return {node for _, node in removals}

    def _removed_ranks(self, incident: OpenIncident) -> int:
        """Ranks of the job on nodes removed on purpose since the failure was detected, as many
        as each such node had up then."""
        assert incident.job_id is not None and self._reads is not None
        return sum(
            self._reads.ranks_up(incident.job_id, incident.detected_at, node)
            for node in self._removed_nodes(incident)
        )
