"""Rank failures as torchrun reports them: the ChildFailedError summary, agent lines, restarts.

The summary is read whole or in part: a paste may start at its root cause, end inside it, lose
its rules, carry a prefix on every line (``stderr: ``, a collector's timestamp) or come from the
torch 1.9/1.10 layout. Every wording is cited to the pytorch/pytorch source that prints it; the
variants found in real logs are in ``tests/triage/corpus/rank_failure/SOURCES.md``.
"""

from __future__ import annotations

import re
import signal
from dataclasses import dataclass, field
from typing import Any, ClassVar

from trainguard.contract import Failure
from trainguard.thresholds import Thresholds
from trainguard.triage.detectors.base import (
    MAX_GROUPS,
    MAX_LISTED,
    Source,
    register,
    trim,
)
from trainguard.triage.findings import Finding, Location

# --- the ChildFailedError summary -----------------------------------------------------------
# torch/distributed/elastic/multiprocessing/errors/__init__.py, ChildFailedError.format_msg:
#   torch >= 1.11 (as at pytorch/pytorch 0140b62d8bab203e4699faeba802b5204fa51d26):
#     "=" * w, "<name> FAILED", "-" * w, "Failures:", the other failures or
#     "  <NO_OTHER_FAILURES>", "-" * w, "Root Cause (first observed failure):", the root, "=" * w;
#     each failure "[idx]:" then "  time      : ", "  host      : ", "  rank      : R
#     (local_rank: L)", "  exitcode  : C (pid: P)", "  error_file: ", "  traceback : " (the
#     traceback's lines indented by two more spaces, or "Signal 9 (SIGKILL) received by PID P",
#     or "To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html").
#   torch 1.9/1.10: "*" * w, "  <name> FAILED  " centred, "=" * w, "Root Cause:", the root,
#     "=" * w, "Other Failures:", the others, "*" * w; fields "  time: ", "  rank: ",
#     "  exitcode: ", "  error_file: ", "  msg: " (a quoted message, or the error file's JSON).
_HEADER = re.compile(r"ChildFailedError:\s*$")
_ROOT_SECTION = re.compile(r"^Root Cause(?: \(first observed failure\))?\s*:$")
_FAILURE_SECTIONS = ("Failures:", "Other Failures:")
_NO_OTHERS = ("<NO_OTHER_FAILURES>", "<NO OTHER FAILURES>")
_ENTRY = re.compile(r"^\[(\d+)\]:$")
_FIELD = re.compile(r"^(time|host|rank|exitcode|error_file|traceback|msg)\s*:\s?(.*)$")
_RANK_FIELD = re.compile(r"(-?\d+)(?: \(local_rank: (\d+)\))?")
_EXIT_FIELD = re.compile(r"(-?\d+)(?: \(pid: (\d+)\))?")
_FAILED_SCRIPT = re.compile(r"^(\S.*?) FAILED$")
_RULE = re.compile(r"^([=*-])\1{4,}$")
_JSON_MESSAGE = re.compile(r'"message": "(?P<message>(?:[^"\\]|\\.)*)"')
# A summary retyped from a screenshot runs its fields together ("rank2 (local rank: 2)exitcode:
# -9 (pid: 36071)error file: <N/A>"): read what can be read.
_LOOSE_RANK = re.compile(r"(?<![\w])rank\s*:?\s*(\d+)(?:\s*\(local[ _]rank\s*:?\s*(\d+)\))?")
_LOOSE_EXIT = re.compile(r"exit\s?code\s*:?\s*(-?\d+)(?:\s*\(pid\s*:?\s*(\d+)\))?")
_SIGNAL_TEXT = re.compile(r"[Ss]ignal (\d+) \((SIG[A-Z]+)\)")
# What a collector or a relaying launcher puts before each line: "stderr: " (accelerate's test
# script), "[1,0]<stderr>:" (mpirun), "[rank3]:" / "[default0]:" (torchrun --tee), a timestamp.
_PREFIX = re.compile(
    r"^(?:\s*(?:std(?:err|out)\s*:|\[\d+,\d+\]<std(?:err|out)>:|\[(?:rank|[a-z_]+)\d+\]:"
    r"|\d{4}-\d\d-\d\d[T _]\d\d:\d\d:\d\d(?:[.,]\d+)?(?:Z|[+-]\d\d:?\d\d)?)(?: |$))+"
)
_MAX_BLOCK_LINES = 400
_MAX_FOREIGN_LINES = 40

# --- the agent's own lines ------------------------------------------------------------------
# torch/distributed/elastic/multiprocessing/api.py (SubprocessContext._poll), every release
# since 1.9: logger.error("failed (exitcode: %s) local_rank: %s (pid: %s) of binary: %s") for
# the first failure; MultiprocessContext: "... of fn: %s (start_method: %s)". The logger's
# format changed, not the text: "ERROR:torch.distributed.elastic.multiprocessing.api:" (<= 2.0,
# logging.basicConfig), "[2024-05-08 08:47:31,877] torch.distributed.elastic.multiprocessing.api:
# [ERROR]" (2.1, 2.2), "E0325 20:57:27.620000 2606 torch/distributed/elastic/multiprocessing/
# api.py:869]" (>= 2.3, glog-style).
_AGENT_FAILED = re.compile(
    r"failed \(exitcode: (?P<code>-?\d+)\) local_rank: (?P<local>\d+) \(pid: (?P<pid>\d+)\)"
)
# torch 1.9/1.10 errors/__init__.py _no_error_file_warning_msg: "Child process %s (local_rank
# %s) FAILED (exitcode %s)" in the "CHILD PROCESS FAILED WITH NO ERROR_FILE" warning.
_CHILD_FAILED = re.compile(
    r"Child process (?P<pid>\d+) \(local_rank (?P<local>\d+)\) FAILED \(exitcode (?P<code>-?\d+)\)"
)
# torch/distributed/launch.py before the elastic agent (torch 1.1 .. 1.8): the launcher waits for
# each worker and raises subprocess.CalledProcessError(returncode, cmd) for the first that exits
# non-zero; the command holds the worker's "--local_rank=%d". Python's message: "Command '%s'
# returned non-zero exit status %d." or "Command '%s' died with <Signals.SIGKILL: 9>.".
_LAUNCH_FAILED = re.compile(
    r"CalledProcessError: Command '\[(?P<cmd>.*)\]' (?:returned non-zero exit status "
    r"(?P<code>-?\d+)|died with <Signals\.(?P<sig>SIG[A-Z]+): (?P<num>\d+)>)"
)
_LOCAL_RANK_ARG = re.compile(r"'--local[_-]rank[= ]?(?P<local>\d+)'")
# torch/distributed/elastic/agent/server/api.py (SimpleElasticAgent._invoke_run), every release:
# "[%s] Worker group %s. %s/%s attempts left; will restart worker group" (state FAILED or
# UNHEALTHY); DLRover's agent: "Worker group FAILED, is failure node: False,3/3 attempts left".
_RESTART = re.compile(
    r"Worker group (?:FAILED|UNHEALTHY)[.,](?: is failure node: \w+,)?\s*"
    r"(?P<left>\d+)/(?P<max>\d+) attempts left"
)
# When the agent logged a line, in the logger's format: glog's "E1205 11:30:19.070000" (month,
# day; torch >= 2.3) or "[2024-05-08 08:47:31,877]" (2.1, 2.2); the older logging.basicConfig
# format has none. Read as "MM-DD HH:MM:SS.ffffff", the part every format holds, so that the
# agents' failures of one job sort by time (diagnose names the first).
_GLOG_TIME = re.compile(r"^[IWEF](\d\d)(\d\d) (\d\d:\d\d:\d\d)(?:\.(\d+))? ")
_BRACKET_TIME = re.compile(r"^\[\d{4}-(\d\d)-(\d\d) (\d\d:\d\d:\d\d)(?:,(\d+))?\]")
# multiprocessing/api.py PContext._close also logs "Sending process %s closing signal %s" for
# the survivors of a failure, but also for every worker when the agent itself is stopped: no
# evidence of a failed rank, so not read.


def _signal_name(exitcode: int) -> str | None:
    if exitcode >= 0:
        return None
    try:
        return signal.Signals(-exitcode).name
    except ValueError:
        return f"signal {-exitcode}"


def _logged_at(line: str) -> str | None:
    """The agent line's own time as "MM-DD HH:MM:SS.ffffff", when its format has one."""
    stamp = _GLOG_TIME.match(line) or _BRACKET_TIME.match(line)
    if stamp is None:
        return None
    month, day, clock, fraction = stamp.groups()
    return f"{month}-{day} {clock}.{(fraction or '')[:6]:0<6}"


def _elastic_advice(root: dict[str, Any]) -> str:
    sig = root.get("signal")
    error = root.get("error", "")
    if not root:
        return (
            "The log holds no root cause for this failure: find the first rank that failed in "
            "the ranks' own logs (the lowest timestamp), or rerun with torchrun's --tee 3 and "
            "@record on the entry point so the summary names it."
        )
    if sig == "SIGKILL":
        return (
            "The root-cause rank was SIGKILLed: usually the host's OOM killer (check "
            "`dmesg` for 'Killed process') or the scheduler enforcing a memory/time limit."
        )
    if sig == "SIGABRT":
        return (
            "The root-cause rank aborted: most often ProcessGroupNCCL's watchdog tearing the "
            "process down after a collective timeout or NCCL error; see the "
            f"{Failure.NCCL_TIMEOUT.value} and {Failure.NCCL_ERROR.value} findings for that rank."
        )
    if sig == "SIGSEGV" or sig == "SIGBUS":
        return (
            "The root-cause rank crashed in native code (driver, NCCL or an extension): check "
            f"{Failure.GPU_FAULT.value} (Xid) findings for that node and run once with "
            "CUDA_LAUNCH_BLOCKING=1."
        )
    if sig in ("SIGTERM", "SIGINT", "SIGHUP"):
        return (
            "The root-cause rank was terminated from outside (preemption, the scheduler, or the "
            "agent tearing down after another failure): check the scheduler's records."
        )
    if "out of memory" in error:
        return f"The root cause is a CUDA OOM on that rank: see the {Failure.OOM.value} finding."
    return (
        "Fix the root-cause rank's exception first (the traceback above or its error_file): "
        "the other ranks' failures are usually its consequences."
    )


@dataclass
class _Entry:
    section: str  # "root", "failure", or "unknown" (a summary pasted without its headers)
    fields: dict[str, Any] = field(default_factory=dict)
    last_field: str | None = None


@dataclass
class _Block:
    start: Location
    source: Source
    section: str | None = None
    script: str | None = None
    entries: list[_Entry] = field(default_factory=list)
    failures_seen: bool = False
    # a header, a section or an "[idx]:" line was seen: not just a line that looks like a field
    framed: bool = False
    lines: int = 0
    foreign: int = 0

    def root(self) -> _Entry | None:
        return next((e for e in self.entries if e.section == "root"), None)


@dataclass
class _Summary:
    """A finished summary: its root cause (empty when the excerpt lacks it) and other ranks."""

    start: Location
    script: str | None
    root: dict[str, Any]
    others: list[dict[str, Any]]


@dataclass
class _SourceState:
    restarts: int = 0
    max_restarts: int | None = None
    restart_where: Location | None = None
    agent: tuple[Location, dict[str, Any]] | None = None
    # Every worker failure the agent logged, in order (a job restarted after each): the first
    # is ``agent``'s; diagnose joins each by pid with the hook's events.
    agent_failures: list[dict[str, Any]] = field(default_factory=list)
    summaries: list[_Summary] = field(default_factory=list)


@register
class ElasticFailureDetector:
    """torchrun's ChildFailedError summary (root-cause rank, exit code or signal), the agent's
    failed-worker and restart lines."""

    # The summary's first line names ChildFailedError (bare when rich or a launcher printed the
    # exception); a summary pasted from its middle starts at "Root Cause" or a "rank : R
    # (local_rank: L)" field; the agent's failure lines and the old launcher's command all hold
    # "local_rank"; restarts say "attempts left". Few needles keep the scan fast.
    failure: ClassVar[Failure] = Failure.RANK_FAILURE
    keywords: tuple[str, ...] = ("ChildFailedError", "Root Cause", "local_rank", "attempts left")
    # "ChildFailedError" is found by the word "rror" the NCCL detectors search for too.
    needles: tuple[str, ...] = ("rror", "Root Cause", "local_rank", "attempts left")

    @classmethod
    def from_thresholds(cls, thresholds: Thresholds) -> ElasticFailureDetector:
        return cls()

    def __init__(self) -> None:
        self.dropped = 0
        self._block: _Block | None = None
        self._sources: dict[str, _SourceState] = {}

    def _state(self, source: Source) -> _SourceState:
        state = self._sources.get(source.name)
        if state is None:
            if len(self._sources) >= MAX_GROUPS:
                self.dropped += 1
                state = _SourceState()  # counted, then forgotten
            else:
                state = self._sources[source.name] = _SourceState()
        return state

    def feed(self, line: str, where: Location, source: Source) -> bool:
        if self._block is not None:
            if self._block.source is source:
                return self._block_line(line, where)
            self._finish_block()  # a summary cut off by the end of its file still counts
        self._agent_line(line, where, source)
        return self._start(line, where, source)

    def _start(self, line: str, where: Location, source: Source) -> bool:
        """Open a summary block if ``line`` begins one (or its middle, for a partial paste)."""
        stripped = _strip_prefix(line).strip()
        if _HEADER.search(stripped):
            self._block = _Block(where, source, framed=True)
            return True
        if _ROOT_SECTION.match(stripped):
            self._block = _Block(where, source, section="root", framed=True)
            return True
        found = _FIELD.match(stripped)
        if found and found.group(1) == "rank" and "(local_rank:" in found.group(2):
            # the middle of a summary whose header the excerpt lacks
            self._block = _Block(where, source, section="unknown")
            self._block_line(line, where)
            return True
        return False

    # --- agent lines ---------------------------------------------------------------------
    def _agent_line(self, line: str, where: Location, source: Source) -> None:
        if "attempts left" in line:
            restart = _RESTART.search(line)
            if restart:
                state = self._state(source)
                state.restarts += 1
                state.max_restarts = int(restart["max"])
                state.restart_where = state.restart_where or where
            return
        if "local_rank" not in line:
            return
        if "CalledProcessError" in line:
            self._launch_line(line, where, source)
            return
        failed = _AGENT_FAILED.search(line) or _CHILD_FAILED.search(line)
        if failed:
            state = self._state(source)
            code = int(failed["code"])
            worker = {
                "local_rank": int(failed["local"]),
                "exitcode": code,
                "pid": int(failed["pid"]),
                "signal": _signal_name(code),
            }
            if state.agent is None:
                state.agent = (where, worker)
            if len(state.agent_failures) < MAX_LISTED:
                state.agent_failures.append(
                    {**worker, "time": _logged_at(_strip_prefix(line).lstrip()), "line": where.line}
                )

    def _launch_line(self, line: str, where: Location, source: Source) -> None:
        launch = _LAUNCH_FAILED.search(line)
        local = _LOCAL_RANK_ARG.search(launch["cmd"]) if launch else None
        if launch is None or local is None:
            return  # some other program's subprocess
        state = self._state(source)
        if state.agent is not None:
            return
        code = int(launch["code"]) if launch["code"] else -int(launch["num"])
        state.agent = (
            where,
            {"local_rank": int(local["local"]), "exitcode": code, "signal": _signal_name(code)},
        )

    # --- the summary ---------------------------------------------------------------------
    def _block_line(self, line: str, where: Location) -> bool:
        block = self._block
        assert block is not None
        block.lines += 1
        if block.lines > _MAX_BLOCK_LINES:
            self._finish_block()
            return False
        self._agent_line(line, where, block.source)
        text = _strip_prefix(line)
        stripped = text.strip()
        entry = block.entries[-1] if block.entries else None
        root = block.root()
        rule = _RULE.match(stripped)
        if rule:
            if entry is not None:
                entry.last_field = None
            done = root is not None and _identified(root.fields)
            # >= 1.11 closes with "=" after the root cause, which comes last; 1.9/1.10 put the
            # root cause first and close with "*" after the other failures.
            if done and rule.group(1) != "-" and (block.failures_seen or rule.group(1) == "*"):
                self._finish_block()
                return False
            return True
        if stripped in _FAILURE_SECTIONS:
            block.section = "failure"
            block.failures_seen = block.framed = True
            return True
        if _ROOT_SECTION.match(stripped) or stripped.startswith("Root Cause"):
            block.section = "root"
            block.framed = True
            return True
        if stripped in _NO_OTHERS:
            return True
        if _ENTRY.match(stripped):
            block.entries.append(_Entry(block.section or "unknown"))
            block.foreign = 0
            block.framed = True
            return True
        found = _FIELD.match(stripped)
        if found:
            if entry is None or (found.group(1) == "rank" and "rank" in entry.fields):
                entry = _Entry(block.section or "unknown")
                block.entries.append(entry)
            name, value = found.group(1), found.group(2).strip()
            _set_field(entry.fields, name, value)
            entry.last_field = name
            if name == "rank" and "exitcode" not in entry.fields:
                _loose_fields(entry.fields, value)
            block.foreign = 0
            return True
        if entry is not None and stripped:
            if entry.last_field in ("traceback", "msg") and text[:1].isspace():
                _continuation(entry.fields, stripped)
                return True
            if not _identified(entry.fields) and _loose_fields(entry.fields, stripped):
                entry.last_field = None
                return True
        if not stripped:
            return True
        script = _FAILED_SCRIPT.match(stripped)
        if script and block.script is None and not block.entries:
            block.script = script.group(1).lstrip("“\"'")
            return True
        # a line that is no part of a summary: after the root cause, the summary is over
        if root is not None and _identified(root.fields):
            self._finish_block()
            return self._start(line, where, block.source)
        block.foreign += 1
        if block.foreign > _MAX_FOREIGN_LINES:
            self._finish_block()
            return False
        return True

    def _finish_block(self) -> None:
        block = self._block
        self._block = None
        assert block is not None
        root = block.root()
        # a failure counts once its exit code is read, or its rank inside a framed summary
        others = [
            e.fields
            for e in block.entries
            if e.section != "root"
            and (_identified(e.fields) or (block.framed and "rank" in e.fields))
        ]
        if root is not None and not (_identified(root.fields) or "rank" in root.fields):
            root = None
        if root is None and not others:
            return
        state = self._state(block.source)
        state.summaries.append(
            _Summary(block.start, block.script, dict(root.fields) if root else {}, others)
        )

    # --- findings --------------------------------------------------------------------------
    def findings(self) -> list[Finding]:
        if self._block is not None:
            self._finish_block()
        out: list[Finding] = []
        for state in self._sources.values():
            complete = [s for s in state.summaries if s.root]
            partial = [s for s in state.summaries if not s.root]
            for summary in complete:
                out.append(self._summary_finding(state, summary.root, summary))
            if complete:
                continue
            if state.agent is not None:
                where, root = state.agent
                cut = partial[0] if partial else None
                out.append(self._summary_finding(state, dict(root), cut, where))
            elif partial:
                out.append(self._summary_finding(state, {}, partial[0]))
            elif state.restarts and state.restart_where is not None:
                out.append(self._summary_finding(state, {}, None, state.restart_where))
        if len(out) > MAX_GROUPS:
            self.dropped += len(out) - MAX_GROUPS
            out = out[:MAX_GROUPS]
        return out

    def _summary_finding(
        self,
        state: _SourceState,
        root: dict[str, Any],
        summary: _Summary | None,
        where: Location | None = None,
    ) -> Finding:
        others = summary.others if summary else []
        fields: dict[str, Any] = {
            "script": summary.script if summary else None,
            "root_cause": root,
            "other_failures": len(others),
            "other_failed_ranks": sorted({e["rank"] for e in others if "rank" in e})[:MAX_LISTED],
            "restarts": state.restarts,
        }
        if state.max_restarts is not None:
            fields["max_restarts"] = state.max_restarts
        if state.agent_failures:
            fields["agent_failures"] = state.agent_failures
        location = where or (summary.start if summary else Location("", 0))
        return Finding(
            Failure.RANK_FAILURE,
            _summary_text(root, fields, summary is not None),
            location,
            _elastic_advice(root),
            fields,
        )


def _summary_text(root: dict[str, Any], fields: dict[str, Any], has_summary: bool) -> str:
    job = fields["script"] or "the job"
    if not root:
        ranks = fields["other_failed_ranks"]
        if ranks:
            listed = ", ".join(map(str, ranks))
            return f"torchrun: {job} failed (ranks {listed}); the root cause is not in this log"
        left = fields.get("max_restarts")
        return (
            f"torchrun restarted the worker group {fields['restarts']} time(s)"
            + (f" (max {left})" if left is not None else "")
            + " after a worker failed; the failed worker is not named in this log"
        )
    how = (
        f"signal {root['signal']}"
        if root.get("signal")
        else f"exit code {root.get('exitcode', '?')}"
    )
    if "rank" in root:
        return (
            f"torchrun: {job} failed; root cause rank {root['rank']} on "
            f"{root.get('host', '?')} ({how})"
        )
    suffix = "" if has_summary else "; no ChildFailedError summary in this file"
    return f"torchrun: local rank {root.get('local_rank', '?')} failed ({how}){suffix}"


def _strip_prefix(line: str) -> str:
    prefix = _PREFIX.match(line)
    return line[prefix.end() :] if prefix else line


def _identified(fields: dict[str, Any]) -> bool:
    return "exitcode" in fields or fields.get("signal") is not None


def _set_field(entry: dict[str, Any], name: str, value: str) -> None:
    if name == "rank":
        rank = _RANK_FIELD.match(value)
        if rank:
            entry["rank"] = int(rank.group(1))
            if rank.group(2) is not None:
                entry["local_rank"] = int(rank.group(2))
    elif name == "exitcode":
        code = _EXIT_FIELD.match(value)
        if code:
            entry["exitcode"] = int(code.group(1))
            if code.group(2) is not None:
                entry["pid"] = int(code.group(2))
            entry["signal"] = _signal_name(entry["exitcode"])
    elif name in ("traceback", "msg"):
        value = value.strip('"')
        if value and value != "<N/A>" and not value.startswith("Traceback"):
            entry["error"] = trim(value)
            _signal_from_text(entry, value)
    elif value and value != "<N/A>":
        entry[name] = value


def _continuation(entry: dict[str, Any], text: str) -> None:
    """A line of a traceback (the error is its last line) or of an error file's JSON."""
    message = _JSON_MESSAGE.search(text)
    if message:
        entry["error"] = trim(message["message"])
    elif not text.startswith(("{", "}", "]", "[", '"')):
        entry["error"] = trim(text)


def _loose_fields(entry: dict[str, Any], text: str) -> bool:
    """Fields run together or misspelt; True when any was read."""
    found = False
    rank = _LOOSE_RANK.search(text)
    if rank and "rank" not in entry:
        entry["rank"] = int(rank.group(1))
        if rank.group(2) is not None:
            entry["local_rank"] = int(rank.group(2))
        found = True
    code = _LOOSE_EXIT.search(text)
    if code and "exitcode" not in entry:
        entry["exitcode"] = int(code.group(1))
        if code.group(2) is not None:
            entry["pid"] = int(code.group(2))
        entry["signal"] = _signal_name(entry["exitcode"])
        found = True
    return found or _signal_from_text(entry, text)


def _signal_from_text(entry: dict[str, Any], text: str) -> bool:
    sig = _SIGNAL_TEXT.search(text)
    if sig and entry.get("signal") is None:
        entry["signal"] = sig.group(2)
        entry.setdefault("exitcode", -int(sig.group(1)))
        return True
    return False
