"""The grammar of NCCL's log lines, one module for the exporter and for ``trainguard triage``.

NCCL prints every debug line as ``host:pid:tid [cudaDev] NCCL INFO|WARN message`` (``WARN``
lines of some releases carry ``file.cc:line`` before ``NCCL``), announces its version as
``NCCL version 2.x.y``, and torch re-raises its failures as ``NCCL error in: ...``. Three things
are read here, so that the exporter's ``trainguard_nccl_log_errors_total{kind}`` and triage's
``nccl_error`` findings agree on every line:

* :data:`PREFIX` / :data:`PREFIX_BYTES`: the line prefix (host, pid, tid, device, source file,
  level), searched anywhere in a line because pasted and collected logs put timestamps and
  ``[rank3]:`` in front of it;
* :data:`VERSION` / :data:`VERSION_BYTES`: the version announcement;
* :func:`classify`: the kind of an error line (``contract.NcclErrorKind``), and
  :func:`warning_kind` that of a ``WARN`` line from its parts after the prefix.

Standard library only: triage runs wherever the logs are.

The classifier's rules are tried in order and the first match wins, the most specific first:

1. NCCL's result codes, by their ``ncclResult_t`` name (``ncclRemoteError``) or by
   ``ncclGetErrorString``'s wording that torch prints (``unhandled system error``), plus the
   ``WARN`` texts NCCL returns one of them for (``Cuda failure``, ``Duplicate GPU detected``).
   A result code says what failed whatever else the line names (``ncclSystemError: System call
   (e.g. socket, malloc) ...`` is ``system``, not ``socket``).
2. The subsystem a ``WARN`` line comes from, by its text or its source file (``net_ib.cc``,
   ``socket.cc``, ``proxy.cc``): InfiniBand before sockets (an IB line may say "connection"),
   a socket's own error before timeouts (``Connection timed out`` is TCP's errno, not NCCL
   waiting for a peer), then timeouts, the proxy thread, and system calls or resources.
3. Any other mention of CUDA, last: "CUDA" also appears in lines about devices and versions.
"""

from __future__ import annotations

import re

from trainguard.contract import NcclErrorKind

# src/debug.cc, ncclDebugLogV (NVIDIA/nccl 0456df2): "%s:%d:%d " (host, pid, tid), then
# "[%d] NCCL INFO %s" or, for WARN, "[%d] %s:%d (%s) NCCL WARN %s" (device, file, line and
# function; older releases print "file:line" without the function, the oldest neither). WARN
# lines start with a timestamp by default (NCCL_DEBUG_TIMESTAMP_LEVELS=WARN, format "[%F %T] "),
# and collected logs add their own prefixes, so the prefix is searched, never anchored.
_PREFIX = (
    r"(?P<host>[^\s:\[\]]*):(?P<pid>\d+):(?P<tid>\d+) \[(?P<dev>-?\d*)\] "
    r"(?:(?P<source>\S+(?: \([^)]*\))?) )?NCCL (?P<level>INFO|WARN|ABORT|TRACE) ?"
)
PREFIX = re.compile(_PREFIX)
PREFIX_BYTES = re.compile(_PREFIX.encode())
# "NCCL version %s" (src/init.cc; newer releases follow the release with "+cuda12.x").
_VERSION = r"NCCL version (?P<version>\d+\.\d+\.\d+)"
VERSION = re.compile(_VERSION)
VERSION_BYTES = re.compile(_VERSION.encode())

_K = NcclErrorKind

RULES: tuple[tuple[NcclErrorKind, re.Pattern[str]], ...] = (
    # 1. result codes
    (_K.REMOTE, re.compile(r"ncclRemoteError|remote process exited|\bremote error")),
    (
        _K.CUDA,
        re.compile(r"ncclUnhandledCudaError|unhandled cuda error|\bcuda failure", re.IGNORECASE),
    ),
    (_K.SYSTEM, re.compile(r"ncclSystemError|unhandled system error", re.IGNORECASE)),
    (_K.INTERNAL, re.compile(r"ncclInternalError|\binternal error", re.IGNORECASE)),
    (
        _K.INVALID_USAGE,
        re.compile(
            # "Duplicate GPU detected : rank %d and rank %d both on CUDA device %lx" (init.cc,
            # 2.x up to 2.29), "Multiple Ranks are using the same GPU/Partition." (init.cc 2.30)
            r"ncclInvalidUsage|ncclInvalidArgument|invalid usage|invalid argument|"
            r"Duplicate GPU detected|same GPU/Partition|Invalid config",
            re.IGNORECASE,
        ),
    ),
    # 2. subsystems
    (_K.IB, re.compile(r"NET/IB|net_ib|ibv_|IBV_WC|\bIB\b|RoCE|mlx5")),
    (
        _K.SOCKET,
        re.compile(
            r"socket|connection (?:closed|refused|reset|timed out|abort)|connect to|broken pipe",
            re.IGNORECASE,
        ),
    ),
    (_K.TIMEOUT, re.compile(r"timed? ?out", re.IGNORECASE)),
    (_K.PROXY, re.compile(r"proxy", re.IGNORECASE)),
    # "Error while creating|attaching to shared memory segment %s" (src/misc/shmutils.cc, 2.12+;
    # src/include/shm.h up to 2.11, where the segment is named "nccl-shm-recv-..." without
    # its /dev/shm path)
    (
        _K.SYSTEM,
        re.compile(
            r"system error|call to \w+ failed|errno|/dev/shm|shared memory|allocate",
            re.IGNORECASE,
        ),
    ),
    # 3. any other mention of CUDA (a word, or a CUDA API call such as cudaMalloc, cuMemCreate)
    (_K.CUDA, re.compile(r"\b(?:CUDA|Cuda|cuda)\b|\bcu(?:da)?[A-Z]\w*")),
)


# ncclResult_t by name (src/nccl.h.in; ncclRemoteError since 2.13, ncclTimeout since 2.30) as
# torch prints them in getNcclErrorDetailStr (torch/csrc/distributed/c10d/NCCLUtils.cpp:
# "ncclSystemError: System call ...") and NCCL's own tools do. ncclInProgress is no failure.
RESULT_CODES: dict[str, NcclErrorKind] = {
    "ncclUnhandledCudaError": _K.CUDA,
    "ncclSystemError": _K.SYSTEM,
    "ncclInternalError": _K.INTERNAL,
    "ncclInvalidArgument": _K.INVALID_USAGE,
    "ncclInvalidUsage": _K.INVALID_USAGE,
    "ncclRemoteError": _K.REMOTE,
    "ncclTimeout": _K.TIMEOUT,
}
RESULT_CODE = re.compile(r"\b(?P<code>" + "|".join(RESULT_CODES) + r")\b")


def classify(message: str) -> NcclErrorKind:
    """The kind of one NCCL error line (or its message); ``other`` when no rule matches."""
    for kind, pattern in RULES:
        if pattern.search(message):
            return kind
    return NcclErrorKind.OTHER


def warning_kind(source: str | None, message: str) -> NcclErrorKind:
    """The kind of a ``WARN`` line from what follows its prefix: the source file NCCL names
    (``net_ib.cc``, ``socket.cc``, ``proxy.cc`` say as much as the text), then the message."""
    return classify(f"{source or ''} {message}")


ADVICE: dict[NcclErrorKind, str] = {
    _K.REMOTE: "A peer died or the network dropped: this rank is usually a victim. Find the "
    "first rank that failed (the torchrun root cause, an Xid, an OOM on another rank).",
    _K.CUDA: "A CUDA call inside NCCL failed: look for Xid errors and earlier CUDA errors on "
    "the same node; the GPU may need a reset.",
    _K.SYSTEM: "A system call or library call failed inside NCCL (sockets, shared memory, IB "
    "verbs). Rerun with NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,NET and read the 'Last error' "
    "line; common causes are a small /dev/shm in containers and a wrong NCCL_SOCKET_IFNAME.",
    _K.INTERNAL: "NCCL hit an internal error: make sure every node runs the same NCCL and "
    "PyTorch versions, then upgrade NCCL if it persists.",
    _K.INVALID_USAGE: "A programming error: ranks issued different collectives (order, shapes "
    "or dtypes) or used the wrong device. Run with TORCH_DISTRIBUTED_DEBUG=DETAIL to find it.",
    _K.IB: "InfiniBand reported a failed work completion or verbs call. Check the link on both "
    "nodes (`ibstat`, port error counters), cabling and the switch; retry-exceeded errors mean "
    "the peer or link went away. Drain the node if it repeats.",
    _K.SOCKET: "TCP between ranks failed: check that the peer process is alive, "
    "NCCL_SOCKET_IFNAME selects the right interface and no firewall sits between nodes. On an "
    "InfiniBand cluster a Socket transport means NCCL did not use IB at all.",
    _K.TIMEOUT: "NCCL gave up waiting for a peer (bootstrap or connection setup): find the rank "
    "that never arrived (crashed, stuck before init, or unreachable on the bootstrap interface "
    "NCCL_SOCKET_IFNAME selects).",
    _K.PROXY: "NCCL's proxy thread failed a network operation: the line before it in the "
    "NCCL_DEBUG=INFO output names the transport (IB or socket) that failed; treat it as that.",
    _K.OTHER: "See the NCCL_DEBUG=INFO output around this line for the failing subsystem.",
}
