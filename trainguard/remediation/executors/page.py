"""The page executor: an incident the ladder could not repair, posted to Alertmanager for a human.

It posts one alert, ``contract.REMEDIATION_FAILED_ALERT``, to Alertmanager's
``/api/v2/alerts``, so that Alertmanager's routing, grouping, inhibitions and silences apply to
it as to every alert (the shipped routing sends it to the pager, never back to this service).
The alert is built in ``prepare`` from the incident (what was tried and how each try ended) and
stored as the action's snapshot; ``execute`` posts exactly that. Posting it again is harmless:
Alertmanager merges an alert posted twice with the same labels into one.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any

import httpx

from trainguard import contract
from trainguard.contract import Action
from trainguard.remediation import incident_views
from trainguard.remediation.executors import ActionRecord, ExecutionError
from trainguard.remediation.models import IncidentView

if TYPE_CHECKING:  # the store imports the engine, which routes pages here
    from trainguard.remediation.store import Store

ALERTS_PATH = "/api/v2/alerts"
# A page stays active this long unless a human resolves or silences it: without an endsAt,
# Alertmanager would resolve it after its resolve_timeout (5 minutes), and a pager that is sent
# resolved notifications would close the page before anyone looked.
PAGE_HOLD_SECONDS = 24 * 3600.0


def incident_path(incident_id: int) -> str:
    return f"/v1/incidents/{incident_id}"


def _iso(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, tz=timezone.utc).isoformat().replace("+00:00", "Z")


class PageExecutor:
    name = Action.PAGE.value
    actions: frozenset[Action] = frozenset({Action.PAGE})

    def __init__(
        self,
        store: Store,
        alertmanager_url: str | None,
        public_url: str,
        timeout: float,
        runbook_base_url: str,
    ) -> None:
        self._store = store
        self._alertmanager_url = alertmanager_url
        self._public_url = public_url.rstrip("/")
        self._timeout = timeout
        self._runbook_url = f"{runbook_base_url}#{contract.REMEDIATION_FAILED_ALERT.lower()}"

    def prepare(self, action: ActionRecord) -> dict[str, Any]:
        if not self._alertmanager_url:
            raise ExecutionError(
                "cannot page: no Alertmanager to post to; set "
                "TRAINGUARD_REMEDIATION_ALERTMANAGER_URL (--alertmanager-url)"
            )
        incident = self._store.read(lambda conn: incident_views.incident_of_action(conn, action.id))
        if incident is None:
            raise ExecutionError(f"cannot page: action #{action.id} belongs to no incident")
        return {"alert": self._alert(action, incident, time.time())}

    def _alert(self, action: ActionRecord, incident: IncidentView, now: float) -> dict[str, Any]:
        rung = next((t.rung for t in incident.tried if t.action_id == action.id), incident.rung)
        # The rung that failed last: the one before this page (the page itself when it is the
        # plan's own step).
        failed = max(rung - 1, 0)
        url = f"{self._public_url}{incident_path(incident.id)}"
        labels = {
            "alertname": contract.REMEDIATION_FAILED_ALERT,
            contract.LABEL_SEVERITY: contract.Severity.CRITICAL.value,
            contract.LABEL_JOB_ID: incident.job_id or "",
            contract.LABEL_FAILURE: incident.failure.value if incident.failure else "",
            contract.LABEL_INCIDENT: str(incident.id),
            contract.LABEL_RUNG: str(failed),
            contract.LABEL_NODE: incident.alert.labels.get(contract.LABEL_NODE, ""),
        }
        tried = "; ".join(
            f"rung {t.rung}: {t.action} (action #{t.action_id}"
            + (f" and {t.count - 1} more alike" if t.count > 1 else "")
            + f") {t.state}"
            + (f", {t.verdict}" if t.verdict else "")
            for t in incident.tried
            if t.action_id != action.id
        )
        what = incident.failure.value if incident.failure else incident.alert.name
        return {
            # Alertmanager refuses empty label values: a label it has no value for is left out.
            "labels": {name: value for name, value in labels.items() if value},
            "annotations": {
                contract.ANNOTATION_SUMMARY: (
                    f"Remediation did not recover {incident.subject} ({what}); incident "
                    f"{incident.id} needs a human"
                ),
                contract.ANNOTATION_DESCRIPTION: (
                    f"{incident.alert.name} on {incident.subject}: the service tried "
                    f"{tried or 'nothing'}. Last word: {incident.note}"
                ),
                contract.ANNOTATION_RUNBOOK_URL: self._runbook_url,
                "incident_url": url,
            },
            "startsAt": _iso(now),
            "endsAt": _iso(now + PAGE_HOLD_SECONDS),
            "generatorURL": url,
        }

    def execute(self, action: ActionRecord, snapshot: Mapping[str, Any]) -> dict[str, Any]:
        if not self._alertmanager_url:
            raise ExecutionError("cannot page: no Alertmanager URL is configured any more")
        url = self._alertmanager_url.rstrip("/") + ALERTS_PATH
        try:
            response = httpx.post(url, json=[snapshot["alert"]], timeout=self._timeout)
        except httpx.HTTPError as exc:
            raise ExecutionError(f"cannot page: posting to {url} failed: {exc!r}") from exc
        if response.status_code >= 300:
            raise ExecutionError(
                f"cannot page: Alertmanager answered {response.status_code}: {response.text[:500]}"
            )
        return {"paged": url, "labels": snapshot["alert"]["labels"]}
