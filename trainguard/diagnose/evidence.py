"""The evidence outside Prometheus: the hook's ECS events, raw logs, Flight Recorder dumps.

Log files are read twice over: lines that are ECS JSON documents with an ``event.action`` are
the hook's events (``oom``, ``collective_stalled``, ...), and every ECS line of the job's ranks
says which process (``process.pid``) was which rank, which names the worker a torchrun agent
reports as failed by its pid; every file also goes through
``trainguard triage``'s scanner, which recognises CUDA OOM messages, NCCL watchdog timeouts,
Xids and torchrun failures in raw text. Flight Recorder dumps (``<dumps>/<job_id>/stall-*/``,
as the hook's watchdog writes them) are handed to torch's own analyzer through
:func:`trainguard.diagnose.flight_recorder.analyze`; torch is imported only then.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import threading
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trainguard import contract
from trainguard.thresholds import Thresholds
from trainguard.triage import Finding, Scanner
from trainguard.triage.detectors import default_detectors

STACK_LINES = 8  # innermost lines of the main thread's stack shown in the report
# The ECS field ecs-logging fills with the logging process's id, on every line it writes.
FIELD_PROCESS_PID = "process.pid"
# trainguard's own services log with the job's labels too (an alert's, an action's), from
# processes that are no rank.
_SERVICES = (contract.SERVICE_EXPORTER, contract.SERVICE_REMEDIATION)
# sys.stdout is the process's: two threads' redirects that overlap restore it out of order and
# leave it pointing at one's buffer (the fault matrix diagnoses four runs at once, and its own
# lines vanished). One redirect at a time.
_STDOUT_REDIRECT = threading.Lock()


@dataclass
class Event:
    kind: str
    message: str
    timestamp: str
    rank: int | None
    node: str | None
    details: dict[str, Any]
    step: int | None = None


@dataclass
class LogEvidence:
    events: list[Event] = field(default_factory=list)
    findings: list[Finding] = field(default_factory=list)
    files: int = 0
    unreadable: list[str] = field(default_factory=list)
    other_jobs_skipped: int = 0
    # pid -> the ranks that process logged as, from the job's ECS lines: one rank per process,
    # unless two nodes reused a pid.
    pid_ranks: dict[int, set[int]] = field(default_factory=dict)


@dataclass
class Mismatch:
    collective_seq_id: int
    name: str
    process_group: str
    missing_ranks: list[int]


@dataclass
class StallDump:
    folder: Path
    ranks_dumped: list[int]
    mismatches: list[Mismatch] = field(default_factory=list)
    stacks: dict[int, str] = field(default_factory=dict)
    error: str | None = None


def _field(doc: Mapping[str, Any], dotted: str) -> Any:
    """An ECS field whether the document nests it (``{"event": {"action"}}``) or not."""
    if dotted in doc:
        return doc[dotted]
    value: Any = doc
    for part in dotted.split("."):
        if not isinstance(value, Mapping) or part not in value:
            return None
        value = value[part]
    return value


def _files(paths: Sequence[str]) -> Iterator[Path]:
    for name in paths:
        path = Path(name)
        if path.is_dir():
            for root, dirs, files in os.walk(path):
                dirs.sort()
                for file_name in sorted(files):
                    yield Path(root) / file_name
        else:
            yield path


def read_logs(paths: Sequence[str], job_id: str, thresholds: Thresholds) -> LogEvidence:
    """The hook's events for ``job_id`` and triage's findings in ``paths`` (its detectors
    judging by ``thresholds``)."""
    evidence = LogEvidence()
    for path in _files(paths):
        try:
            with path.open("rb") as stream:
                evidence.files += 1
                for raw in stream:
                    if raw.startswith(b"{") and b"event" in raw:
                        _event(raw, job_id, evidence)
        except OSError as exc:
            evidence.unreadable.append(f"{path}: {exc.strerror or exc}")
    scanner = Scanner(default_detectors(thresholds))
    scanner.scan_paths([str(p) for p in _files(paths)])
    evidence.findings = scanner.findings()
    return evidence


def _event(raw: bytes, job_id: str, evidence: LogEvidence) -> None:
    try:
        doc = json.loads(raw)
    except ValueError:
        return
    if not isinstance(doc, dict):
        return
    event_job = _field(doc, contract.FIELD_JOB_ID)
    rank = _field(doc, contract.FIELD_RANK)
    kind = _field(doc, contract.FIELD_EVENT_ACTION)
    if str(event_job) == job_id:
        _process(doc, rank, evidence)
    if not isinstance(kind, str):
        return
    if event_job is not None and str(event_job) != job_id:
        evidence.other_jobs_skipped += 1
        return
    details = _field(doc, contract.FIELD_DETAILS)
    step = _field(doc, contract.FIELD_STEP)
    evidence.events.append(
        Event(
            kind=kind,
            message=str(doc.get("message", "")),
            timestamp=str(doc.get("@timestamp", "")),
            rank=int(rank) if isinstance(rank, (str, int)) and str(rank).isdigit() else None,
            node=_field(doc, contract.FIELD_NODE),
            details=details if isinstance(details, dict) else {},
            step=int(step) if isinstance(step, (str, int)) and str(step).isdigit() else None,
        )
    )


def _process(doc: Mapping[str, Any], rank: Any, evidence: LogEvidence) -> None:
    """Record which rank the logging process was (any ECS line of the job's ranks)."""
    pid = _field(doc, FIELD_PROCESS_PID)
    if _field(doc, contract.FIELD_SERVICE_NAME) in _SERVICES or isinstance(pid, bool):
        return
    if isinstance(pid, int) and isinstance(rank, (str, int)) and str(rank).isdigit():
        evidence.pid_ranks.setdefault(pid, set()).add(int(rank))


def stall_folders(dumps: Path, job_id: str) -> list[Path]:
    """Stall folders for ``job_id``: ``dumps/<job_id>/stall-*``, or ``dumps`` itself when it
    is a job folder or one stall folder."""
    if any(dumps.glob(f"{contract.FLIGHT_RECORDER_DUMP_PREFIX}*")):
        return [dumps]
    base = dumps / job_id if (dumps / job_id).is_dir() else dumps
    return sorted(p for p in base.glob("stall-*") if p.is_dir())


def _main_thread_tail(text: str) -> str:
    """The innermost lines of the main thread's stack in a stacks_rank<N>.txt."""
    blocks = text.split("\nThread ")
    for block in blocks:
        if '"MainThread"' in block.splitlines()[0]:
            lines = [line for line in block.splitlines()[1:] if line.strip()]
            return "\n".join(lines[-STACK_LINES:])
    return ""


def read_dumps(dumps: Path, job_id: str) -> list[StallDump]:
    """Run torch's Flight Recorder analyzer over each stall folder of the job."""
    out = []
    for folder in stall_folders(dumps, job_id):
        ranks = sorted(
            int(p.name[len(contract.FLIGHT_RECORDER_DUMP_PREFIX) :])
            for p in folder.glob(f"{contract.FLIGHT_RECORDER_DUMP_PREFIX}*")
            if p.name[len(contract.FLIGHT_RECORDER_DUMP_PREFIX) :].isdigit()
        )
        dump = StallDump(folder=folder, ranks_dumped=ranks)
        for path in folder.glob(f"{contract.STACKS_DUMP_PREFIX}*.txt"):
            rank_text = path.name[len(contract.STACKS_DUMP_PREFIX) : -len(".txt")]
            if rank_text.isdigit():
                try:
                    dump.stacks[int(rank_text)] = _main_thread_tail(path.read_text())
                except OSError as exc:
                    dump.error = f"cannot read {path}: {exc}"
        if ranks:
            _analyze(dump)
        out.append(dump)
    return out


def _analyze(dump: StallDump) -> None:
    try:
        from trainguard.diagnose import flight_recorder
    except ImportError as exc:
        dump.error = f"torch is not installed, so its Flight Recorder analyzer cannot run ({exc})"
        return
    # The analyzer prints its findings; the report carries them instead.
    printed = io.StringIO()
    try:
        with _STDOUT_REDIRECT, contextlib.redirect_stdout(printed):
            found = flight_recorder.analyze(dump.folder, allow_incomplete=True)
    except Exception as exc:
        # The analyzer is torch's and raises whatever it meets in a damaged dump; the report
        # says so and goes on with the other evidence.
        dump.error = f"torch's Flight Recorder analyzer failed on {dump.folder}: {exc!r}"
        return
    dump.mismatches = [
        Mismatch(m.collective_seq_id, m.name, m.process_group, sorted(m.missing_ranks))
        for m in found
    ]
