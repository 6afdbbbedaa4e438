"""Recovered yet? How the verifier judges an open incident from what Prometheus says.

Each alert of the incident is judged by its catalogue's rule (:class:`contract.Recovery`,
``docs/catalogue.md`` lists it per alert):

- a state (a straggler, a stall, a rank down) once it is resolved: Alertmanager said so, or
  Prometheus no longer has it firing;
- an event counted over a window (an OOM, a collective timeout, a restart, an Xid) once no new
  event has been counted since the latest repair (since detection before any): such an alert
  keeps firing for its window after the event whatever the job does, so its resolving says
  nothing of the repair. The restart of the workers a repair makes (a restart, an exclusion or
  a drain: the survivors restart too) is the repair's, not a new event;

and then, for a job, its step must have passed the step it had reached at detection and when
the latest repair was carried out, and it must have kept stepping for the progress window since
that repair (since detection for an event nothing has repaired yet: the job recovered alone,
as the hook's OOM guard recovers a step, and shows it by training on). Without Prometheus the
alerts' resolving is all there is.

A job whose every rank withdrew cleanly (no target of it listed, none down at its last scrape,
ranks on nodes removed on purpose aside) has ended normally: :meth:`Judge.ended` says how its
incident closes, never by climbing the ladder: recovered if the job had passed its target step
with no new event and no state alert still firing, else ``job_ended`` (the repair could not be
judged).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from datetime import datetime, timezone

from trainguard import contract
from trainguard.contract import Action, IncidentOutcome
from trainguard.remediation.incidents import AlertFacts, OpenIncident
from trainguard.remediation.models import ActionState, AlertStatus
from trainguard.remediation.prometheus import Reads

# Repairs that restart the job's workers: the elastic agents' restart count rises once with each
# (the survivors of an exclusion or a drain restart too), and that rise is the repair's.
_RESTARTING = (Action.RESTART_FROM_CHECKPOINT, Action.EXCLUDE_NODE, Action.DRAIN_NODE)


def iso(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, tz=timezone.utc).isoformat(timespec="seconds")


@functools.cache
def event_alert(name: str) -> contract.EventAlert | None:
    """What the alert ``name`` counts when the catalogue says it counts events over a window
    (:attr:`contract.Recovery.NO_NEW_EVENT`); None for a state, or an alert not trainguard's."""
    try:
        alert = contract.Alert(name)
    except ValueError:
        return None
    return contract.FAILURES.event_alert(alert)


def repairs_done(incident: OpenIncident) -> list[tuple[float, Action]]:
    """(when, what) of the incident's repairs carried out: not advice, not a page."""
    return [
        (a.updated_at, a.action)
        for a in incident.actions
        if a.state is ActionState.SUCCEEDED and a.action not in (Action.RECOMMEND, Action.PAGE)
    ]


def last_repair(incident: OpenIncident) -> float | None:
    """When the latest repair was carried out."""
    return max((at for at, _ in repairs_done(incident)), default=None)


@dataclass
class Baseline:
    """The job as it was when the failure was detected (read once, ``at``)."""

    step: int | None
    ranks_up: int | None
    at: float | None


@dataclass(frozen=True)
class Ending:
    """How an incident closes when its job ended normally."""

    outcome: IncidentOutcome
    note: str


def _names(alerts: list[AlertFacts]) -> str:
    return ", ".join(sorted({a.name for a in alerts}))


def _since(repaired: float | None) -> str:
    return "detection" if repaired is None else f"the repair at {iso(repaired)}"


class Judge:
    """Judges an incident against Prometheus (``reads``; None: by its alerts alone);
    ``progress``: how long a job must keep stepping after a repair."""

    def __init__(self, reads: Reads | None, progress: float) -> None:
        self._reads = reads
        self._progress = progress

    def recovered(self, incident: OpenIncident, baseline: Baseline, now: float) -> tuple[bool, str]:
        """Whether the incident has recovered, and what says so (or what is still missing)."""
        reads = self._reads
        events = [a for a in incident.alerts if event_alert(a.name) is not None]
        states = [a for a in incident.alerts if event_alert(a.name) is None]
        firing = [a for a in states if a.status is AlertStatus.FIRING]
        if reads is None:
            # No Prometheus to count events with: an event alert is judged by its resolving too.
            firing += [a for a in events if a.status is AlertStatus.FIRING]
        else:
            # Alertmanager tells of a resolution late (group_interval) or, if it lost it, never.
            firing = [a for a in firing if reads.firing(a.name, a.labels, now)]
        if firing:
            return False, f"{_names(firing)} still firing"
        if reads is None:
            return True, "its alerts resolved"
        repaired = last_repair(incident)
        cleared = self._cleared(states, events, repaired)
        new = self.new_events(incident, events, now)
        if new:
            return False, f"{'; '.join(new)} since {_since(repaired)}"
        # An event is over the moment it is counted: recovered is the job (or the node) going
        # on without another, for a while.
        watch_from = repaired if repaired is not None or not events else incident.detected_at
        window = self._progress
        if incident.job_id is None:
            if watch_from is not None and now < watch_from + window:
                return False, f"{cleared}; watching for new events until {iso(watch_from + window)}"
            return True, cleared
        if baseline.at is None:
            return False, f"{cleared}; the job's progress is not known yet"
        if baseline.step is None:
            return True, (
                f"{cleared}; the job reported no trainguard_step at detection, so its "
                "progress was not checked"
            )
        target = self.target(incident, baseline)
        assert target is not None
        step = reads.step(incident.job_id, now)
        if step is None or step <= target:
            at = "no step reported" if step is None else f"at step {step}"
            return False, f"{cleared} but job {incident.job_id} has not passed step {target} ({at})"
        passed = f"{cleared} and job {incident.job_id} passed step {target} (now {step})"
        if watch_from is not None:
            # An executor returns before the repair has taken: ranks stopped by an exclusion
            # or a restart finish a step or two first, past the step read when it returned.
            # Recovered is training that goes on for a while after the repair.
            until = watch_from + window
            if now < until:
                return False, f"{passed}; watching it keep training until {iso(until)}"
            earlier = reads.step(incident.job_id, now - window)
            if earlier is None or step <= earlier:
                return False, f"{passed}, but made no progress in the last {window:g}s"
        return True, passed

    def target(self, incident: OpenIncident, baseline: Baseline) -> int | None:
        """The step the job must pass: its step at detection, or at the latest repair if later
        (a job that kept stepping through the incident, a straggler, passed the first long
        before the repair took; a restart resumes from an earlier checkpoint and has to catch
        up first)."""
        target = baseline.step
        repaired = last_repair(incident)
        if target is None or repaired is None or incident.job_id is None or self._reads is None:
            return target
        return max(target, self._reads.step(incident.job_id, repaired) or target)

    @staticmethod
    def _cleared(states: list[AlertFacts], events: list[AlertFacts], repaired: float | None) -> str:
        """What each alert's rule has established so far."""
        parts = []
        if states:
            parts.append("its alerts resolved" if not events else f"{_names(states)} resolved")
        if events:
            parts.append(f"no new {_names(events)} event since {_since(repaired)}")
        return " and ".join(parts)

    def new_events(self, incident: OpenIncident, events: list[AlertFacts], now: float) -> list[str]:
        """The events the incident's event alerts counted since its latest repair (since
        detection before any), each count read once over its alert's subject (its job, else
        its node and GPU)."""
        reads = self._reads
        if reads is None or not events:
            return []
        repaired = last_repair(incident)
        since = incident.detected_at if repaired is None else repaired
        found = []
        seen: set[tuple[str, tuple[tuple[str, str], ...]]] = set()
        for alert in events:
            event = event_alert(alert.name)
            assert event is not None
            scope = _scope(alert)
            key = (event.count.name, tuple(sorted(scope.items())))
            if key in seen:
                continue
            seen.add(key)
            if event.count.kind is contract.MetricKind.COUNTER:
                count = reads.increase(event.count.name, scope, since, now)
                if count > 0.5:
                    found.append(f"{count:.0f} new {alert.name} event(s) ({event.count.name})")
                continue
            # A count that rises by one per event (the job's restarts): its rise since, less one
            # for each repair since that restarted the workers. A drop (the job relaunched,
            # counting from 0) is no event.
            before = reads.highest(event.count.name, scope, since)
            after = reads.highest(event.count.name, scope, now)
            if before is None or after is None:
                continue
            own = sum(
                1 for at, action in repairs_done(incident) if at >= since and action in _RESTARTING
            )
            rise = after - before - own
            if rise > 0.5:
                mine = f", {own} of them the repair's" if own else ""
                found.append(
                    f"{rise:.0f} new {alert.name} event(s) ({event.count.name} rose to "
                    f"{after:.0f}{mine})"
                )
        return found

    def ended(
        self, incident: OpenIncident, baseline: Baseline, now: float, removed: set[str]
    ) -> Ending | None:
        """How the incident closes if its job ended normally (else None): recovered if it had
        passed its target step with no new event, else ``job_ended``. ``removed``: the job's
        nodes removed on purpose (their ranks were stopped, not crashed)."""
        reads = self._reads
        if reads is None or incident.job_id is None:
            return None
        job_id = incident.job_id
        if reads.listed(job_id, now):
            return None  # a target of the job is still scraped: it runs, or it is down
        # A rank that crashed was down at its last scrape (its target expired, or a restart on
        # another port left it behind): not an end.
        if reads.down_at_last_scrape(job_id, incident.detected_at, now) - removed:
            return None
        step = reads.last_step(job_id, incident.detected_at, now)
        if step is None:
            return None  # no step within the incident: nothing says it trained to an end
        target = self.target(incident, baseline)
        events = [a for a in incident.alerts if event_alert(a.name) is not None]
        new = self.new_events(incident, events, now)
        # A state still firing when the job ended (as Alertmanager last told) was never seen
        # to clear: the job's end says nothing of it.
        firing = [
            a
            for a in incident.alerts
            if event_alert(a.name) is None and a.status is AlertStatus.FIRING
        ]
        note = f"job {job_id} ended normally at step {step} (every rank withdrew cleanly)"
        if target is not None and step > target and not new and not firing:
            return Ending(IncidentOutcome.RECOVERED, f"{note}, past step {target}, no new failure")
        if new:
            missing = "; ".join(new)
        elif firing:
            missing = f"{_names(firing)} still firing"
        else:
            missing = "its target step unknown" if target is None else f"short of step {target}"
        return Ending(
            IncidentOutcome.JOB_ENDED, f"{note} before its repair could be judged ({missing})"
        )


def _scope(alert: AlertFacts) -> dict[str, str]:
    """The subject an alert's events are counted over: its job, else its node (and GPU)."""
    job_id = alert.labels.get(contract.LABEL_JOB_ID)
    if job_id:
        return {contract.LABEL_JOB_ID: job_id}
    scope = {contract.LABEL_NODE: alert.labels.get(contract.LABEL_NODE, "")}
    gpu = alert.labels.get(contract.LABEL_GPU)
    if gpu:
        scope[contract.LABEL_GPU] = gpu
    return scope
