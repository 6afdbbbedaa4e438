"""Validate: what the remediation service did about the job, and whether training recovered.

The service keeps one incident per failure it acts on (``GET /v1/incidents?job_id=``, one
IncidentView document each): the rungs of its ladder it tried, when training recovered or the
human it paged. They reach the report from the service itself (:func:`fetch`), from a saved
copy of that answer (:func:`load_file`) or from the caller (the service passes its own).
:func:`validate` checks each document, keeps the job's, computes the durations between its
milestones and says whether this report's diagnosis saw the failure the service acted on.
Incidents that cannot be read are a gap the report names, never an error that stops it.
"""

from __future__ import annotations

import enum
import json
from collections.abc import Mapping, Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, TypeVar

from trainguard.contract import FAILURES, Failure, IncidentOutcome, JobOutcome
from trainguard.diagnose.model import IncidentRecord, Report, RungTried, Validation

INCIDENTS_PATH = "/v1/incidents"

# A hang the service acted on may be diagnosed as the NCCL timeout it became, and the reverse.
E = TypeVar("E", bound=enum.Enum)


class IncidentsError(RuntimeError):
    """The incidents could not be read: the service unreachable or refusing, a file that is
    not an incidents document, or one incident document that is malformed."""


def fetch(url: str, job_id: str, token: str | None, timeout: float = 10.0) -> list[Any]:
    """The job's incidents from the remediation service at ``url``."""
    import httpx

    headers = {"Authorization": f"Bearer {token}"} if token else {}
    where = f"the remediation service at {url}"
    try:
        response = httpx.get(
            url.rstrip("/") + INCIDENTS_PATH,
            params={"job_id": job_id},
            headers=headers,
            timeout=timeout,
        )
    except httpx.InvalidURL as exc:
        raise IncidentsError(f"{where}: not a URL ({exc})") from exc
    except httpx.HTTPError as exc:
        raise IncidentsError(f"{where} is unreachable: {exc or type(exc).__name__}") from exc
    if response.status_code in (401, 403):
        raise IncidentsError(
            f"{where} refused the token (HTTP {response.status_code}); give it with "
            "--remediation-token-file or TRAINGUARD_REMEDIATION_TOKEN"
        )
    if response.status_code != 200:
        raise IncidentsError(f"{where} answered HTTP {response.status_code} for {INCIDENTS_PATH}")
    try:
        body = response.json()
    except ValueError as exc:
        raise IncidentsError(f"{where} answered {INCIDENTS_PATH} with something not JSON") from exc
    return documents(body, where)


def load_file(path: Path) -> list[Any]:
    """The incidents of a saved ``/v1/incidents`` answer (or a bare JSON list of them)."""
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise IncidentsError(f"cannot read the incidents file {path}: {exc}") from exc
    try:
        body = json.loads(text)
    except ValueError as exc:
        raise IncidentsError(f"the incidents file {path} is not JSON: {exc}") from exc
    return documents(body, f"the incidents file {path}")


def documents(body: Any, where: str) -> list[Any]:
    """The incident documents of an answer; each is checked later, one by one."""
    if isinstance(body, Mapping) and isinstance(body.get("incidents"), list):
        return list(body["incidents"])
    if isinstance(body, list):
        return body
    raise IncidentsError(f'{where} holds no incidents: expected {{"incidents": [...]}}')


def validate(
    docs: Sequence[Any], report: Report, source: str, gap: str | None = None
) -> Validation:
    """The job's incidents, checked, ordered by detection, and set against the diagnosis."""
    found = Validation(source, gap=gap)
    seen = {s.failure for s in report.symptoms} | {c.cause.failure for c in report.candidates}
    for index, doc in enumerate(docs):
        try:
            incident = parse(doc)
        except IncidentsError as exc:
            found.notes.append(f"incident entry {index} left out: {exc}")
            continue
        job = doc.get("job_id")
        if job is not None and job != report.job_id:
            found.notes.append(f"incident {incident.id} is of job {job!r}, not this one: left out")
            continue
        if incident.failure is not None:
            same = {incident.failure, *FAILURES[incident.failure].same_fault_as}
            incident.diagnosed = bool(same & seen)
        found.incidents.append(incident)
    found.incidents.sort(key=lambda i: (i.detected_at or i.received_at or 0.0, i.id))
    return found


def repairs(docs: Sequence[Any]) -> list[tuple[float, str]]:
    """(when, action) of every repair carried out in these incident documents (malformed ones
    are left out here; ``validate`` names them)."""
    done = []
    for doc in docs:
        try:
            incident = parse(doc)
        except IncidentsError:
            continue
        done += [(t.at, t.action) for t in incident.tried if t.at is not None]
    return sorted(done)


def parse(doc: Any) -> IncidentRecord:
    """One IncidentView document; IncidentsError names the first field that is wrong."""
    if not isinstance(doc, Mapping):
        raise IncidentsError(f"not an object but {type(doc).__name__}")
    alert = doc.get("alert")
    if not isinstance(alert, Mapping):
        raise IncidentsError("'alert' is not an object")
    tried_docs = doc.get("tried", [])
    if not isinstance(tried_docs, list):
        raise IncidentsError("'tried' is not a list")
    tried = sorted((_rung(t) for t in tried_docs), key=lambda t: (t.rung, t.at or 0.0))
    incident = IncidentRecord(
        id=_int(doc, "id"),
        subject=_str(doc, "subject"),
        failure=_enum(doc, "failure", Failure),
        alert=_str(alert, "name"),
        fingerprint=_str(alert, "fingerprint"),
        state=_str(doc, "state"),
        outcome=_enum(doc, "outcome", IncidentOutcome),
        job_outcome=_enum(doc, "job_outcome", JobOutcome),
        rung=_int(doc, "rung"),
        rung_action=_str(doc, "rung_action"),
        paged=_bool(doc, "paged"),
        first_evidence_at=_time(doc, "first_evidence_at"),
        detected_at=_time(doc, "detected_at"),
        received_at=_time(doc, "received_at"),
        acted_at=_time(doc, "acted_at"),
        recovered_at=_time(doc, "recovered_at"),
        closed_at=_time(doc, "closed_at"),
        deadline_at=_time(doc, "deadline_at"),
        baseline_step=_optional_int(doc, "baseline_step"),
        baseline_ranks_up=_optional_int(doc, "baseline_ranks_up"),
        tried=tried,
        note=str(doc.get("note") or ""),
    )
    incident.time_to_detect_seconds = _since(incident.first_evidence_at, incident.detected_at)
    incident.time_to_act_seconds = _since(incident.detected_at, incident.acted_at)
    incident.time_to_recover_seconds = _since(incident.detected_at, incident.recovered_at)
    incident.escalated = incident.rung > 0 or any(t.rung > 0 for t in tried)
    if incident.outcome is IncidentOutcome.RECOVERED:
        # The rung whose verdict says so; else the last one tried, which ran when it recovered.
        recovering = [t for t in tried if t.verdict == IncidentOutcome.RECOVERED.value] or tried
        incident.recovered_by = recovering[-1].action if recovering else incident.rung_action
    return incident


def _rung(doc: Any) -> RungTried:
    if not isinstance(doc, Mapping):
        raise IncidentsError("an entry of 'tried' is not an object")
    return RungTried(
        rung=_int(doc, "rung"),
        action=_str(doc, "action"),
        action_id=_int(doc, "action_id"),
        state=_str(doc, "state"),
        at=_time(doc, "at"),
        verdict=str(doc.get("verdict") or ""),
        count=_count(doc),
    )


def _count(doc: Mapping[str, Any]) -> int:
    if "count" not in doc:
        return 1
    count = _int(doc, "count")
    if count < 1:
        raise IncidentsError(f"'count' is not a positive integer: {count!r}")
    return count


def _since(start: float | None, end: float | None) -> float | None:
    return None if start is None or end is None else end - start


def _int(doc: Mapping[str, Any], key: str) -> int:
    value = doc.get(key)
    # bool is an int to Python, never to the service.
    if not isinstance(value, int) or isinstance(value, bool):
        raise IncidentsError(f"{key!r} is not an integer: {value!r}")
    return value


def _optional_int(doc: Mapping[str, Any], key: str) -> int | None:
    return None if doc.get(key) is None else _int(doc, key)


def _str(doc: Mapping[str, Any], key: str) -> str:
    value = doc.get(key)
    if not isinstance(value, str):
        raise IncidentsError(f"{key!r} is not a string: {value!r}")
    return value


def _bool(doc: Mapping[str, Any], key: str) -> bool:
    value = doc.get(key)
    if not isinstance(value, bool):
        raise IncidentsError(f"{key!r} is not true or false: {value!r}")
    return value


def _enum(doc: Mapping[str, Any], key: str, kind: type[E]) -> E | None:
    value = doc.get(key)
    if value is None:
        return None
    try:
        return kind(value)
    except ValueError:
        allowed = ", ".join(str(m.value) for m in kind)
        raise IncidentsError(f"{key!r} is {value!r}, not one of {allowed}") from None


def _time(doc: Mapping[str, Any], key: str) -> float | None:
    """An ISO 8601 time as unix seconds (UTC when it names no offset)."""
    value = doc.get(key)
    if value is None:
        return None
    if not isinstance(value, str):
        raise IncidentsError(f"{key!r} is not an ISO time: {value!r}")
    try:
        moment = datetime.fromisoformat(value)
    except ValueError:
        raise IncidentsError(f"{key!r} is not an ISO time: {value!r}") from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=timezone.utc)
    return moment.timestamp()
