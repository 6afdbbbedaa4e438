"""NCCL errors: ``NCCL WARN`` lines and the errors torch raises from them, by kind.

Two shapes of line report an NCCL failure, and this detector reads both:

* NCCL's own ``WARN`` lines, ``[time] host:pid:tid [dev] file.cc:line [(func)] NCCL WARN msg``
  (``nccl_grammar.PREFIX``; src/debug.cc), each classified by ``nccl_grammar.classify`` as the
  exporter classifies it, so a line has one kind in both.
* The error a caller raises from NCCL's result code, and the detail that follows it: torch's
  ``NCCL error in: <file>:<line>, <ncclGetErrorString>, NCCL version x.y.z`` (C10D_NCCL_CHECK,
  torch/csrc/distributed/c10d/NCCLUtils.hpp) or the watchdog's ``NCCL error: <string>, NCCL
  version x.y.z`` (ProcessGroupNCCL::checkForNCCLErrorsInternal), then, from torch 1.13 with
  NCCL 2.13+, ``ncclXxxError: <interpretation>``, ``Last error:`` and ``ncclGetLastError``'s
  text (getNcclErrorDetailStr, torch/csrc/distributed/c10d/NCCLUtils.cpp). These lines are a
  block: the detector follows it (the scanner's ``feed`` -> True) so the lines after the first
  count once and the last error, which has no keyword of its own, is read.

A block's kind is its result code's: a result code says what failed (``ncclRemoteError`` is a
peer lost whatever socket error the last error names). ``ncclInternalError`` is the exception:
NCCL returns it for failures it did not sort (up to 2.18 every network error surfaced as an
internal error, NVIDIA/nccl#795 and #1092), so a block reporting it takes the last error's kind
when the last error has one ("Bootstrap : no socket interface found" is a socket problem).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, ClassVar

from trainguard import nccl_grammar
from trainguard.contract import Failure, NcclErrorKind
from trainguard.thresholds import Thresholds
from trainguard.triage.detectors.base import (
    Source,
    add_listed,
    bounded_get,
    rank_of,
    register,
    trim,
)
from trainguard.triage.findings import Finding, Location

_K = NcclErrorKind

# What a caller raises from an NCCL result code (the first line of a block):
# - torch "NCCL error in: <file>:<line>, <string>" (C10D_NCCL_CHECK, NCCLUtils.hpp, torch 1.0+)
#   and "NCCL error: <string>" (ProcessGroupNCCL.cpp checkForNCCLErrorsInternal; vLLM's pynccl
#   wrapper raises the same words: vllm/distributed/device_communicators/pynccl_wrapper.py);
# - torch "NCCL Error <code>: <string>" (throw_nccl_error, torch/csrc/cuda/nccl.cpp, used by
#   torch.cuda.nccl and DataParallel's broadcast_coalesced);
# - other callers name the failed call and ncclGetErrorString's text: TensorFlow/Horovod
#   "ncclCommInitRank failed: unhandled system error" (horovod/horovod#1651), OneFlow "NCCL
#   Check failed: ncclGroupEnd() : unhandled system error" (Oneflow-Inc/oneflow#3586);
# - nccl-tests "<host>: Test NCCL failure <file>:<line> '<string> / <last error>'" (src/common.h,
#   NCCLCHECK; built against NCCL < 2.13 it prints "'<string>'" alone).
_CALLER_KEYWORDS = ("NCCL error", "NCCL Error", "NCCL failure")
# "NCCL WARN" (src/debug.cc, every release); "Got completion" for the IB completion error quoted
# without NCCL's prefix (src/transport/net_ib.cc: "NET/IB : Got completion from peer %s with
# error %d, ..." 2.12-2.20, "... with status=%d opcode=%d ..." 2.21+, "with error %d" without
# "from peer" up to 2.11; plugins print "NET/IBext" or vendor tags such as "NET/IBP:").
_WARN_KEYWORDS = ("NCCL WARN", "Got completion")
# nccl-tests' inline last error, up to the line's last quote (the error may quote: "Cuda failure
# 'out of memory'").
_TESTS_LAST_ERROR = re.compile(r"NCCL failure \S+ '.*? / (?P<last>.+)'")
# getNcclErrorDetailStr (torch/csrc/distributed/c10d/NCCLUtils.cpp, NCCL 2.13+): "\nLast error:\n"
# + ncclGetLastError(), or "\nLast error: Unknown NCCL Error\n" on one line.
_LAST_ERROR = re.compile(r"Last error:[ \t]*(?P<rest>.*)$")
# torch's detail line when no "Last error" follows (NCCL < 2.13 or torch < 1.13):
# "ncclSystemError: System call (socket, malloc, munmap, etc) failed."
_RESULT_LINE = re.compile(r"(?P<lead>.*?)\b(?:" + "|".join(nccl_grammar.RESULT_CODES) + r")\b:")
# Where a terminal-width paste joined the exception's lines into one, padding with spaces, the
# last error ends at a run of spaces or at torch's "Exception raised from" (c10::Error's
# backtrace header; deepseek-ai/DeepEP#106 in the corpus).
_INLINE_END = re.compile(r"\s{3,}|Exception raised from ")
# WARNs NCCL itself later made INFO because they are not failures: NCCL goes on without IB
# verbs (src/misc/ibvwrap.cc:63, WARN up to 2.10, INFO from 2.11; misc/ibvsymbols.cc 2.19+).
_BENIGN_WARNS = ("Failed to open libibverbs.so",)
# ncclGetErrorString's texts (src/init.cc; "(run with NCCL_DEBUG=... for details)" and "- please
# report this issue" appended from 2.18), to find one a terminal wrapped onto the next line.
_RESULT_STRING = re.compile(
    r"unhandled (?:cuda|system) error|internal error|invalid argument|invalid usage|"
    r"remote process exited or there was a network error"
)
# Terminals wrap long lines at their width without a space; only a long line can have been
# wrapped, and its continuation starts at the left edge.
_WRAP_MIN = 60
# A block is at most: the caller's line, a detail line, "Last error:", its text; blank lines
# between them are allowed (pastes double-space lines), a few.
_MAX_BLOCK_LINES = 6

# "with error 12," (<= 2.20), "with status=12 " (2.21+), "with status=IBV_WC_RETRY_EXC_ERR(12) "
# (2.30, src/transport/net_ib/p2p.cc).
_IB_STATUS = re.compile(r"with (?:error |status=)(?:\w+\()?(?P<status>\d+)")
# "from peer %s" (net_ib.cc 2.12+): ncclSocketToString's "address<port>".
_IB_PEER = re.compile(r"from peer (?P<peer>[\w.:-]+(?:<\d+>)?)")
# ibv_wc_status values NCCL reports as "error N" / "status=N" (infiniband/verbs.h).
_IB_STATUS_TEXT = {
    4: "local protection error",
    5: "work request flushed (the queue pair went into error earlier)",
    10: "remote access error",
    12: "transport retry counter exceeded (peer unreachable or link down)",
    13: "RNR retry counter exceeded (peer not posting receives)",
}


@dataclass
class _ErrorGroup:
    kind: NcclErrorKind
    first: Location
    message: str
    count: int = 0
    hosts: set[str] = field(default_factory=set)
    ranks: set[int] = field(default_factory=set)
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass
class _Block:
    """A caller's error being read: its first line and what has followed so far."""

    line: str
    where: Location
    source: Source
    kind: NcclErrorKind
    rank: int | None
    lines: int = 1
    detail_seen: bool = False
    lead: str | None = None  # what precedes "Last error:" on its line, once seen
    last_error: str | None = None


@register
class NcclErrorDetector:
    """NCCL WARN lines and the errors torch raises from them, by kind, per input file.

    The kind is ``trainguard.nccl_grammar.classify``'s, the exporter's ``kind`` label too.
    """

    failure: ClassVar[Failure] = Failure.NCCL_ERROR

    # Literal keywords, so that the scanner hands over only the lines that hold one: NCCL's own
    # lines, the callers' first lines, and (by "nccl", which every ncclResult_t name starts
    # with) torch's detail line standing alone, a paste that lost the line above it. One
    # keyword for the seven result codes: each keyword is a pass of bytes.find over the input.
    keywords: tuple[str, ...] = (*_WARN_KEYWORDS, *_CALLER_KEYWORDS, "nccl")
    # What the scanner searches chunks for: every needle is a pass over the whole input, so the
    # callers' lines are found by the word they share ("NCCL error", "NCCL Error", the result
    # codes ncclSystemError, ..., and nccl-tests' "NCCL failure ... 'unhandled system error'" all
    # say "rror"); a result code without it (ncclInvalidUsage) is read as the line after torch's
    # "NCCL error in:", which the detector follows.
    needles: tuple[str, ...] = (*_WARN_KEYWORDS, "rror")

    @classmethod
    def from_thresholds(cls, thresholds: Thresholds) -> NcclErrorDetector:
        return cls()

    def __init__(self) -> None:
        self.dropped = 0
        self._groups: dict[tuple[str, NcclErrorKind], _ErrorGroup] = {}
        self._versions: set[str] = set()
        self._block: _Block | None = None
        # A WARN line of no known kind, held for one line in case a terminal wrapped it.
        self._wrapped: tuple[str, re.Match[str] | None, Location, Source] | None = None

    # --- lines ------------------------------------------------------------------------------
    def feed(self, line: str, where: Location, source: Source) -> bool:
        if "NCCL version" in line:  # torch's error lines name the version
            version = nccl_grammar.VERSION.search(line)
            if version:
                add_listed(self._versions, version["version"])
        if self._wrapped is not None:
            first, prefix, first_where, first_source = self._wrapped
            self._wrapped = None
            if first_source.name == source.name and self._wraps(line):
                joined = first + line
                if nccl_grammar.classify(joined) is not _K.OTHER:
                    self._record_warn(joined, prefix, first_where, first_source)
                    return False
            self._record_warn(first, prefix, first_where, first_source)
            if not any(keyword in line for keyword in self.keywords):
                return False  # handed over only because the WARN line was followed
        block = self._block
        if block is not None:
            if block.source.name == source.name:
                follow = self._continue(block, line)
                if follow is not None:
                    return follow
            self._close()
            if not any(keyword in line for keyword in self.keywords):
                return False  # handed over only because the block was followed
        prefix = nccl_grammar.PREFIX.search(line)
        if prefix:
            if prefix["level"] != "WARN":
                return False  # INFO and TRACE lines are progress, not failures
            return self._warn(line, prefix, where, source)
        if (
            any(keyword in line for keyword in _CALLER_KEYWORDS)
            or nccl_grammar.RESULT_CODE.search(line)
            or ("nccl" in line and _RESULT_STRING.search(line))
        ):
            return self._open(line, where, source)
        if any(keyword in line for keyword in _WARN_KEYWORDS):
            return self._warn(line, None, where, source)
        return False

    def _warn(
        self, line: str, prefix: re.Match[str] | None, where: Location, source: Source
    ) -> bool:
        message = line[prefix.end() :] if prefix else line
        if any(benign in message for benign in _BENIGN_WARNS):
            return False
        if len(line) >= _WRAP_MIN and _warn_kind(line, prefix) is _K.OTHER:
            self._wrapped = (line, prefix, where, source)
            return True  # the next line may be the rest of it
        self._record_warn(line, prefix, where, source)
        return False

    def _record_warn(
        self, line: str, prefix: re.Match[str] | None, where: Location, source: Source
    ) -> None:
        kind = _warn_kind(line, prefix)
        group = self._group(kind, line, where, source)
        if group is None:
            return
        if prefix:
            add_listed(group.hosts, prefix["host"])
        if kind is _K.IB:
            self._ib_details(group, line)

    def _wraps(self, line: str) -> bool:
        """Whether ``line`` can be the wrapped rest of the line before it."""
        return (
            bool(line)
            and not line[0].isspace()
            and not _starts_block(line)
            and nccl_grammar.RESULT_CODE.search(line) is None
            and nccl_grammar.PREFIX.search(line) is None
        )

    def _open(self, line: str, where: Location, source: Source) -> bool:
        """A caller's error line: read the block it starts (the lines after it follow)."""
        code = nccl_grammar.RESULT_CODE.search(line)
        kind = nccl_grammar.RESULT_CODES[code["code"]] if code else nccl_grammar.classify(line)
        block = _Block(line, where, source, kind, rank_of(line, source))
        tests = _TESTS_LAST_ERROR.search(line)
        inline = _LAST_ERROR.search(line)
        if tests:
            block.last_error = tests["last"].strip()
        elif inline:
            block.last_error = _INLINE_END.split(inline["rest"].strip(), maxsplit=1)[0] or None
        if code or block.last_error is not None:
            block.detail_seen = True  # a detail line alone, or a one-line paste
        self._block = block
        if block.last_error is not None:
            self._close()
            return False
        return True

    def _continue(self, block: _Block, line: str) -> bool | None:
        """Take ``line`` into the block; True to read on, False when it ends the block, None
        when the line is not the block's (the caller closes the block and reads it anew)."""
        block.lines += 1
        if block.lines > _MAX_BLOCK_LINES:
            return None
        text = line.strip()
        if block.lines == 2 and block.kind is _K.OTHER and self._wraps(line):
            joined = block.line + line
            if _RESULT_STRING.search(joined):  # the result's text was wrapped onto this line
                block.line = joined
                block.kind = nccl_grammar.classify(joined)
                return True
        if block.lead is not None:  # the line after "Last error:" is its text
            lead = block.lead
            if line.startswith(lead) or (not lead.strip() and text):
                message = line[len(lead) :].strip() if lead.strip() else text
            elif _same_shape(lead, line) and rank_of(line, block.source) == block.rank:
                message = line[len(lead) :].strip()
            else:
                return None
            # ncclGetLastError is a WARN's text (an IB completion error, say), never a caller's
            if not message or any(keyword in message for keyword in _CALLER_KEYWORDS):
                return None
            block.last_error = message
            self._close()
            return False
        if not text:
            return True
        last = _LAST_ERROR.search(line)
        if last:
            block.lead = line[: last.start()]
            rest = last["rest"].strip()
            if rest:
                block.last_error = rest
                self._close()
                return False
            return True
        detail = _RESULT_LINE.match(line)
        if detail and not block.detail_seen and "NCCL error" not in line:
            block.detail_seen = True
            return True
        return None

    def _close(self) -> None:
        block, self._block = self._block, None
        if block is None:
            return
        kind = block.kind
        last_kind = None
        if block.last_error is not None:
            last_kind = nccl_grammar.classify(block.last_error)
            if kind in (_K.INTERNAL, _K.OTHER) and last_kind is not _K.OTHER:
                kind = last_kind
        group = self._group(kind, block.line, block.where, block.source, block.rank)
        if group is None:
            return
        if block.last_error is not None:
            group.extra.setdefault("last_error", trim(block.last_error))
            if kind is not block.kind:
                group.extra.setdefault("reported_as", block.kind.value)
            if kind is _K.IB or last_kind is _K.IB:
                self._ib_details(group, block.last_error)

    # --- groups -----------------------------------------------------------------------------
    def _group(
        self,
        kind: NcclErrorKind,
        line: str,
        where: Location,
        source: Source,
        rank: int | None = None,
    ) -> _ErrorGroup | None:
        group = bounded_get(
            self._groups,
            (source.name, kind),
            lambda: _ErrorGroup(kind, where, trim(line)),
            self,
        )
        if group is None:
            return None
        group.count += 1
        rank = rank if rank is not None else rank_of(line, source)
        if rank is not None:
            add_listed(group.ranks, rank)
        return group

    @staticmethod
    def _ib_details(group: _ErrorGroup, text: str) -> None:
        if "ib_status" in group.extra:
            return
        status = _IB_STATUS.search(text)
        if status:
            code = int(status["status"])
            group.extra["ib_status"] = code
            group.extra["ib_status_text"] = _IB_STATUS_TEXT.get(code, "see ibv_wc_status")
        peer = _IB_PEER.search(text)
        if peer:
            group.extra["peer"] = peer["peer"]

    def findings(self) -> list[Finding]:
        if self._wrapped is not None:  # a WARN line the input ended in
            self._record_warn(*self._wrapped)
            self._wrapped = None
        self._close()  # a block the input ended in
        out = []
        for group in self._groups.values():
            fields: dict[str, Any] = {
                "kind": group.kind.value,
                "message": group.message,
                "hosts": sorted(group.hosts),
                "ranks": sorted(group.ranks),
                **group.extra,
            }
            if self._versions:
                fields["nccl_versions"] = sorted(self._versions)
            advice = nccl_grammar.ADVICE[group.kind]
            if len(self._versions) > 1:
                advice += " Ranks report different NCCL versions: align them."
            out.append(
                Finding(
                    Failure.NCCL_ERROR,
                    f"NCCL error of kind {group.kind.value} ({group.count} line(s))",
                    group.first,
                    advice,
                    fields,
                    group.count,
                )
            )
        return out


def _warn_kind(line: str, prefix: re.Match[str] | None) -> NcclErrorKind:
    """A WARN line's kind as the exporter gives it: the source file NCCL names, then the
    message."""
    if prefix is None:
        return nccl_grammar.classify(line)
    return nccl_grammar.warning_kind(prefix["source"], line[prefix.end() :])


_DIGITS = re.compile(r"\d")


def _same_shape(lead: str, line: str) -> bool:
    """Whether ``line`` starts with a prefix like ``lead`` but for its digits (a log
    collector's timestamp that moved on between the two lines)."""
    return bool(lead.strip()) and _DIGITS.sub("0", line[: len(lead)]) == _DIGITS.sub("0", lead)


def _starts_block(text: str) -> bool:
    """Whether ``text`` is a line of its own kind (a caller's error or a WARN), never the
    continuation of another."""
    return any(keyword in text for keyword in (*_CALLER_KEYWORDS, *_WARN_KEYWORDS))
