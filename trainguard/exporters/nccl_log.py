"""Reading NCCL debug logs (``NCCL_DEBUG=INFO`` written to ``NCCL_DEBUG_FILE``).

Three layers, each testable alone:

* :func:`parse_line` turns one line into a typed record, or ``None`` for the many lines that say
  nothing we export. It is a pure function on bytes, so binary garbage can only fail to match.
* :class:`NcclLogState` folds records into what the collector exports: per communicator its
  NCCL version, transports, network interface, ranks, channels and tree channels, and warning
  counts by kind (``contract.NcclErrorKind``, from ``trainguard.nccl_grammar.classify``, the
  classifier ``trainguard triage`` uses too).
* :class:`LogFollower` follows files matching globs like ``tail -F``: it reopens a file that was
  rotated (new inode) after draining the old one, starts over when a file is truncated, keeps a
  partial last line until its newline arrives and drops lines longer than a limit (counted).

NCCL lines look like ``host:pid:tid [cudaDev] NCCL INFO message``; their grammar (the prefix,
the version line, the kind of a warning) is ``trainguard.nccl_grammar``'s, shared with
``trainguard triage``.
"""

from __future__ import annotations

import glob
import os
import re
import stat
import threading
from collections import Counter, OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trainguard.contract import NcclErrorKind
from trainguard.nccl_grammar import PREFIX_BYTES, VERSION_BYTES, warning_kind

_NET_USING = re.compile(rb"^NET/([^\s:]+) ?: Using (.*)$")
_NET_DEVICE = re.compile(rb"\[\d+\]([^\s;]+)")
_USING_NETWORK = re.compile(rb"^Using network (.+?)\s*$")
_COMM = re.compile(
    rb"comm (0x[0-9a-fA-F]+) rank (\d+) nranks (\d+)(?:.*?commId (0x[0-9a-fA-F]+))?"
    rb".* - Init (START|COMPLETE)"
)
_CHANNEL_VIA = re.compile(rb"^Channel \d+(?:/\d+)? : .* via (\S+)")
_CHANNEL_RING = re.compile(rb"^Channel \d+/(\d+) :(?:\s+\d+)+\s*$")
_COLL_CHANNELS = re.compile(rb"^(\d+) coll channels")
_TREE_ENTRY = re.compile(rb"\[\d+\] ")
_INFO_STARTS = (
    b"NCCL version",
    b"NET/",
    b"Using network",
    b"comm 0x",
    b"ncclCommInit",
    b"Channel ",
    b"Trees",
)

# Every line parse_line can return a record for contains one of these; scanning a whole chunk
# for them in C and parsing only the lines they hit is what makes following fast, since most
# lines of a busy log (per-collective lines, proxy chatter) say nothing exported.
# The pattern starts with a literal so the regex engine can skip ahead to each "NCCL ".
_CANDIDATE = re.compile(
    rb"NCCL (?:WARN|version|INFO (?:NCCL version|NET/|Using network|comm 0x|ncclCommInit"
    rb"|Channel |Trees|\d+ coll channels))"
)


@dataclass(frozen=True)
class Version:
    pid: int
    version: str


@dataclass(frozen=True)
class NetDevices:
    """``NET/IB : Using [0]mlx5_0:1/IB ...`` or ``NET/Socket : Using [0]eth0:10.0.0.1<0>``."""

    pid: int
    interface: str


@dataclass(frozen=True)
class UsingNetwork:
    pid: int
    network: str


@dataclass(frozen=True)
class CommInit:
    pid: int
    tid: int
    comm: str
    rank: int
    nranks: int
    comm_id: str
    complete: bool


@dataclass(frozen=True)
class Connection:
    pid: int
    tid: int
    transport: str


@dataclass(frozen=True)
class Channels:
    pid: int
    tid: int
    count: int


@dataclass(frozen=True)
class Trees:
    pid: int
    tid: int
    count: int


@dataclass(frozen=True)
class NcclWarning:
    pid: int
    kind: NcclErrorKind


Record = (
    Version | NetDevices | UsingNetwork | CommInit | Connection | Channels | Trees | NcclWarning
)


def classify_warning(source: bytes | None, message: bytes) -> NcclErrorKind:
    """The kind of a WARN line from its source file and message (latin-1 decodes any bytes,
    and every pattern is ASCII, so undecodable garbage can only fail to match)."""
    return warning_kind(source.decode("latin-1") if source else None, message.decode("latin-1"))


def transport_of(via: bytes) -> str:
    """``P2P/IPC/read`` -> ``P2P``; ``NET/IB/0/GDRDMA`` -> ``NET/IB``; ``SHM/direct`` -> ``SHM``."""
    parts = via.decode(errors="replace").split("/")
    if parts[0] == "NET" and len(parts) > 1:
        return "NET/" + parts[1]
    return parts[0]


def _interface(devices: bytes) -> str:
    names = []
    for device in _NET_DEVICE.findall(devices.split(b";")[0]):
        name = device.split(b"/")[0] if b"/" in device else device.split(b":")[0]
        names.append(name.decode(errors="replace"))
    return ",".join(names)


def parse_line(line: bytes) -> Record | None:
    """One NCCL debug line as a record, or ``None`` when it says nothing exported."""
    prefix = PREFIX_BYTES.search(line)
    if prefix is None:
        bare = VERSION_BYTES.search(line)
        return Version(0, bare["version"].decode()) if bare else None
    pid, tid = int(prefix["pid"]), int(prefix["tid"])
    message = line[prefix.end() :].rstrip(b"\r")
    if prefix["level"] == b"WARN":
        return NcclWarning(pid, classify_warning(prefix["source"], message))
    if not (message.startswith(_INFO_STARTS) or message[:1].isdigit()):
        return None
    return _parse_info(pid, tid, message)


def _parse_info(pid: int, tid: int, message: bytes) -> Record | None:
    if message.startswith(b"Channel "):
        via = _CHANNEL_VIA.match(message)
        if via:
            return Connection(pid, tid, transport_of(via.group(1)))
        ring = _CHANNEL_RING.match(message)
        return Channels(pid, tid, int(ring.group(1))) if ring else None
    if message.startswith(b"Trees"):
        return Trees(pid, tid, len(_TREE_ENTRY.findall(message)))
    if match := _COMM.search(message):
        comm_id = match.group(4)
        return CommInit(
            pid,
            tid,
            comm=match.group(1).decode(),
            rank=int(match.group(2)),
            nranks=int(match.group(3)),
            comm_id=comm_id.decode() if comm_id else "",
            complete=match.group(5) == b"COMPLETE",
        )
    if match := VERSION_BYTES.match(message):
        return Version(pid, match["version"].decode())
    if match := _NET_USING.match(message):
        return NetDevices(pid, _interface(match.group(2)))
    if match := _USING_NETWORK.match(message):
        return UsingNetwork(pid, match.group(1).decode(errors="replace"))
    if match := _COLL_CHANNELS.match(message):
        return Channels(pid, tid, int(match.group(1)))
    return None


@dataclass
class Communicator:
    """One communicator of one rank, as exported in ``trainguard_nccl_info``."""

    comm_id: str
    rank: int
    nranks: int
    version: str = ""
    interface: str = ""
    network: str = ""
    transports: set[str] = field(default_factory=set)
    channels: int = 0
    trees: int = 0

    @property
    def transport(self) -> str:
        return ",".join(sorted(self.transports))


def _bound(table: dict[Any, Any], limit: int) -> None:
    """Forget the oldest entries (dicts keep insertion order) beyond ``limit``."""
    while len(table) > limit:
        del table[next(iter(table))]


@dataclass
class _Pending:
    transports: set[str] = field(default_factory=set)
    channels: int = 0
    trees: int = 0


@dataclass
class _Process:
    version: str = ""
    interface: str = ""
    network: str = ""
    last_comm: Communicator | None = None


class NcclLogState:
    """What the logs said so far; ``feed`` is called by the follower, ``snapshot`` by scrapes."""

    def __init__(self, max_communicators: int = 512, max_processes: int = 4096) -> None:
        self._lock = threading.Lock()
        self._max_communicators = max_communicators
        # Months of logs hold many processes and threads; only the latest are kept.
        self._max_processes = max_processes
        self._processes: dict[tuple[str, int], _Process] = {}
        self._pending: dict[tuple[str, int, int], _Pending] = {}
        self._communicators: OrderedDict[tuple[str, int], Communicator] = OrderedDict()
        self.errors: Counter[NcclErrorKind] = Counter()

    def forget_source(self, source: str) -> None:
        """A file started over (truncated or replaced): its half-seen inits are void."""
        with self._lock:
            for key in [k for k in self._pending if k[0] == source]:
                del self._pending[key]

    def feed(self, source: str, lines: Iterable[bytes]) -> None:
        self._apply_all(source, [r for r in map(parse_line, lines) if r is not None])

    def feed_block(self, source: str, block: bytes) -> None:
        """Whole lines separated by ``\\n``; the same as ``feed(source, block.split(b"\\n"))``."""
        records: list[Record] = []
        last_start = -1
        for match in _CANDIDATE.finditer(block):
            start = block.rfind(b"\n", 0, match.start()) + 1
            if start == last_start:
                continue
            last_start = start
            end = block.find(b"\n", match.end())
            record = parse_line(block[start : end if end >= 0 else len(block)])
            if record is not None:
                records.append(record)
        self._apply_all(source, records)

    def _apply_all(self, source: str, records: list[Record]) -> None:
        if not records:
            return
        with self._lock:
            for record in records:
                self._apply(source, record)

    def _apply(self, source: str, record: Record) -> None:
        process = self._processes.get((source, record.pid))
        if process is None:
            process = self._processes[(source, record.pid)] = _Process()
            _bound(self._processes, self._max_processes)
        if isinstance(record, NcclWarning):
            self.errors[record.kind] += 1
        elif isinstance(record, Version):
            process.version = record.version
        elif isinstance(record, NetDevices):
            process.interface = record.interface
        elif isinstance(record, UsingNetwork):
            process.network = record.network
        elif isinstance(record, CommInit):
            self._comm_init(source, process, record)
        else:
            key = (source, record.pid, record.tid)
            pending = self._pending.get(key)
            if pending is None and process.last_comm is not None:
                # Connections made after init (NCCL's lazy/runtime connect) belong to the
                # communicator this process finished initialising last.
                if isinstance(record, Connection):
                    process.last_comm.transports.add(record.transport)
                return
            pending = self._pending.setdefault(key, _Pending())
            _bound(self._pending, self._max_processes)
            if isinstance(record, Connection):
                pending.transports.add(record.transport)
            elif isinstance(record, Channels):
                pending.channels = max(pending.channels, record.count)
            elif isinstance(record, Trees):
                pending.trees = max(pending.trees, record.count)

    def _comm_init(self, source: str, process: _Process, record: CommInit) -> None:
        key = (source, record.pid, record.tid)
        if not record.complete:
            self._pending[key] = _Pending()
            _bound(self._pending, self._max_processes)
            return
        pending = self._pending.pop(key, _Pending())
        bare = self._processes.get((source, 0))  # a version line printed without a prefix
        comm = Communicator(
            comm_id=record.comm_id or f"{record.pid}:{record.comm}",
            rank=record.rank,
            nranks=record.nranks,
            version=process.version or (bare.version if bare else ""),
            interface=process.interface,
            network=process.network,
            transports=set(pending.transports),
            channels=pending.channels,
            trees=pending.trees,
        )
        ident = (comm.comm_id, comm.rank)
        self._communicators.pop(ident, None)
        self._communicators[ident] = comm
        while len(self._communicators) > self._max_communicators:
            self._communicators.popitem(last=False)
        process.last_comm = comm

    def snapshot(self) -> tuple[list[Communicator], dict[NcclErrorKind, int]]:
        with self._lock:
            comms = [
                Communicator(
                    c.comm_id,
                    c.rank,
                    c.nranks,
                    c.version,
                    c.interface,
                    c.network,
                    set(c.transports),
                    c.channels,
                    c.trees,
                )
                for c in self._communicators.values()
            ]
            return comms, dict(self.errors)


@dataclass(frozen=True)
class NcclSnapshot:
    """Everything the nccl collector exports, as of one poll; picklable."""

    communicators: list[Communicator]
    errors: dict[NcclErrorKind, int]
    files: int
    bytes_read: int
    lines_dropped: int


@dataclass
class _Followed:
    fd: int
    dev: int
    ino: int
    offset: int = 0
    partial: bytes = b""
    discarding: bool = False


class LogFollower:
    """Follows every file matching ``globs`` from its start, like ``tail -F``."""

    def __init__(
        self,
        globs: Sequence[str],
        state: NcclLogState,
        max_line_bytes: int = 64 * 1024,
        chunk_bytes: int = 1024 * 1024,
        max_files: int = 1024,
    ) -> None:
        self.globs = list(globs)
        self.state = state
        self.max_line_bytes = max_line_bytes
        self.chunk_bytes = chunk_bytes
        self.max_files = max_files
        self._files: dict[str, _Followed] = {}
        self._lock = threading.Lock()
        self.bytes_read = 0
        self.lines_dropped = 0
        self._budget = 0.0

    @property
    def files(self) -> int:
        return len(self._files)

    def snapshot(self) -> NcclSnapshot:
        communicators, errors = self.state.snapshot()
        return NcclSnapshot(communicators, errors, self.files, self.bytes_read, self.lines_dropped)

    def poll(self, max_bytes: int | None = None) -> int:
        """Read what was appended since the last poll, at most about ``max_bytes`` of it (the
        rest at the next poll; a rotated file's old tail is always finished). Returns the
        bytes read."""
        with self._lock:
            self._budget = float("inf") if max_bytes is None else float(max_bytes)
            before = self.bytes_read
            # Path.glob takes no absolute patterns; the globs here are absolute paths.
            paths = sorted({p for g in self.globs for p in glob.glob(g)})  # noqa: PTH207
            for path in [p for p in self._files if p not in paths]:
                self._drain_and_close(path)  # deleted or moved away: finish it, wait for it
            for path in paths:
                self._poll_path(path)
            return self.bytes_read - before

    def close(self) -> None:
        with self._lock:
            for followed in self._files.values():
                os.close(followed.fd)
            self._files.clear()

    def _poll_path(self, path: str) -> None:
        try:
            st = Path(path).stat()
        except OSError:
            return
        followed = self._files.get(path)
        if followed is not None and (st.st_dev, st.st_ino) != (followed.dev, followed.ino):
            self._drain_and_close(path)  # rotated: the old file's tail first
            followed = None
        if followed is None:
            if len(self._files) >= self.max_files or not stat.S_ISREG(st.st_mode):
                return
            try:
                fd = os.open(path, os.O_RDONLY)
            except OSError:
                return
            st = os.fstat(fd)
            followed = _Followed(fd, st.st_dev, st.st_ino)
            self._files[path] = followed
            self.state.forget_source(path)
        elif st.st_size < followed.offset:
            followed.offset, followed.partial, followed.discarding = 0, b"", False
            self.state.forget_source(path)  # truncated in place: start over
        self._read(path, followed)

    def _drain_and_close(self, path: str) -> None:
        followed = self._files.pop(path)
        self._read(path, followed, drain=True)
        if followed.partial and not followed.discarding:
            self.state.feed(path, [followed.partial])
        os.close(followed.fd)

    def _read(self, path: str, followed: _Followed, drain: bool = False) -> None:
        while drain or self._budget > 0:
            chunk = os.pread(followed.fd, self.chunk_bytes, followed.offset)
            if not chunk:
                return
            followed.offset += len(chunk)
            self.bytes_read += len(chunk)
            self._budget -= len(chunk)
            self._split(path, followed, chunk)

    def _split(self, path: str, followed: _Followed, chunk: bytes) -> None:
        last_newline = chunk.rfind(b"\n")
        if last_newline < 0:
            followed.partial += chunk
        else:
            head = followed.partial + chunk[:last_newline]
            followed.partial = chunk[last_newline + 1 :]
            if followed.discarding:
                head = head[head.find(b"\n") + 1 :] if b"\n" in head else b""  # over-long tail
                followed.discarding = False
            self.state.feed_block(path, head)
        if len(followed.partial) > self.max_line_bytes:
            if not followed.discarding:
                self.lines_dropped += 1
            followed.partial, followed.discarding = b"", True
