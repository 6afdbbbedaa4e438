"""A ``trainguard diagnose`` report attached to every action the service carries out.

When ``diagnose_prometheus_url`` is set, the worker hands each finished action (succeeded or
failed) to :class:`ReportAttacher`, which diagnoses the action's job on its own thread and
stores the Markdown and JSON report beside the action. ``GET /v1/actions/{id}/report``
(:mod:`trainguard.remediation.report_api`) serves it, and the action's audit view links to it.
The diagnosis runs after the outcome is committed and every failure of it is stored as the
report's ``error``: it never fails, delays or repeats an action. Charts are not drawn here
(they need matplotlib; ``trainguard diagnose`` draws them).

The report's Validate section is the job's incidents as the store holds them when the report is
written (:func:`trainguard.remediation.incident_views.list_incidents`, the documents of
``GET /v1/incidents?job_id=``): right after a repair its incident is usually still being
verified, and the report of a later rung (a page included) shows the rungs before it. Incidents
that cannot be read leave the report without them and say why in that section.
"""

from __future__ import annotations

import json
import logging
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field
from sqlalchemy import Connection, text

from trainguard import contract
from trainguard.remediation.executors import ActionRecord
from trainguard.remediation.incident_views import list_incidents
from trainguard.remediation.store import Store
from trainguard.thresholds import Thresholds

log = logging.getLogger(__name__)


INCIDENTS_SOURCE = "this service's incidents"


def report_path(action_id: int) -> str:
    return f"/v1/actions/{action_id}/report"


class ActionReport(BaseModel):
    """The diagnosis of an action's job, made right after the action finished."""

    action_id: int
    job_id: str
    created_at: datetime
    markdown: str | None = Field(description="The incident report (Markdown); null on error.")
    report: dict[str, Any] | None = Field(description="The same report as JSON; null on error.")
    error: str | None = Field(description="Why no report could be made (Prometheus down, ...).")


_HAS_REPORT = text("SELECT 1 FROM reports WHERE action_id = :action_id")
_REPORT = text("SELECT * FROM reports WHERE action_id = :action_id")
_STORE_REPORT = text("""
    INSERT INTO reports (action_id, job_id, created_at, markdown, report, error)
    VALUES (:action_id, :job_id, :created_at, :markdown, :report, :error)
    ON CONFLICT (action_id) DO UPDATE SET
        job_id = excluded.job_id, created_at = excluded.created_at,
        markdown = excluded.markdown, report = excluded.report, error = excluded.error
    """)


def has_report(conn: Connection, action_id: int) -> bool:
    return conn.execute(_HAS_REPORT, {"action_id": action_id}).first() is not None


def get_report(conn: Connection, action_id: int) -> ActionReport | None:
    row = conn.execute(_REPORT, {"action_id": action_id}).mappings().first()
    if row is None:
        return None
    return ActionReport(
        action_id=row["action_id"],
        job_id=row["job_id"],
        created_at=datetime.fromtimestamp(row["created_at"], tz=timezone.utc),
        markdown=row["markdown"],
        report=None if row["report"] is None else json.loads(row["report"]),
        error=row["error"],
    )


class ReportAttacher:
    """Diagnoses the job of each finished action on one background thread, in order."""

    def __init__(
        self,
        store: Store,
        prometheus_url: str,
        thresholds: Thresholds,
        *,
        window_seconds: float,
        timeout_seconds: float,
        dumps_dir: Path | None = None,
    ) -> None:
        self._store = store
        self._url = prometheus_url
        self._thresholds = thresholds
        self._window = window_seconds
        self._timeout = timeout_seconds
        self._dumps = dumps_dir
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="trainguard-remediation-diagnose")

    def submit(self, record: ActionRecord) -> None:
        self._pool.submit(self._attach, record.id, record.labels.get(contract.LABEL_JOB_ID))

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)

    def _incidents(self, job_id: str) -> tuple[list[dict[str, Any]] | None, str | None]:
        """The job's incidents as ``GET /v1/incidents?job_id=`` answers them, or why not."""
        try:
            views = self._store.read(lambda conn: list_incidents(conn, job_id=job_id))
        except Exception as exc:
            # The report stands without them; its Validate section names the gap.
            log.warning("incidents of job %s not read for its report: %s", job_id, exc)
            return None, f"the service's store could not be read: {exc or type(exc).__name__}"
        return [view.model_dump(mode="json") for view in views], None

    def _attach(self, action_id: int, job_id: str | None) -> None:
        markdown = report = error = None
        if not job_id:
            error = f"the alert has no {contract.LABEL_JOB_ID} label: no job to diagnose"
        else:
            try:
                from trainguard.diagnose import diagnose
                from trainguard.diagnose.render import as_json
                from trainguard.diagnose.render import markdown as render_markdown

                incidents, gap = self._incidents(job_id)
                result = diagnose(
                    self._url,
                    job_id,
                    thresholds=self._thresholds,
                    since_seconds=self._window,
                    dumps=self._dumps,
                    timeout=self._timeout,
                    incidents=incidents,
                    incidents_source=INCIDENTS_SOURCE,
                    incidents_gap=gap,
                )
                markdown, report = render_markdown(result), as_json(result)
            except Exception as exc:
                # Whatever goes wrong (Prometheus down, no data, a bug), the action stands and
                # the report says why it is missing.
                log.warning("diagnosis for action %d (job %s) failed: %s", action_id, job_id, exc)
                error = str(exc) or repr(exc)
        row = {
            "action_id": action_id,
            "job_id": job_id or "",
            "created_at": time.time(),
            "markdown": markdown,
            "report": report,
            "error": error,
        }
        try:
            self._store.write_sync(lambda conn: conn.execute(_STORE_REPORT, row))
        except Exception:
            log.exception("could not store the diagnosis of action %d", action_id)
