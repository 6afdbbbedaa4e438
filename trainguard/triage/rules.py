"""Detectors: each recognises one kind of failure in raw log lines and folds repeats together.

A detector names the literal keywords its lines always contain; the scanner only hands it lines
holding one of them, which is what keeps triage fast on gigabytes of noise. Each detector keeps
a bounded number of distinct failures (``MAX_GROUPS``) and counts what it had to leave out.
"""

from __future__ import annotations

import re
import signal
import statistics
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol, TypeVar

from trainguard import nccl_errors
from trainguard.contract import Failure, NcclErrorKind
from trainguard.thresholds import Thresholds, load_default
from trainguard.triage import xid
from trainguard.triage.findings import Finding, Location

MAX_GROUPS = 10_000
MAX_LISTED = 64  # ranks/hosts listed per finding; the count says how many there were
MAX_MESSAGE = 400

K = TypeVar("K")
V = TypeVar("V")


@dataclass
class Source:
    """The input a line comes from, and the rank its file name implies (if any)."""

    name: str
    rank_hint: int | None = None


class Detector(Protocol):
    failure: ClassVar[Failure]  # what its findings report (the contract's catalogue names it)
    keywords: tuple[str, ...]
    dropped: int

    def feed(self, line: str, where: Location, source: Source) -> bool:
        """Inspect one line; True asks for the next line too (multi-line blocks)."""

    def findings(self) -> list[Finding]: ...


def _bounded_get(groups: dict[K, V], key: K, make: Callable[[], V], owner: Detector) -> V | None:
    value = groups.get(key)
    if value is None:
        if len(groups) >= MAX_GROUPS:
            owner.dropped += 1
            return None
        value = groups[key] = make()
    return value


def _add_listed(values: set[Any], value: Any) -> None:
    if len(values) < MAX_LISTED:
        values.add(value)


# --- shared parsing -----------------------------------------------------------------------
_UNITS = {"bytes": 1, "B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30, "TiB": 1 << 40}
SIZE = r"[\d.]+ (?:bytes|B|KiB|MiB|GiB|TiB)"

# torchrun prefixes each worker line with [rank<global>]: or [<role><local_rank>]:
_RANK_PREFIX = re.compile(r"^\[(rank|[a-z_]+?)(\d+)\]:")
_RANK_IN_MESSAGE = re.compile(r"\bRank (\d+)\]")
_GLOG_TIME = re.compile(r"\[[EWIF](\d{4} \d\d:\d\d:\d\d\.\d+)")
_ISO_TIME = re.compile(r"(\d{4}-\d\d-\d\d[T ]\d\d:\d\d:\d\d(?:[.,]\d+)?)")


def parse_size(text: str) -> int:
    number, unit = text.split()
    return round(float(number) * _UNITS[unit])


def rank_of(line: str, source: Source) -> int | None:
    """The global rank a line belongs to, from torchrun's prefix, the message or the file."""
    prefix = _RANK_PREFIX.match(line)
    if prefix and prefix.group(1) == "rank":
        return int(prefix.group(2))
    in_message = _RANK_IN_MESSAGE.search(line)
    if in_message:
        return int(in_message.group(1))
    if prefix:  # [default3]: is a local rank; better than nothing on a single node
        return int(prefix.group(2))
    return source.rank_hint


def timestamp_of(line: str) -> str | None:
    glog = _GLOG_TIME.search(line)
    if glog:
        return glog.group(1)
    iso = _ISO_TIME.search(line)
    return iso.group(1).replace("T", " ").replace(",", ".") if iso else None


def _trim(text: str) -> str:
    text = text.strip()
    return text if len(text) <= MAX_MESSAGE else text[: MAX_MESSAGE - 3] + "..."


def _gib(n: int) -> str:
    return f"{n / (1 << 30):.2f} GiB"


# --- CUDA out of memory ---------------------------------------------------------------------
# PyTorch >= 2.1 (2.1 itself spells "capacty"):
_OOM_NEW = re.compile(
    rf"CUDA out of memory\. Tried to allocate (?P<tried>{SIZE})\. GPU (?P<gpu>\d+) has a total "
    rf"capaci?ty of (?P<total>{SIZE}) of which (?P<free>{SIZE}) is free\."
)
_OOM_THIS_PROCESS = re.compile(rf"this process has (?P<used>{SIZE}) memory in use")
_OOM_OTHER_PROCESS = re.compile(rf"Process (?P<pid>\d+) has (?P<used>{SIZE}) memory in use")
_OOM_SPLIT = re.compile(
    rf"Of the allocated memory (?P<allocated>{SIZE}) is allocated by PyTorch,"
    rf"(?: with (?P<private>{SIZE}) allocated in private pools[^,]*,)? and "
    rf"(?P<unallocated>{SIZE}) is reserved by PyTorch but unallocated"
)
# PyTorch <= 2.0:
_OOM_OLD = re.compile(
    rf"CUDA out of memory\. Tried to allocate (?P<tried>{SIZE}) \(GPU (?P<gpu>\d+); "
    rf"(?P<total>{SIZE}) total capacity; (?P<allocated>{SIZE}) already allocated; "
    rf"(?P<free>{SIZE}) free;(?: (?P<allowed>{SIZE}) allowed;)? "
    rf"(?P<reserved>{SIZE}) reserved in total by PyTorch\)"
)
_CUDA_ERROR_OOM = re.compile(r"CUDA error: out of memory")

# Share of PyTorch's reserved memory that is cached but unused above which an OOM is blamed
# on fragmentation rather than on the model simply not fitting.
FRAGMENTATION_SHARE = 0.2
_NON_PYTORCH_SIGNIFICANT = 2 << 30


class CudaOomDetector:
    """CUDA OOM in the allocator's old and new wording, and bare ``CUDA error: out of memory``."""

    failure: ClassVar[Failure] = Failure.OOM
    keywords: tuple[str, ...] = ("out of memory",)

    def __init__(self) -> None:
        self.dropped = 0
        self._groups: dict[tuple[str, int | None, str, int], Finding] = {}

    def feed(self, line: str, where: Location, source: Source) -> bool:
        fields = self._parse(line)
        if fields is None:
            return False
        rank = rank_of(line, source)
        if rank is not None:
            fields["rank"] = rank
        key = (source.name, rank, str(fields.get("gpu")), int(fields.get("tried_bytes", 0)))
        existing = self._groups.get(key)
        if existing is not None:
            existing.count += 1
        else:
            _bounded_get(self._groups, key, lambda: self._finding(fields, where), self)
        return False

    @staticmethod
    def _parse(line: str) -> dict[str, Any] | None:
        new = _OOM_NEW.search(line)
        if new:
            fields: dict[str, Any] = {
                "format": "pytorch>=2.1",
                "gpu": int(new["gpu"]),
                "tried_bytes": parse_size(new["tried"]),
                "total_bytes": parse_size(new["total"]),
                "free_bytes": parse_size(new["free"]),
            }
            this = _OOM_THIS_PROCESS.search(line)
            if this:
                fields["process_in_use_bytes"] = parse_size(this["used"])
            others = {
                int(m["pid"]): parse_size(m["used"]) for m in _OOM_OTHER_PROCESS.finditer(line)
            }
            if others:
                fields["processes_in_use_bytes"] = others
            split = _OOM_SPLIT.search(line)
            if split:
                allocated = parse_size(split["allocated"])
                unallocated = parse_size(split["unallocated"])
                fields["allocated_bytes"] = allocated
                fields["reserved_bytes"] = allocated + unallocated
                fields["reserved_unallocated_bytes"] = unallocated
            return fields
        old = _OOM_OLD.search(line)
        if old:
            allocated = parse_size(old["allocated"])
            reserved = parse_size(old["reserved"])
            return {
                "format": "pytorch<2.1",
                "gpu": int(old["gpu"]),
                "tried_bytes": parse_size(old["tried"]),
                "total_bytes": parse_size(old["total"]),
                "free_bytes": parse_size(old["free"]),
                "allocated_bytes": allocated,
                "reserved_bytes": reserved,
                "reserved_unallocated_bytes": max(reserved - allocated, 0),
            }
        if _CUDA_ERROR_OOM.search(line):
            return {"format": "cuda_error"}
        return None

    @staticmethod
    def _finding(fields: dict[str, Any], where: Location) -> Finding:
        where_text = f"GPU {fields['gpu']}" if "gpu" in fields else "a GPU"
        if "rank" in fields:
            where_text += f" (rank {fields['rank']})"
        if fields["format"] == "cuda_error":
            fields["verdict"] = "outside_allocator"
            return Finding(
                Failure.OOM,
                f"CUDA error: out of memory on {where_text}",
                where,
                "A CUDA call outside PyTorch's caching allocator (context creation, NCCL "
                "buffers, cuBLAS workspace, another library) found the GPU full. Check for "
                "other processes on the GPU (nvidia-smi) and leave headroom: lower the "
                "micro-batch or set torch.cuda.set_per_process_memory_fraction.",
                fields,
            )
        tried = fields["tried_bytes"]
        unallocated = fields.get("reserved_unallocated_bytes")
        reserved = fields.get("reserved_bytes")
        advice: list[str] = []
        if unallocated is not None and reserved:
            share = unallocated / reserved
            fields["fragmentation_ratio"] = round(share, 4)
            fragmented = unallocated >= tried or share >= FRAGMENTATION_SHARE
        else:
            fragmented = False
        if fragmented:
            fields["verdict"] = "fragmentation"
            advice.append(
                f"Fragmentation: {_gib(unallocated or 0)} is reserved by PyTorch but unallocated "
                f"({fields['fragmentation_ratio']:.0%} of reserved) while the request was "
                f"{_gib(tried)}. Set PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True (older "
                "PyTorch: max_split_size_mb) and avoid tensors whose shapes change every step."
            )
        else:
            fields["verdict"] = "does_not_fit"
            advice.append(
                "The step needs more memory than the GPU has: lower the micro-batch and keep the "
                "global batch with gradient accumulation, enable activation checkpointing, use "
                "bf16/fp16, or shard parameters and optimizer state (FSDP/ZeRO)."
            )
        in_use = fields.get("process_in_use_bytes")
        if in_use is not None and reserved is not None:
            non_pytorch = in_use - reserved
            fields["non_pytorch_bytes"] = max(non_pytorch, 0)
            if non_pytorch >= _NON_PYTORCH_SIGNIFICANT:
                advice.append(
                    f"{_gib(non_pytorch)} of this process's GPU memory is not PyTorch's "
                    "(CUDA context, NCCL buffers, other libraries)."
                )
        others = fields.get("processes_in_use_bytes")
        if others and len(others) > 1:
            advice.append(
                f"{len(others)} processes share GPU {fields['gpu']}: make sure each rank uses "
                "its own device (torch.cuda.set_device(local_rank))."
            )
        return Finding(
            Failure.OOM,
            f"CUDA out of memory on {where_text}: tried to allocate {_gib(tried)} with "
            f"{_gib(fields['free_bytes'])} free of {_gib(fields['total_bytes'])}",
            where,
            " ".join(advice),
            fields,
        )

    def findings(self) -> list[Finding]:
        return list(self._groups.values())


# --- NCCL watchdog timeouts -----------------------------------------------------------------
_WORK = re.compile(r"WorkNCCL\((?P<body>(?:[^()]|\([^()]*\))*)\) ran for (?P<ran>\d+) milli")
_WORK_FIELD = re.compile(r"(\w+(?:\(ms\))?)=([^,]+)")
_PG = re.compile(r"\[PG ID (?P<id>\d+) PG GUID (?P<guid>[^\s\]]+)")
_LAST_WORK = re.compile(
    r"[Ll]ast enqueued NCCL work: (?P<enq>-?\d+), last completed NCCL work: (?P<done>-?\d+)"
)
_FR_WRITTEN = ("Finished flight recorder successfully", "Flight Recorder trace successfully")
_FR_STARTED = ("preparing to dump debug info", "dump the debug info", "Received a dump signal")


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


class NcclTimeoutDetector:
    """``Watchdog caught collective operation timeout: WorkNCCL(...)`` and what follows it."""

    # The watchdog's log lines, its "last enqueued NCCL work" summaries and the Flight Recorder
    # dump messages are all logged from ProcessGroupNCCL.cpp; WorkNCCL( also catches the
    # exception text re-printed by Python or by std::terminate. Few needles keep the scan fast.
    failure: ClassVar[Failure] = Failure.NCCL_TIMEOUT
    keywords: tuple[str, ...] = ("ProcessGroupNCCL", "WorkNCCL(")

    def __init__(self) -> None:
        self.dropped = 0
        self._groups: dict[tuple[int, str, str], _TimeoutGroup] = {}
        self._last_enqueued: dict[int, int] = {}
        self._last_completed: dict[int, int] = {}
        self._fr_written: set[int | None] = set()
        self._fr_started: set[int | None] = set()

    def feed(self, line: str, where: Location, source: Source) -> bool:
        rank = rank_of(line, source)
        if any(marker in line for marker in _FR_WRITTEN):
            self._fr_written.add(rank)
        if any(marker in line for marker in _FR_STARTED):
            self._fr_started.add(rank)
        last = _LAST_WORK.search(line)
        if last and rank is not None:
            self._last_enqueued[rank] = int(last["enq"])
            self._last_completed[rank] = int(last["done"])
        work = _WORK.search(line)
        if not work:
            return False
        values = dict(_WORK_FIELD.findall(work["body"]))
        seq = values.get("SeqNum", "")
        op = values.get("OpType", "unknown")
        if not seq.isdigit():
            return False
        # Older PyTorch does not name the process group, so reports are grouped by what every
        # version prints: the sequence number, the op and its sizes.
        key = (int(seq), op, values.get("NumelIn", ""))
        group = _bounded_get(
            self._groups,
            key,
            lambda: _TimeoutGroup(self._fields(values, op, int(seq)), where),
            self,
        )
        if group is None:
            return False
        group.count += 1
        group.elapsed_ms = max(group.elapsed_ms, int(work["ran"]))
        pg = _PG.search(line)
        if pg:
            _add_listed(group.process_groups, pg["guid"])
        if rank is not None:
            _add_listed(group.ranks, rank)
        stamp = timestamp_of(line)
        # Without timestamps the first report in reading order stands in for the first in time.
        earlier = group.first is None or (stamp is not None and stamp < group.first[0])
        if earlier and rank is not None:
            group.first = (stamp or "", rank)
            group.first_where = where
        return False

    @staticmethod
    def _fields(values: dict[str, str], op: str, seq: int) -> dict[str, Any]:
        fields: dict[str, Any] = {"seq_num": seq, "op_type": op}
        for key, name in (("NumelIn", "numel_in"), ("NumelOut", "numel_out")):
            if values.get(key, "").strip().lstrip("-").isdigit():
                fields[name] = int(values[key])
        timeout = values.get("Timeout(ms)", "").strip()
        if timeout.isdigit():
            fields["timeout_ms"] = int(timeout)
        return fields

    def findings(self) -> list[Finding]:
        out = []
        for group in self._groups.values():
            fields = dict(group.fields)
            fields["elapsed_ms"] = group.elapsed_ms
            fields["process_groups"] = sorted(group.process_groups)
            fields["ranks"] = sorted(group.ranks)
            fields["reports"] = group.count
            first_rank = group.first[1] if group.first else None
            fields["first_rank"] = first_rank
            if group.first and group.first[0]:
                fields["first_time"] = group.first[0]
            fields["flight_recorder"] = self._flight_recorder(group.ranks)
            laggards = self._laggards(group.fields["seq_num"])
            if laggards:
                fields["laggard_ranks"] = laggards
            advice = [
                f"{fields['op_type']} #{fields['seq_num']} did not complete on "
                f"{len(group.ranks) or 'some'} rank(s) within "
                f"{fields.get('timeout_ms', '?')} ms."
            ]
            if laggards:
                advice.append(
                    f"Rank(s) {', '.join(map(str, laggards))} enqueued fewer collectives than "
                    "the others: they never joined this one. Look at what they were doing (a "
                    "data loader stall, checkpoint I/O, an exception, a dead GPU)."
                )
            else:
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
            out.append(
                Finding(
                    Failure.NCCL_TIMEOUT,
                    f"NCCL {fields['op_type']} (SeqNum={fields['seq_num']}) timed out on ranks "
                    f"{fields['ranks']}; first to time out: rank {first_rank}",
                    group.first_where or group.first_seen,
                    " ".join(advice),
                    fields,
                    group.count,
                )
            )
        return out

    def _flight_recorder(self, ranks: set[int]) -> str:
        if self._fr_written & (ranks | {None}):
            return "written"
        if self._fr_started & (ranks | {None}):
            return "dump_started"
        return "not_seen"

    def _laggards(self, seq: int) -> list[int]:
        if len(self._last_enqueued) < 2:
            return []
        highest = max(self._last_enqueued.values())
        return sorted(r for r, enq in self._last_enqueued.items() if enq < highest and enq < seq)


# --- NCCL errors ----------------------------------------------------------------------------
_NCCL_PREFIX = re.compile(r"(?P<host>[\w.-]+):(?P<pid>\d+):(?P<tid>\d+) \[(?P<dev>\d+)\]")
_NCCL_VERSION = re.compile(r"NCCL version (\d+\.\d+\.\d+)")
_IB_STATUS = re.compile(r"with (?:error |status=)(?P<status>\d+)")
_IB_PEER = re.compile(r"from peer (?P<peer>[\w.:-]+(?:<\d+>)?)")
# ibv_wc_status values NCCL reports as "error N".
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


class NcclErrorDetector:
    """NCCL WARN lines and the errors torch raises from them, by kind, per input file.

    The kind is ``trainguard.nccl_errors.classify``'s, the exporter's ``kind`` label too.
    """

    failure: ClassVar[Failure] = Failure.NCCL_ERROR

    # torch's own error lines all say "NCCL error"; the ncclXxxError lines that follow them
    # repeat the same failure, so they need no keyword of their own.
    keywords: tuple[str, ...] = ("NCCL WARN", "NCCL error")

    def __init__(self) -> None:
        self.dropped = 0
        self._groups: dict[tuple[str, NcclErrorKind], _ErrorGroup] = {}
        self._versions: set[str] = set()

    def feed(self, line: str, where: Location, source: Source) -> bool:
        version = _NCCL_VERSION.search(line)
        if version:
            _add_listed(self._versions, version.group(1))
        prefix = _NCCL_PREFIX.search(line)
        # The message after NCCL's host:pid:tid [dev] prefix, as the exporter classifies it.
        kind = nccl_errors.classify(line[prefix.end() :] if prefix else line)
        group = _bounded_get(
            self._groups,
            (source.name, kind),
            lambda: _ErrorGroup(kind, where, _trim(line)),
            self,
        )
        if group is None:
            return False
        group.count += 1
        if prefix:
            _add_listed(group.hosts, prefix["host"])
        rank = rank_of(line, source)
        if rank is not None:
            _add_listed(group.ranks, rank)
        if kind is NcclErrorKind.IB and "ib_status" not in group.extra:
            status = _IB_STATUS.search(line)
            if status:
                code = int(status["status"])
                group.extra["ib_status"] = code
                group.extra["ib_status_text"] = _IB_STATUS_TEXT.get(code, "see ibv_wc_status")
            peer = _IB_PEER.search(line)
            if peer:
                group.extra["peer"] = peer["peer"]
        return False

    def findings(self) -> list[Finding]:
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
            advice = nccl_errors.ADVICE[group.kind]
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


# --- NVIDIA Xid -----------------------------------------------------------------------------
_XID = re.compile(r"NVRM: Xid \((?:PCI:)?(?P<pci>[0-9A-Fa-f:.]+)\): (?P<code>\d+),\s*(?P<rest>.*)")
_XID_PID = re.compile(r"pid=(?P<pid>\d+)")
_XID_NAME = re.compile(r"name=(?P<name>[^,\s]+)")
_SYSLOG_HOST = re.compile(r"(?P<host>[\w.-]+) kernel:")
_XID_154_ACTION = re.compile(r"to 0x[0-9a-fA-F]+ \((?P<action>[^)]+)\)")


@dataclass
class _XidGroup:
    finding: Finding
    pids: set[int] = field(default_factory=set)


class XidDetector:
    """``NVRM: Xid (PCI:...): N, ...`` kernel lines (dmesg, journalctl, syslog)."""

    failure: ClassVar[Failure] = Failure.GPU_FAULT
    keywords: tuple[str, ...] = ("NVRM: Xid",)

    def __init__(self, critical: Iterable[int] | None = None) -> None:
        """``critical``: the Xids that drain the node (default: thresholds' ``xid_critical``)."""
        self.dropped = 0
        self.critical = frozenset(xid.critical_xids() if critical is None else critical)
        self._groups: dict[tuple[str | None, str, int], _XidGroup] = {}

    def feed(self, line: str, where: Location, source: Source) -> bool:
        match = _XID.search(line)
        if not match:
            return False
        code = int(match["code"])
        pci = match["pci"]
        host_match = _SYSLOG_HOST.search(line)
        host = host_match["host"] if host_match else None
        existing = self._groups.get((host, pci, code))
        if existing is None:
            existing = _bounded_get(
                self._groups,
                (host, pci, code),
                lambda: _XidGroup(self._finding(code, pci, host, match["rest"], where)),
                self,
            )
            if existing is None:
                return False
        else:
            existing.finding.count += 1
        pid = _XID_PID.search(match["rest"])
        if pid:
            _add_listed(existing.pids, int(pid["pid"]))
        return False

    def _finding(
        self, code: int, pci: str, host: str | None, rest: str, where: Location
    ) -> Finding:
        info = xid.lookup(code, self.critical)
        fields: dict[str, Any] = {
            "xid": code,
            "pci": pci,
            "meaning": info.meaning,
            "drain": info.drain,
            "message": _trim(rest),
        }
        if host:
            fields["host"] = host
        name = _XID_NAME.search(rest)
        if name:
            fields["process_name"] = name["name"]
        if code == xid.RECOVERY_ACTION_XID and code not in self.critical:
            action = _XID_154_ACTION.search(rest)
            if action:
                fields["recovery_action"] = action["action"]
            fields["drain"] = xid.recovery_drain(action["action"] if action else "")
        on = f" on {host}" if host else ""
        return Finding(
            Failure.GPU_FAULT,
            f"Xid {code} ({info.meaning}) on GPU PCI:{pci}{on}; drain: {fields['drain']}",
            where,
            info.advice,
            fields,
        )

    def findings(self) -> list[Finding]:
        out = []
        for group in self._groups.values():
            if group.pids:
                group.finding.fields["pids"] = sorted(group.pids)
            out.append(group.finding)
        return out


# --- torchrun elastic -----------------------------------------------------------------------
_BLOCK_START = re.compile(r"ChildFailedError:\s*$")
_ENTRY = re.compile(r"^\s*\[(\d+)\]:\s*$")
_FIELD = re.compile(r"^\s+(time|host|rank|exitcode|error_file|traceback)\s*:\s?(.*)$")
_RANK_FIELD = re.compile(r"(-?\d+)(?: \(local_rank: (\d+)\))?")
_EXIT_FIELD = re.compile(r"(-?\d+)(?: \(pid: (\d+)\))?")
_FAILED_SCRIPT = re.compile(r"^(\S.*) FAILED\s*$")
_RESTART = re.compile(r"Worker group FAILED\. (?P<left>\d+)/(?P<max>\d+) attempts left")
_AGENT_FAILED = re.compile(
    r"failed \(exitcode: (?P<code>-?\d+)\) local_rank: (?P<local>\d+) \(pid: (?P<pid>\d+)\)"
)
_MAX_BLOCK_LINES = 400


def _signal_name(exitcode: int) -> str | None:
    if exitcode >= 0:
        return None
    try:
        return signal.Signals(-exitcode).name
    except ValueError:
        return f"signal {-exitcode}"


def _elastic_advice(root: dict[str, Any]) -> str:
    sig = root.get("signal")
    error = root.get("error", "")
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
class _Block:
    start: Location
    source: Source
    script: str | None = None
    section: str | None = None
    entries: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    rules: int = 0
    lines: int = 0
    last_field: str | None = None


class ElasticFailureDetector:
    """torchrun's ChildFailedError summary (root-cause rank, exit code or signal), restarts."""

    # torchrun's agent logs under torch.distributed.elastic (torch/distributed/elastic/ in the
    # glog format), and the ChildFailedError's qualified name contains it too.
    failure: ClassVar[Failure] = Failure.RANK_FAILURE
    keywords: tuple[str, ...] = ("elastic",)

    def __init__(self) -> None:
        self.dropped = 0
        self._block: _Block | None = None
        self._findings: list[Finding] = []
        self._restarts: dict[str, int] = {}
        self._max_restarts: dict[str, int] = {}
        self._agent_failures: dict[str, tuple[Location, dict[str, Any]]] = {}
        self._files_with_summary: set[str] = set()

    def feed(self, line: str, where: Location, source: Source) -> bool:
        if self._block is not None:
            if self._block.source is source:
                return self._block_line(line)
            self._finish_block()  # a summary cut off by the end of its file still counts
        restart = _RESTART.search(line)
        if restart:
            self._restarts[source.name] = self._restarts.get(source.name, 0) + 1
            self._max_restarts[source.name] = int(restart["max"])
            return False
        failed = _AGENT_FAILED.search(line)
        if failed:
            if source.name not in self._agent_failures:
                code = int(failed["code"])
                self._agent_failures[source.name] = (
                    where,
                    {
                        "local_rank": int(failed["local"]),
                        "exitcode": code,
                        "pid": int(failed["pid"]),
                        "signal": _signal_name(code),
                    },
                )
            return False
        if _BLOCK_START.search(line):
            self._block = _Block(where, source)
            return True
        return False

    def _block_line(self, line: str) -> bool:
        block = self._block
        assert block is not None
        block.lines += 1
        stripped = line.strip()
        if stripped.startswith("=====") or block.lines > _MAX_BLOCK_LINES:
            block.rules += 1
            if block.rules >= 2 or block.lines > _MAX_BLOCK_LINES:
                self._finish_block()
                return False
            return True
        if stripped.startswith("-----"):
            block.last_field = None
            return True
        if stripped == "Failures:":
            block.section = "failure"
            return True
        if stripped.startswith("Root Cause"):
            block.section = "root"
            return True
        script = _FAILED_SCRIPT.match(stripped)
        if script and block.script is None and block.section is None:
            block.script = script.group(1)
            return True
        if _ENTRY.match(line) and block.section is not None:
            block.entries.append((block.section, {}))
            block.last_field = None
            return True
        found = _FIELD.match(line)
        if found and block.entries:
            name, value = found.group(1), found.group(2).strip()
            self._set_field(block.entries[-1][1], name, value)
            block.last_field = name
            return True
        if block.last_field == "traceback" and block.entries and stripped:
            block.entries[-1][1]["error"] = _trim(stripped)
        return True

    @staticmethod
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
        elif name == "traceback":
            if value and value != "<N/A>" and not value.startswith("Traceback"):
                entry["error"] = _trim(value)
        elif value and value != "<N/A>":
            entry[name] = value

    def _finish_block(self) -> None:
        block = self._block
        self._block = None
        assert block is not None
        source = block.source
        roots = [entry for section, entry in block.entries if section == "root"]
        others = [entry for section, entry in block.entries if section == "failure"]
        if not roots:
            return
        root = roots[0]
        fields: dict[str, Any] = {
            "script": block.script,
            "root_cause": root,
            "other_failures": len(others),
            "other_failed_ranks": sorted({e["rank"] for e in others if "rank" in e})[:MAX_LISTED],
            "restarts": self._restarts.get(source.name, 0),
        }
        if source.name in self._max_restarts:
            fields["max_restarts"] = self._max_restarts[source.name]
        how = (
            f"signal {root['signal']}"
            if root.get("signal")
            else f"exit code {root.get('exitcode', '?')}"
        )
        self._files_with_summary.add(source.name)
        if len(self._findings) >= MAX_GROUPS:
            self.dropped += 1
            return
        self._findings.append(
            Finding(
                Failure.RANK_FAILURE,
                f"torchrun: {block.script or 'the job'} failed; root cause rank "
                f"{root.get('rank', '?')} on {root.get('host', '?')} ({how})",
                block.start,
                _elastic_advice(root),
                fields,
            )
        )

    def findings(self) -> list[Finding]:
        if self._block is not None:
            self._finish_block()
        out = list(self._findings)
        for name, (where, failure) in self._agent_failures.items():
            if name in self._files_with_summary:
                continue
            how = (
                f"signal {failure['signal']}"
                if failure["signal"]
                else f"exit code {failure['exitcode']}"
            )
            fields = {"root_cause": failure, "restarts": self._restarts.get(name, 0)}
            out.append(
                Finding(
                    Failure.RANK_FAILURE,
                    f"torchrun: local rank {failure['local_rank']} failed ({how}); no "
                    "ChildFailedError summary in this file",
                    where,
                    _elastic_advice(failure),
                    fields,
                )
            )
        return out


# --- stragglers -----------------------------------------------------------------------------
_TIMING = re.compile(
    r"(?P<key>step_time|iter_time|compute_time|batch_time|time per iteration)"
    r"\s*(?P<ms>\(ms\))?\s*[=:]\s*(?P<value>\d+(?:\.\d+)?)\s*(?P<unit>ms|s)?\b"
)
_SAMPLES_PER_RANK = 1000
MIN_SAMPLES = 5


class StragglerDetector:
    """Per-rank step/compute timings; a rank whose median is well above its peers' is slow.

    Each timing name (step_time, compute_time, ...) is compared separately so that a log that
    prints several never mixes them. A rank is a straggler when its median is at least
    ``factor`` times the median of its peers' medians, with at least ``min_ranks`` ranks
    compared: thresholds.yml's ``straggler_factor`` and ``straggler_min_ranks`` by default, the
    values the TrainingStraggler alert and ``diagnose`` judge by.
    """

    failure: ClassVar[Failure] = Failure.STRAGGLER
    # "_time" covers step_time, iter_time, compute_time and batch_time in one pass.
    keywords: tuple[str, ...] = ("_time", "time per iteration")

    def __init__(self, factor: float | None = None, min_ranks: int | None = None) -> None:
        if factor is None or min_ranks is None:
            defaults = load_default()
            factor = defaults.straggler_factor if factor is None else factor
            min_ranks = defaults.straggler_min_ranks if min_ranks is None else min_ranks
        self.dropped = 0
        self.factor = factor
        self.min_ranks = max(min_ranks, 2)  # a rank needs at least one peer to compare with
        self._samples: dict[tuple[str, int], deque[float]] = {}
        self._first: dict[tuple[str, int], Location] = {}

    def feed(self, line: str, where: Location, source: Source) -> bool:
        match = _TIMING.search(line)
        if not match:
            return False
        rank = rank_of(line, source)
        if rank is None:
            return False
        seconds = float(match["value"])
        if match["ms"] or match["unit"] == "ms":
            seconds /= 1000.0
        key = (match["key"].replace(" ", "_"), rank)
        samples = _bounded_get(self._samples, key, lambda: deque(maxlen=_SAMPLES_PER_RANK), self)
        if samples is None:
            return False
        samples.append(seconds)
        self._first.setdefault(key, where)
        return False

    def findings(self) -> list[Finding]:
        by_metric: dict[str, dict[int, float]] = {}
        for (metric, rank), samples in self._samples.items():
            if len(samples) >= MIN_SAMPLES:
                by_metric.setdefault(metric, {})[rank] = statistics.median(samples)
        out = []
        for metric, medians in sorted(by_metric.items()):
            if len(medians) < self.min_ranks:
                continue
            for rank, median in sorted(medians.items()):
                peers = statistics.median(m for r, m in medians.items() if r != rank)
                if peers <= 0 or median < peers * self.factor:
                    continue
                out.append(self._finding(metric, rank, median, peers, len(medians)))
        return out

    def _finding(
        self, metric: str, rank: int, median: float, peers: float, compared: int
    ) -> Finding:
        ratio = median / peers
        samples = len(self._samples[(metric, rank)])
        fields = {
            "rank": rank,
            "metric": metric,
            "median_seconds": round(median, 6),
            "peer_median_seconds": round(peers, 6),
            "slowdown": round(ratio, 3),
            "samples": samples,
            "ranks_compared": compared,
        }
        return Finding(
            Failure.STRAGGLER,
            f"rank {rank} is {ratio:.2f}x slower than its peers ({metric} median "
            f"{median:.3f}s vs {peers:.3f}s)",
            self._first[(metric, rank)],
            "Check that rank's node for GPU clock throttling (thermal/power), a slower "
            "PCIe/NVLink path, CPU contention in its data loader, or a shared GPU. If the node "
            "is at fault, exclude it and let torchrun elastic re-rendezvous; if it is "
            "data-bound, raise DataLoader num_workers. In synchronous training only local "
            "(compute) times differ between ranks; whole-step times are equal.",
            fields,
            samples,
        )


def default_detectors(
    thresholds: Thresholds | None = None, *, straggler_factor: float | None = None
) -> list[Detector]:
    """One of each detector, judging by ``thresholds`` (default: the packaged thresholds.yml);
    ``straggler_factor`` overrides its ``straggler_factor``."""
    t = thresholds if thresholds is not None else load_default()
    return [
        CudaOomDetector(),
        NcclTimeoutDetector(),
        NcclErrorDetector(),
        XidDetector(t.xid_critical),
        ElasticFailureDetector(),
        StragglerDetector(
            t.straggler_factor if straggler_factor is None else straggler_factor,
            t.straggler_min_ranks,
        ),
    ]


# The order findings are reported in: the detectors' order above.
DETECTORS: tuple[type[Detector], ...] = (
    CudaOomDetector,
    NcclTimeoutDetector,
    NcclErrorDetector,
    XidDetector,
    ElasticFailureDetector,
    StragglerDetector,
)
