"""NCCL watchdog timeouts: ProcessGroupNCCL's reports of a collective that did not finish in
time, in every wording torch has printed since 1.8, and what surrounds them.

Sources and their wording, release by release, are in tests/triage/corpus/nccl_timeout/SOURCES.md;
each pattern below names the program text that prints it. In short:

- the report itself, ``[Rank N] Watchdog caught collective operation timeout: WorkNCCL(...) ran
  for N milliseconds before timing out.`` (with ``SeqNum`` from about 1.10, ``NumelIn/NumelOut``
  from 2.1), re-printed by Python (``NCCL communicator was aborted ... Original reason for failure
  was: ...``), by ``std::terminate`` (``what():``) and by the watchdog thread's exception;
- the watchdog's summaries of the failing work (``Timeout at NCCL work: N``, ``Exception (either
  an error or timeout) detected by watchdog at work: N``, ``failure detected by watchdog at work
  sequence id: N``), with the last enqueued/completed sequence numbers that say who never joined;
- the heartbeat monitor (the watchdog thread itself stuck), the Flight Recorder dump signal and
  the NCCL_DESYNC_DEBUG report.

Logs pasted from terminals wrap lines anywhere, even inside ``WorkNCCL(`` or a number: an
incomplete report asks for the next line (``feed`` returns True) and is read joined with it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, ClassVar

from trainguard.contract import Failure
from trainguard.thresholds import Thresholds
from trainguard.triage.detectors.base import (
    Source,
    add_listed,
    bounded_get,
    rank_of,
    register,
)
from trainguard.triage.findings import Finding, Location

# --- what ProcessGroupNCCL prints ------------------------------------------------------------
# WorkNCCL's operator<< (torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp; torch <= 1.9:
# torch/lib/c10d/ProcessGroupNCCL.cpp, pytorch/pytorch@00f5dfd5 prints
# "WorkNCCL(OpType=X[, TensorShape=[..]], Timeout(ms)=N)"; torch 1.10-2.0 "WorkNCCL(SeqNum=N,
# OpType=X, Timeout(ms)=N)"; torch >= 2.1, pytorch/pytorch#100413 and @0007e752 "WorkNCCL(SeqNum=N,
# OpType=X, NumelIn=N, NumelOut=N, Timeout(ms)=N)"), closed by " ran for N milliseconds before
# timing out." (WorkNCCL::checkTimeout, abortTimedOutCollectives in 1.x, the blocking-wait
# "Caught collective operation timeout" of @00f5dfd5) or by " timed out in blocking wait"
# (WorkNCCL::synchronizeInternal, @0007e752 and later). Wrapped text may split "ran for N" from
# "milliseconds", hence the optional spaces.
_WORK = re.compile(
    r"WorkNCCL\((?P<body>[^()]*(?:\(ms\)[^()]*)*)\)\s*"
    r"(?:ran\s*for\s*(?P<ran>\d+)\s*milli|timed out in blocking wait)"
)
# The same report cut off by the end of the excerpt after its closing parenthesis ("... ran fo").
_WORK_CUT = re.compile(
    r"WorkNCCL\((?P<body>[^()]*(?:\(ms\)[^()]*)*)\)\s*(?:r(?:a(?:n(?:\s+(?:f(?:or?)?)?)?)?)?)?$"
)
# "Key=value" inside WorkNCCL(...); TensorShape=[a, b] (torch <= 1.9) holds commas.
_WORK_FIELD = re.compile(r"(\w+(?:\(ms\))?)=(\[[^\]]*\]|[^,]*)")
_REPORT_START = "collective operation timeout"  # "Watchdog caught ..."/"Caught ..." (see _WORK)

# The watchdog's summaries of the failing work and of the PG's progress
# (ProcessGroupNCCL.cpp watchdogHandler / Watchdog::runLoop):
# - torch 2.3-2.5, pytorch/pytorch#118582: "[PG 1 Rank 0] Exception (either an error or timeout)
#   detected by watchdog at work: N, last enqueued NCCL work: E, last completed NCCL work: C."
#   and "Timeout at NCCL work: N, last enqueued NCCL work: E, last completed NCCL work: C.";
# - torch >= 2.6 (Watchdog::runLoop, the Watchdog-class layout of 2.8+ at index id 23264163):
#   "failure detected by watchdog at work sequence id: N PG status: last enqueued work: E, last
#   completed work: C";
# - the Flight Recorder dump signal (HeartbeatMonitor::getNCCLWatchdogTimeoutErrorMsg, >= 2.5):
#   "Received a dump signal due to a collective timeout from this local rank|rank R and we will
#   try our best to dump the debug info. Last enqueued NCCL work: E, last completed NCCL work: C."
_STATUS = re.compile(
    r"[Ll]ast enqueued (?:NCCL )?work:\s*(?P<enq>-?\d+),\s*last completed (?:NCCL )?work:\s*"
    r"(?P<done>-?\d+)"
)
# The failing work the summaries name (the first two; the third names none).
_FAILED_AT = re.compile(
    r"(?P<kind>Timeout at NCCL work|detected by watchdog at work(?: sequence id)?):\s*(?P<seq>\d+)"
)
_DUMP_SIGNAL = re.compile(
    r"Received a dump signal due to a collective timeout from\s+"
    r"(?:this local rank|rank (?P<src>\d+))"
)
# "[PG 1 Rank 0]" (torch 2.3, pytorch/pytorch#115801), "[PG 0 (default_pg) Rank 7]" (2.4),
# "[PG ID 0 PG GUID 0(default_pg) Rank 1]" (>= 2.5, ProcessGroupNCCL::createLogPrefix) and
# WorkNCCL's own "[PG GUID 2 Rank 0]" (pytorch/pytorch#191440, 2026).
_PG = re.compile(r"\[PG (?:ID (?P<id>\d+) PG )?(?:GUID (?P<guid>[^\s\]]+)|(?P<num>\d+))")

# The heartbeat monitor: the watchdog thread itself stopped making progress (ProcessGroupNCCL.cpp
# heartbeatMonitor / HeartbeatMonitor::runLoop):
# - torch 2.2 (pytorch/pytorch#112518, @0007e752): "No PGNCCL's watchdog heartbeat detected, so
#   we are dumping debug info.", "[Rank N] monitoring thread detects no heartbeat and will
#   finally kill the process!", "[Rank N] NCCL monitor thread timeout. Basically, ...";
# - torch 2.3-2.7 (pytorch/pytorch#115888): "Heartbeat monitor timed out! Process will be
#   terminated after dumping debug info. workMetaList_.size()=N" then "ProcessGroupNCCL's
#   watchdog got stuck for N seconds without making progress in monitoring enqueued
#   collectives."; 2.4+ also "First PG on this rank that detected no heartbeat of its watchdog.";
# - torch >= 2.8 (index id 23264163): only "ProcessGroupNCCL's watchdog got stuck for N seconds
#   ..." and "Terminating the process after attempting to dump debug info, due to
#   ProcessGroupNCCL watchdog hang.".
_STUCK = re.compile(r"watchdog got stuck for (?P<secs>\d+) seconds")
_HEARTBEAT = (
    "Heartbeat monitor timed out",
    "detected no heartbeat of its watchdog",
    "watchdog heartbeat detected",
    "monitoring thread detects no heartbeat",
    "NCCL monitor thread timeout",
    "due to ProcessGroupNCCL watchdog hang",
)

# NCCL_DESYNC_DEBUG's report (torch/csrc/distributed/c10d/TraceUtils.h retrieveDesyncReport,
# analyzeMissingRanks/analyzeLaggingRanks): "Timeout at collective: OP, #N", then "\t - To our
# best knowledge, ranks [a, b] are the lagging ranks that caused this timeout. They never joined
# any collectives" or "\t   - [a, b] joined but didn't finish collective #N (count from 1)" and
# "\t     [c] finished collective #N, but didn't join collective #N+1 (count from 1)".
_DESYNC_AT = re.compile(
    r"(?:\[(?P<rank>\d+)\] )?Timeout at collective:\s*(?P<op>\w+),\s*#(?P<seq>\d+)"
)
# The report is logged as one message starting with a newline ("LOG(ERROR) << logPrefix() <<
# desyncMsg" in ProcessGroupNCCL.cpp), so its glog header stands alone on a line.
_HEADER_ONLY = re.compile(r"ProcessGroupNCCL\.cpp:\d+\](?:\s*\[[^\]]*\])*\s*$")
_DESYNC_MISSING = re.compile(r"ranks \[(?P<ranks>[\d,\s]*)\] are the lagging ranks")
_DESYNC_NOT_JOINED = re.compile(
    r"\[(?P<ranks>[\d,\s]*)\] finished collective #\d+, but didn't join"
)
_DESYNC_CONTINUED = re.compile(r"^\s*(?:-\s|\[[\d,\s]*\]\s)")

# Flight Recorder (ProcessGroupNCCL.cpp dumpDebuggingInfo / HeartbeatMonitor::runLoop, >= 2.4).
_FR_WRITTEN = ("Finished flight recorder successfully", "Flight Recorder trace successfully")
_FR_STARTED = ("preparing to dump debug info", "dump the debug info", "Received a dump signal")

# An NCCL error, not a timeout, behind an ambiguous "failure detected by watchdog" (torch >= 2.6
# logs it for both): NCCLUtils' "NCCL error: ..."/"NCCL error in: ...", NCCL's result codes,
# Watchdog::checkAndSetRemoteError's "remote error detected from rank".
_ERROR_EVIDENCE = (
    "NCCL error",
    "ncclSystemError",
    "ncclRemoteError",
    "ncclInternalError",
    "ncclUnhandledCudaError",
    "ncclInvalidUsage",
    "remote error detected",
    "NCCL communicator encountered error",
)

# c10's glog-style header "[E1206 18:44:12.715 ..." and "[E626 06:24:44.9 ..." (c10/util/Logging
# in torch >= 2.4 does not zero-pad the month); the logging module's ISO time.
_GLOG_TIME = re.compile(r"\b[EWIF](\d{3,4}) (\d\d:\d\d:\d\d\.\d+)")
_ISO_TIME = re.compile(r"(\d{4}-\d\d-\d\d[T ]\d\d:\d\d:\d\d(?:[.,]\d+)?)")

# A wrapped log line continues on the next physical line; a new record starts with a prefix.
_NEW_RECORD = re.compile(
    r"^\s*(?:\[(?:rank\d+\]|[a-z_]+\d+\]:|[EWIF]\d|\d+\]|PG )|[EWIF]\d{3,4} |\(\w+ pid=\d+\)"
    r"|\d{4}-\d\d-\d\d|\S+ \[std(?:err|out)\]|terminate called|frame #|Exception raised"
    r"|Traceback|```)"
)
# An error or fatal line of c10's logging: "[E1206 18:44:12...", "[F ProcessGroupNCCL.cpp:1169]".
_ERROR_HEADER = re.compile(r"\[[EF](?:\d{3,4} | ProcessGroupNCCL)")
_MAX_WRAPPED_LINES = 4  # physical lines joined into one report at most
_MIN_WRAPPED_WIDTH = 80  # a terminal narrower than this does not wrap ProcessGroupNCCL lines
_MAX_DESYNC_LINES = 24

# A line that may hold any of the above (one regex pass instead of a dozen substring scans).
_TRIGGER = re.compile(
    r"WorkNCCL|collective operation timeout|ast enqueued|at (?:NCCL )?work|Timeout at"
    r"|watchdog got stuck|eartbeat|monitor thread|dump|light recorder|rror"
)


def _continues(previous: str, line: str) -> bool:
    """Whether ``line`` carries on the wrapped ``previous`` rather than starting a record."""
    if _NEW_RECORD.match(line) or "ProcessGroupNCCL.cpp:" in line:
        return False
    # A second report is a new record, unless ``previous`` still waits for its "WorkNCCL(".
    return "WorkNCCL(" not in line or "WorkNCCL(" not in previous


def _timestamp(text: str) -> str | None:
    glog = _GLOG_TIME.search(text)
    if glog:
        return f"{glog.group(1).zfill(4)} {glog.group(2)}"
    iso = _ISO_TIME.search(text)
    return iso.group(1).replace("T", " ").replace(",", ".") if iso else None


def _pg_of(text: str) -> str | None:
    """The process group a line names: its GUID (torch >= 2.5), else its id."""
    pg = _PG.search(text)
    return (pg["guid"] or pg["num"] or pg["id"]) if pg else None


def _ranks_in(text: str) -> list[int]:
    return [int(r) for r in re.findall(r"\d+", text)]


@dataclass
class _TimeoutGroup:
    fields: dict[str, Any]
    first_seen: Location
    ranks: set[int] = field(default_factory=set)
    process_groups: set[str] = field(default_factory=set)
    first: tuple[str, int] | None = None  # (timestamp, rank) of the earliest report
    first_where: Location | None = None
    count: int = 0
    elapsed_ms: int = 0

    def saw(self, rank: int | None, stamp: str | None, where: Location) -> None:
        self.count += 1
        if rank is not None:
            add_listed(self.ranks, rank)
        # Without timestamps the first report in reading order stands in for the first in time.
        earlier = self.first is None or (stamp is not None and stamp < self.first[0])
        if earlier and rank is not None:
            self.first = (stamp or "", rank)
            self.first_where = where


@dataclass
class _Pending:
    """A report cut by a line wrap, waiting for its next physical line."""

    text: str
    where: Location
    source: Source
    lines: int


@register
class NcclTimeoutDetector:
    """ProcessGroupNCCL's watchdog timeouts, heartbeat-monitor aborts and what surrounds them."""

    # Every line ProcessGroupNCCL logs carries its file name in the glog header; "WorkNCCL(" also
    # catches the report re-printed by Python, by std::terminate or without a header, and
    # "collective operation timeout" a report whose "WorkNCCL(" a line wrap split.
    failure: ClassVar[Failure] = Failure.NCCL_TIMEOUT
    keywords: tuple[str, ...] = ("ProcessGroupNCCL", "WorkNCCL(", _REPORT_START)
    # WorkNCCL(...) reports say "collective operation timeout" or come after a line the detector
    # follows; "time" is the word the straggler detector's needles share.
    needles: tuple[str, ...] = ("ProcessGroupNCCL", "time")

    @classmethod
    def from_thresholds(cls, thresholds: Thresholds) -> NcclTimeoutDetector:
        return cls()

    def __init__(self) -> None:
        self.dropped = 0
        self._groups: dict[tuple[int | None, str, str], _TimeoutGroup] = {}
        # Failing work named only by the watchdog's summaries: seq -> group (op unknown).
        self._summaries: dict[int, _TimeoutGroup] = {}
        self._summary_timeout: set[int] = set()  # seqs a summary called a timeout outright
        self._summary_pgs: dict[int, set[str | None]] = {}
        self._last_enqueued: dict[tuple[str | None, int], int] = {}
        self._fr_written: set[int | None] = set()
        self._fr_started: set[int | None] = set()
        self._stuck: _TimeoutGroup | None = None  # the heartbeat monitor's aborts
        # Dump signals "due to a collective timeout" (from this rank or another).
        self._dump_signal: _TimeoutGroup | None = None
        self._error_seen = False
        self._desync_lagging: set[int] = set()
        self._desync_lines = 0
        self._pending: _Pending | None = None

    # --- reading --------------------------------------------------------------------------
    def feed(self, line: str, where: Location, source: Source) -> bool:
        pending = self._pending
        if pending is not None:
            self._pending = None
            if pending.source is source and _continues(pending.text, line):
                return self._read(pending.text + line, pending.where, source, pending.lines + 1)
            self._read(pending.text, pending.where, pending.source, _MAX_WRAPPED_LINES)
        if self._desync_lines:
            if _DESYNC_CONTINUED.match(line):
                self._desync_lines -= 1
                self._desync(line, where, source)
                return self._desync_lines > 0
            self._desync_lines = 0
        return self._read(line, where, source, 1)

    def _read(self, text: str, where: Location, source: Source, lines: int) -> bool:
        """Take in one logical line; True when it looks cut by a wrap and wants the next."""
        if not _TRIGGER.search(text):
            if text.rstrip().endswith("]") and _HEADER_ONLY.search(text):
                self._desync_lines = _MAX_DESYNC_LINES  # an NCCL_DESYNC_DEBUG report follows
                return True
            return self._wrapped(text, where, source, lines)
        work = _WORK.search(text) if "WorkNCCL" in text else None
        if work is None and ("WorkNCCL(" in text or _REPORT_START in text):
            if lines < _MAX_WRAPPED_LINES:  # a report cut by a wrap: wait for the rest
                self._pending = _Pending(text, where, source, lines)
                return True
            work = _WORK_CUT.search(text)  # or by the end of the excerpt
        rank = rank_of(text, source)
        matched = work is not None
        if "ump" in text or "light " in text:
            if any(marker in text for marker in _FR_WRITTEN):
                self._fr_written.add(rank)
            if any(marker in text for marker in _FR_STARTED):
                self._fr_started.add(rank)
        if "rror" in text and any(marker in text for marker in _ERROR_EVIDENCE):
            self._error_seen = True
        if "work:" in text:
            matched = self._status(text, rank, where) or matched
        if "dump signal" in text:
            signal = _DUMP_SIGNAL.search(text)
            if signal:
                matched = True
                if self._dump_signal is None:
                    self._dump_signal = _TimeoutGroup({}, where)
                src = int(signal["src"]) if signal["src"] else rank
                self._dump_signal.saw(src, _timestamp(text), where)
        if self._heartbeat(text, rank, where):
            matched = True
        if work is not None:
            self._report(work, text, rank, where)
        if "Timeout at collective" in text and _DESYNC_AT.search(text):
            self._desync(text, where, source)
            self._desync_lines = _MAX_DESYNC_LINES
            return True
        return False if matched else self._wrapped(text, where, source, lines)

    def _status(self, text: str, rank: int | None, where: Location) -> bool:
        """The watchdog's summaries: the failing work and the PG's last enqueued work."""
        pg = _pg_of(text) if "[PG " in text else None
        found = False
        if "ast enqueued" in text:
            status = _STATUS.search(text)
            if status:
                found = True
                if rank is not None:
                    self._last_enqueued[(pg, rank)] = int(status["enq"])
        if "Timeout at NCCL work" in text or "detected by watchdog at work" in text:
            failed = _FAILED_AT.search(text)
            if failed:
                found = True
                self._summary(int(failed["seq"]), failed["kind"], pg, rank, text, where)
        return found

    def _wrapped(self, text: str, where: Location, source: Source, lines: int) -> bool:
        """An error line of ProcessGroupNCCL cut mid-sentence: read it with the next line."""
        if (
            lines < _MAX_WRAPPED_LINES
            and len(text) >= _MIN_WRAPPED_WIDTH
            and _ERROR_HEADER.search(text)
            and not text.rstrip().endswith((".", ":", "!"))
        ):
            self._pending = _Pending(text, where, source, lines)
            return True
        return False

    def _report(self, work: re.Match[str], text: str, rank: int | None, where: Location) -> None:
        values = dict((k, v.strip()) for k, v in _WORK_FIELD.findall(work["body"]))
        op = values.get("OpType") or "unknown"
        seq_text = values.get("SeqNum", "")
        seq = int(seq_text) if seq_text.isdigit() else None
        # Older PyTorch does not name the process group, so reports are grouped by what every
        # version prints: the sequence number, the op and its sizes.
        key = (seq, op, values.get("NumelIn", ""))
        group = bounded_get(
            self._groups, key, lambda: _TimeoutGroup(self._fields(values, op, seq), where), self
        )
        if group is None:
            return
        group.saw(rank, _timestamp(text), where)
        if work.groupdict().get("ran"):
            group.elapsed_ms = max(group.elapsed_ms, int(work["ran"]))
        pg = _pg_of(text)
        if pg is not None:
            add_listed(group.process_groups, pg)

    def _summary(
        self,
        seq: int,
        kind: str,
        pg: str | None,
        rank: int | None,
        text: str,
        where: Location,
        op: str | None = None,
    ) -> None:
        if seq < 0:
            return
        fields: dict[str, Any] = {"seq_num": seq}
        group = bounded_get(self._summaries, seq, lambda: _TimeoutGroup(fields, where), self)
        if group is None:
            return
        if op and "op_type" not in group.fields:
            group.fields["op_type"] = op
        if kind.startswith("Timeout"):
            self._summary_timeout.add(seq)
        self._summary_pgs.setdefault(seq, set()).add(pg)
        if pg is not None:
            add_listed(group.process_groups, pg)
        group.saw(rank, _timestamp(text), where)

    def _heartbeat(self, text: str, rank: int | None, where: Location) -> bool:
        if "eartbeat" not in text and "atchdog" not in text and "monitor thread" not in text:
            return False
        stuck = _STUCK.search(text)
        if not stuck and not any(marker in text for marker in _HEARTBEAT):
            return False
        if self._stuck is None:
            self._stuck = _TimeoutGroup({}, where)
        self._stuck.saw(rank, _timestamp(text), where)
        if stuck:
            self._stuck.fields["heartbeat_timeout_s"] = int(stuck["secs"])
        return True

    def _desync(self, line: str, where: Location, source: Source) -> None:
        """One line of an NCCL_DESYNC_DEBUG report (TraceUtils.h, see _DESYNC_AT)."""
        at = _DESYNC_AT.search(line)
        if at:
            rank = int(at["rank"]) if at["rank"] else rank_of(line, source)
            self._summary(
                int(at["seq"]),
                "Timeout at collective",
                _pg_of(line),
                rank,
                line,
                where,
                op=at["op"],
            )
            return
        for pattern in (_DESYNC_MISSING, _DESYNC_NOT_JOINED):
            found = pattern.search(line)
            if found:
                for rank in _ranks_in(found["ranks"]):
                    add_listed(self._desync_lagging, rank)

    @staticmethod
    def _fields(values: dict[str, str], op: str, seq: int | None) -> dict[str, Any]:
        fields: dict[str, Any] = {"op_type": op}
        if seq is not None:
            fields["seq_num"] = seq
        for key, name in (("NumelIn", "numel_in"), ("NumelOut", "numel_out")):
            if values.get(key, "").lstrip("-").isdigit():
                fields[name] = int(values[key])
        if values.get("Timeout(ms)", "").isdigit():
            fields["timeout_ms"] = int(values["Timeout(ms)"])
        if values.get("TensorShape"):
            fields["tensor_shape"] = values["TensorShape"]
        return fields

    # --- reporting ------------------------------------------------------------------------
    def findings(self) -> list[Finding]:
        pending, self._pending = self._pending, None
        if pending is not None:
            self._read(pending.text, pending.where, pending.source, _MAX_WRAPPED_LINES)
        out = [self._finding(group, "watchdog_report") for group in self._groups.values()]
        reported = {group.fields.get("seq_num") for group in self._groups.values()}
        for seq, group in self._summaries.items():
            if seq in reported:
                continue
            # torch >= 2.6 says "failure detected" for NCCL errors too: without an explicit
            # timeout, an NCCL error seen in the same logs is the likelier cause.
            if seq in self._summary_timeout or not self._error_seen:
                out.append(self._finding(group, "watchdog_summary"))
        if not out and self._stuck is not None:
            out.append(self._finding(self._stuck, "heartbeat"))
        elif self._stuck is not None:
            for finding in out:
                finding.fields["watchdog_stuck_ranks"] = sorted(self._stuck.ranks)
        if not out and self._dump_signal is not None and not self._error_seen:
            out.append(self._finding(self._dump_signal, "dump_signal"))
        return out

    def _finding(self, group: _TimeoutGroup, evidence: str) -> Finding:
        fields = dict(group.fields)
        fields["evidence"] = evidence
        seq = fields.get("seq_num")
        op = fields.get("op_type", "collective")
        if evidence == "watchdog_report":
            fields["elapsed_ms"] = group.elapsed_ms
        fields["process_groups"] = sorted(group.process_groups)
        fields["ranks"] = sorted(group.ranks)
        fields["reports"] = group.count
        first_rank = group.first[1] if group.first else None
        fields["first_rank"] = first_rank
        if group.first and group.first[0]:
            fields["first_time"] = group.first[0]
        fields["flight_recorder"] = self._flight_recorder(group.ranks)
        laggards = self._laggards(seq) if seq is not None else []
        if laggards:
            fields["laggard_ranks"] = laggards
        if self._desync_lagging:
            fields["desync_lagging_ranks"] = sorted(self._desync_lagging)
        if evidence == "heartbeat":
            summary = (
                f"ProcessGroupNCCL's watchdog stopped making progress on ranks {fields['ranks']} "
                "(heartbeat monitor)"
            )
            advice = [
                "The watchdog thread itself was stuck for "
                f"{fields.get('heartbeat_timeout_s', '?')} s (a NCCL/CUDA call blocking it, or "
                "another thread holding the GIL inside a CUDA call), so no collective report "
                "was printed. Look at the stuck ranks' stacks (py-spy dump --native) and at "
                f"{Failure.GPU_FAULT.value} findings; TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC only "
                "delays the abort."
            ]
        elif evidence == "dump_signal":
            summary = (
                f"A collective timed out (Flight Recorder dump signal from rank(s) "
                f"{fields['ranks']}); the watchdog's report is not in these logs"
            )
            advice = [
                "The report naming the collective was not captured: look for the "
                "timed-out rank's own log."
            ]
        else:
            where = f"SeqNum={seq}" if seq is not None else "no SeqNum printed"
            summary = (
                f"NCCL {op} ({where}) timed out on ranks {fields['ranks']}; first to time "
                f"out: rank {first_rank}"
            )
            advice = [
                f"{op} #{seq if seq is not None else '?'} did not complete on "
                f"{len(group.ranks) or 'some'} rank(s) within "
                f"{fields.get('timeout_ms', '?')} ms."
            ]
        lagging = laggards or fields.get("desync_lagging_ranks")
        if lagging:
            advice.append(
                f"Rank(s) {', '.join(map(str, lagging))} enqueued fewer collectives than "
                "the others: they never joined this one. Look at what they were doing (a "
                "data loader stall, checkpoint I/O, an exception, a dead GPU)."
            )
        elif evidence != "heartbeat":
            advice.append(
                "Find the rank that never joined: it is usually missing from these reports, "
                f"or failed first (see {Failure.RANK_FAILURE.value}, "
                f"{Failure.GPU_FAULT.value} and {Failure.OOM.value} findings)."
            )
        if fields["flight_recorder"] == "written":
            advice.append(
                "A Flight Recorder dump was written: analyse it with "
                "`python -m torch.distributed.flight_recorder.fr_trace <dump dir>`."
            )
        elif fields["flight_recorder"] == "dump_started":
            advice.append(
                "A Flight Recorder dump was started but its completion was not logged: look "
                "for the files under the TORCH_FR_DUMP_TEMP_FILE (older: "
                "TORCH_NCCL_DEBUG_INFO_TEMP_FILE) prefix, /tmp/nccl_trace_rank_<rank> by "
                "default."
            )
        else:
            advice.append(
                "No Flight Recorder dump was seen: set TORCH_NCCL_TRACE_BUFFER_SIZE=2000 and "
                "TORCH_NCCL_DUMP_ON_TIMEOUT=1 so the next hang says which rank never joined."
            )
        advice.append(
            "Restart from the last checkpoint; raise the timeout only if the collective is "
            "legitimately slow."
        )
        return Finding(
            Failure.NCCL_TIMEOUT,
            summary,
            group.first_where or group.first_seen,
            " ".join(advice),
            fields,
            group.count,
        )

    def _flight_recorder(self, ranks: set[int]) -> str:
        if self._fr_written & (ranks | {None}):
            return "written"
        if self._fr_started & (ranks | {None}):
            return "dump_started"
        return "not_seen"

    def _laggards(self, seq: int) -> list[int]:
        """Ranks whose last enqueued work stops short of ``seq`` while others went further, in
        the process group(s) whose summaries name ``seq`` (every group when none does)."""
        pgs = self._summary_pgs.get(seq)
        by_pg: dict[str | None, dict[int, int]] = {}
        for (pg, rank), enq in self._last_enqueued.items():
            if pgs is None or pg in pgs:
                by_pg.setdefault(pg, {})[rank] = enq
        lagging: set[int] = set()
        for enqueued in by_pg.values():
            if len(enqueued) < 2:
                continue
            highest = max(enqueued.values())
            lagging |= {r for r, enq in enqueued.items() if enq < highest and enq < seq}
        return sorted(lagging)
