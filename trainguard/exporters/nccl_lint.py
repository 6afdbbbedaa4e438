"""Lint of the NCCL / TORCH_NCCL_* / TORCH_FR_* settings of the training processes on a node.

Each check looks at one training process's environment (and at the host: InfiniBand devices,
network interfaces; and at the process's observed collective latency when known) and returns a
:class:`Finding` with what is wrong and how to fix it. The ``nccl_config`` collector exports
one gauge per check; ``trainguard doctor`` prints the findings for a human.
"""

from __future__ import annotations

import enum
import importlib.metadata
import math
import re
import urllib.error
import urllib.request
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Protocol

from prometheus_client.parser import text_string_to_metric_families

from trainguard import contract
from trainguard.exporters.procs import HostFacts, TrainingProcess

_TORCH_ENV_DOC = "https://docs.pytorch.org/docs/stable/torch_nccl_environment_variables.html"
_NCCL_ENV_DOC = "https://docs.nvidia.com/deeplearning/nccl/user-guide/docs/env.html"
_FLIGHT_RECORDER_DOC = "https://docs.pytorch.org/tutorials/unstable/flight_recorder_tutorial.html"
_TRUE = ("1", "true", "yes", "on")

# torch's watchdog heartbeat timeout when TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC is unset.
DEFAULT_HEARTBEAT_TIMEOUT_SECONDS = 480.0
# A timeout under this many times the slowest observed collective kills healthy jobs...
TIMEOUT_MIN_FACTOR = 5.0
# ...and one over this many times (and over TIMEOUT_MAX_SECONDS) lets a hang burn GPU hours.
TIMEOUT_MAX_FACTOR = 10_000.0
TIMEOUT_MAX_SECONDS = 1800.0


# -- the Flight Recorder's default, per torch release ---------------------------------------
#
# torch reads the buffer size once, in the FlightRecorder constructor
# (torch/csrc/distributed/c10d/FlightRecorder.hpp; NCCLTraceBuffer in TraceUtils.h in older
# releases) with getCvarInt(names, default): the first name that is set wins, and 0 entries
# means the recorder is off (FlightRecorderDetail.hpp: record() returns at once unless
# enabled_). Read from the headers each release ships (git_version of its torch/version.py):
#   v2.7.0  134179474539648ba7dee1317959529fbd0e7f89  {"TORCH_NCCL_TRACE_BUFFER_SIZE"}, 0
#   v2.8.0  a1cb3cc05d46d198467bebbb6e8fba50a325d4e7  {"TORCH_FR_BUFFER_SIZE",
#                                                     "TORCH_NCCL_TRACE_BUFFER_SIZE"}, 0
#   v2.10.0 449b1768410104d3ed79d3bcfe4ba1d65c7f22c0  same names, 0
#   v2.11.0 70d99e998b4955e0049d13a98d77ae1b14db1f45  same names, 2000 (pytorch/pytorch#172843,
#                                                     "Fix Flight Recorder default buffer size
#                                                     inconsistency", fixes #172811)
#   v2.13.0 cf30153c4c131c8164ee7798e5022d810682e2cb  same names, 2000
# ProcessGroupNCCL.cpp keeps its own copy of the size, 2000 already before 2.11; it does not
# size the recorder, so with FlightRecorder.hpp's 0 nothing was recorded. (torch's optional
# torchcomms backend reads the same variables in distributed_c10d.py, with a default of 0.)
FR_BUFFER_VAR = "TORCH_FR_BUFFER_SIZE"
FR_LEGACY_BUFFER_VAR = "TORCH_NCCL_TRACE_BUFFER_SIZE"
FR_RECOMMENDED_ENTRIES = 2000


@dataclass(frozen=True)
class FlightRecorderDefaults:
    """What torch releases from ``since`` (major, minor) on read, and the size when unset."""

    since: tuple[int, int]
    names: tuple[str, ...]  # highest priority first, as getCvarInt reads them
    default_entries: int


# Newest first; the first row whose ``since`` the version reaches applies.
FLIGHT_RECORDER_DEFAULTS: tuple[FlightRecorderDefaults, ...] = (
    FlightRecorderDefaults((2, 11), (FR_BUFFER_VAR, FR_LEGACY_BUFFER_VAR), 2000),
    FlightRecorderDefaults((2, 8), (FR_BUFFER_VAR, FR_LEGACY_BUFFER_VAR), 0),
    FlightRecorderDefaults((0, 0), (FR_LEGACY_BUFFER_VAR,), 0),
)
# getCvarInt parses with std::stoi: leading blanks, a sign and digits; it ignores what follows
# and throws (so torch refuses the setting) when nothing parses or the value overflows an int.
_STOI = re.compile(r"\s*([+-]?\d+)")
_INT_MAX = 2**31 - 1


def installed_torch_version() -> str | None:
    """The version of the torch installed where this runs, from its metadata (never imports
    torch, which is slow and starts CUDA); None when torch is not installed."""
    try:
        return importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:
        return None


def _release(torch_version: str | None) -> tuple[int, int] | None:
    match = re.match(r"(\d+)\.(\d+)", torch_version or "")
    return (int(match[1]), int(match[2])) if match else None


def flight_recorder_defaults(torch_version: str | None) -> FlightRecorderDefaults | None:
    """The defaults of that torch release; None when the version is unknown or unparsable."""
    release = _release(torch_version)
    if release is None:
        return None
    return next(d for d in FLIGHT_RECORDER_DEFAULTS if release >= d.since)


@dataclass(frozen=True)
class FlightRecorderState:
    """Whether a process's Flight Recorder records, given its environment and torch version."""

    enabled: bool | None  # None: cannot tell (unknown torch default, or a value torch refuses)
    entries: int | None
    reason: str  # why, for a human
    variable: str  # the variable to set for this torch

    def describe(self) -> str:
        if self.enabled is None:
            return f"unknown ({self.reason})"
        state = f"on, {self.entries} entries" if self.enabled else "off"
        return f"{state} ({self.reason})"


def flight_recorder_state(
    environ: Mapping[str, str], torch_version: str | None
) -> FlightRecorderState:
    """The effective Flight Recorder setting: the variables torch reads win, else its default.

    ``torch_version`` is that of the torch the process runs (None: unknown). Pure: tested on
    fixtures of environments and version strings.
    """
    defaults = flight_recorder_defaults(torch_version)
    names = defaults.names if defaults else (FR_BUFFER_VAR, FR_LEGACY_BUFFER_VAR)
    variable = names[0]
    name = next((n for n in names if n in environ), None)
    if name is None:
        ignored = [n for n in (FR_BUFFER_VAR, FR_LEGACY_BUFFER_VAR) if n in environ]
        if defaults is None:
            return FlightRecorderState(
                None,
                None,
                f"{FR_BUFFER_VAR} is unset and the torch version is unknown (torch is not "
                "installed here), so is its default: 0 entries (off) before torch 2.11, "
                f"{FR_RECOMMENDED_ENTRIES} since",
                variable,
            )
        version = f"torch {torch_version}"
        reason = f"{variable} is unset: {version}'s default is {defaults.default_entries}"
        if ignored:
            reason += f" ({version} ignores {', '.join(ignored)}: it reads {variable} only)"
        return FlightRecorderState(
            defaults.default_entries > 0,
            defaults.default_entries,
            reason,
            variable,
        )
    raw = environ[name]
    parsed = _STOI.match(raw)
    value = int(parsed[1]) if parsed else None
    if value is None or value < 0 or value > _INT_MAX:
        return FlightRecorderState(
            None,
            None,
            f"{name}={raw!r} is not a buffer size torch accepts (a whole number, 0 = off)",
            variable,
        )
    shadowed = [n for n in names if n in environ and n != name]
    reason = f"{name}={raw.strip()}"
    if shadowed:
        reason += f", which overrides {', '.join(shadowed)}"
    return FlightRecorderState(value > 0, value, reason, variable)


class Check(str, enum.Enum):
    """The ``check`` label of ``trainguard_nccl_config_warnings``."""

    ASYNC_ERROR_HANDLING_OFF = "async_error_handling_off"
    IB_DISABLED_WITH_IB_DEVICES = "ib_disabled_with_ib_devices"
    SOCKET_IFNAME_UNSET = "socket_ifname_unset"
    TIMEOUT_VS_LATENCY = "timeout_vs_latency"
    FLIGHT_RECORDER_OFF = "flight_recorder_off"
    NCCL_DEBUG_FILE_UNSET = "nccl_debug_file_unset"


RUNBOOK_URLS: Mapping[Check, str] = {
    Check.ASYNC_ERROR_HANDLING_OFF: _TORCH_ENV_DOC,
    Check.IB_DISABLED_WITH_IB_DEVICES: _NCCL_ENV_DOC + "#nccl-ib-disable",
    Check.SOCKET_IFNAME_UNSET: _NCCL_ENV_DOC + "#nccl-socket-ifname",
    Check.TIMEOUT_VS_LATENCY: _TORCH_ENV_DOC,
    Check.FLIGHT_RECORDER_OFF: _FLIGHT_RECORDER_DOC,
    Check.NCCL_DEBUG_FILE_UNSET: _NCCL_ENV_DOC + "#nccl-debug-file",
}


@dataclass(frozen=True)
class Finding:
    check: Check
    pid: int
    rank: str
    problem: str
    fix: str

    @property
    def runbook_url(self) -> str:
        return RUNBOOK_URLS[self.check]


@dataclass(frozen=True)
class Latency:
    """A rank's slowest recent collective (p99 of its gradient sync), in seconds."""

    p99_seconds: float


class LatencySource(Protocol):
    def latency(self, process: TrainingProcess) -> Latency | None: ...


def _seconds(value: str | None) -> float | None:
    if value is None:
        return None
    try:
        parsed = float(value)
    except ValueError:
        return None
    return parsed if math.isfinite(parsed) and parsed > 0 else None


def histogram_p99(buckets: Iterable[tuple[float, float]]) -> float | None:
    """The upper bound of the first bucket holding 99% of observations (``le``, cumulative)."""
    ordered = sorted(buckets)
    if not ordered or ordered[-1][1] <= 0:
        return None
    total = ordered[-1][1]
    for upper, count in ordered:
        if count >= 0.99 * total:
            return upper if math.isfinite(upper) else None
    return None


@dataclass
class RankMetricsLatency:
    """Reads a rank's own /metrics (its TRAINGUARD_METRICS_PORT) for its grad-sync histogram."""

    timeout_seconds: float = 0.5

    def latency(self, process: TrainingProcess) -> Latency | None:
        port = process.environ.get(contract.ENV_METRICS_PORT, "")
        if not port.isdigit():
            return None
        url = f"http://127.0.0.1:{port}/metrics"
        try:
            with urllib.request.urlopen(url, timeout=self.timeout_seconds) as response:
                text = response.read().decode(errors="replace")
        except (urllib.error.URLError, OSError, ValueError):
            return None
        buckets: dict[float, float] = {}
        for family in text_string_to_metric_families(text):
            if family.name != contract.GRAD_SYNC_DURATION.name:
                continue
            for sample in family.samples:
                if sample.name.endswith("_bucket"):
                    upper = float(sample.labels["le"])
                    buckets[upper] = buckets.get(upper, 0.0) + sample.value
        p99 = histogram_p99(buckets.items())
        return None if p99 is None else Latency(p99)


def _env(process: TrainingProcess, *names: str) -> str | None:
    for name in names:
        if name in process.environ:
            return process.environ[name]
    return None


def lint_process(
    process: TrainingProcess,
    host: HostFacts,
    latency: Latency | None,
    torch_version: str | None = None,
) -> list[Finding]:
    """Every check that fails for one training process (``torch_version``: the torch it runs,
    None when unknown)."""
    found: list[Finding] = []

    def add(check: Check, problem: str, fix: str) -> None:
        found.append(Finding(check, process.pid, process.rank, problem, fix))

    async_handling = _env(process, "TORCH_NCCL_ASYNC_ERROR_HANDLING", "NCCL_ASYNC_ERROR_HANDLING")
    if async_handling is not None and async_handling.strip() == "0":
        add(
            Check.ASYNC_ERROR_HANDLING_OFF,
            "TORCH_NCCL_ASYNC_ERROR_HANDLING=0: a timed-out collective leaves the job hanging "
            "instead of aborting it",
            "unset TORCH_NCCL_ASYNC_ERROR_HANDLING (torch's default, 3) or set it to 3, so a "
            "timeout aborts the communicator and torchrun can restart the job",
        )
    if (_env(process, "NCCL_IB_DISABLE") or "").strip().lower() in _TRUE and host.ib_devices:
        add(
            Check.IB_DISABLED_WITH_IB_DEVICES,
            "NCCL_IB_DISABLE=1 while this node has InfiniBand devices "
            f"({', '.join(host.ib_devices)}): inter-node traffic goes over TCP sockets",
            "unset NCCL_IB_DISABLE so NCCL uses InfiniBand/RoCE (check with NCCL_DEBUG=INFO: "
            "'NET/IB : Using ...')",
        )
    if not _env(process, "NCCL_SOCKET_IFNAME") and len(host.interfaces) > 1:
        add(
            Check.SOCKET_IFNAME_UNSET,
            "NCCL_SOCKET_IFNAME is unset and this node has several interfaces up "
            f"({', '.join(host.interfaces)}): NCCL may bootstrap over the wrong one",
            "set NCCL_SOCKET_IFNAME (and GLOO_SOCKET_IFNAME) to the cluster network's interface, "
            f"e.g. NCCL_SOCKET_IFNAME={host.interfaces[0]}",
        )
    if latency is not None:
        _check_timeouts(process, latency, add)
    recorder = flight_recorder_state(process.environ, torch_version)
    if not recorder.enabled:
        _flight_recorder_finding(recorder, add)
    level = (_env(process, "NCCL_DEBUG") or "").strip().upper()
    if level not in ("INFO", "TRACE") or not _env(process, "NCCL_DEBUG_FILE"):
        add(
            Check.NCCL_DEBUG_FILE_UNSET,
            "NCCL_DEBUG=INFO with NCCL_DEBUG_FILE is not set: transports and NCCL warnings "
            "are not recorded where the exporter can follow them",
            "set NCCL_DEBUG=INFO and NCCL_DEBUG_FILE=/var/log/nccl/%h.%p.log (matching the "
            "exporter's --nccl.log-glob); INFO logs only initialisation and warnings",
        )
    return found


class _Add(Protocol):
    def __call__(self, check: Check, problem: str, fix: str) -> None: ...


def _flight_recorder_finding(recorder: FlightRecorderState, add: _Add) -> None:
    consequence = "a hang leaves no record of which collective each rank was in"
    if recorder.enabled is False:
        problem = f"the Flight Recorder is off ({recorder.reason}): {consequence}"
    else:
        problem = f"the Flight Recorder may be off ({recorder.reason}): if so, {consequence}"
    if recorder.variable == FR_LEGACY_BUFFER_VAR:
        dump_file = "TORCH_NCCL_DEBUG_INFO_TEMP_FILE"
        setting = f"{FR_LEGACY_BUFFER_VAR}={FR_RECOMMENDED_ENTRIES}"
    else:
        dump_file = "TORCH_FR_DUMP_TEMP_FILE"
        setting = f"{FR_BUFFER_VAR}={FR_RECOMMENDED_ENTRIES}"
        if recorder.enabled is None:
            setting += (
                f" ({FR_LEGACY_BUFFER_VAR}={FR_RECOMMENDED_ENTRIES} on torch before 2.8), "
                "explicitly,"
            )
    add(
        Check.FLIGHT_RECORDER_OFF,
        problem,
        f"set {setting} and TORCH_NCCL_DUMP_ON_TIMEOUT=1 (dumps go to {dump_file}, default "
        "/tmp/nccl_trace_rank_)",
    )


def _check_timeouts(process: TrainingProcess, latency: Latency, add: _Add) -> None:
    timeouts = {
        "TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC": _seconds(
            _env(process, "TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC")
        )
        or DEFAULT_HEARTBEAT_TIMEOUT_SECONDS,
        contract.ENV_STALL_FLOOR: _seconds(_env(process, contract.ENV_STALL_FLOOR)),
    }
    p99 = latency.p99_seconds
    for name, timeout in timeouts.items():
        if timeout is None:
            continue
        if timeout < TIMEOUT_MIN_FACTOR * p99:
            add(
                Check.TIMEOUT_VS_LATENCY,
                f"{name}={timeout:g}s is under {TIMEOUT_MIN_FACTOR:g}x the observed collective "
                f"p99 of {p99:g}s: healthy but slow steps will be treated as hangs",
                f"raise {name} to at least {TIMEOUT_MIN_FACTOR * p99:g}s",
            )
        elif timeout > max(TIMEOUT_MAX_FACTOR * p99, TIMEOUT_MAX_SECONDS):
            add(
                Check.TIMEOUT_VS_LATENCY,
                f"{name}={timeout:g}s is over {TIMEOUT_MAX_FACTOR:g}x the observed collective "
                f"p99 of {p99:g}s: a hang burns the whole job's GPUs that long before anything "
                "acts",
                f"lower {name} to a few minutes, or rely on trainguard's collective watchdog "
                f"({contract.ENV_STALL_FLOOR})",
            )


def lint(
    processes: Iterable[TrainingProcess],
    host: HostFacts,
    latencies: LatencySource | None,
    torch_version: str | None = None,
) -> list[Finding]:
    findings: list[Finding] = []
    for process in processes:
        latency = latencies.latency(process) if latencies is not None else None
        findings.extend(lint_process(process, host, latency, torch_version))
    return findings
