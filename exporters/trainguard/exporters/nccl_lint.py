"""Lint of the NCCL / TORCH_NCCL_* / TORCH_FR_* settings of the training processes on a node.

Each check looks at one training process's environment (and at the host: InfiniBand devices,
network interfaces; and at the process's observed collective latency when known) and returns a
:class:`Finding` with what is wrong and how to fix it. The ``nccl_config`` collector exports
one gauge per check; ``trainguard doctor`` prints the findings for a human.
"""

from __future__ import annotations

import enum
import math
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
    process: TrainingProcess, host: HostFacts, latency: Latency | None
) -> list[Finding]:
    """Every check that fails for one training process."""
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
    buffer = _env(process, "TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE")
    if not buffer or not buffer.strip().isdigit() or int(buffer) == 0:
        add(
            Check.FLIGHT_RECORDER_OFF,
            "the Flight Recorder is off (TORCH_FR_BUFFER_SIZE unset or 0): a hang leaves no "
            "record of which collective each rank was in",
            "set TORCH_FR_BUFFER_SIZE=2000 and TORCH_NCCL_DUMP_ON_TIMEOUT=1 (dumps go to "
            "TORCH_FR_DUMP_TEMP_FILE, default /tmp/nccl_trace_rank_)",
        )
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
    processes: Iterable[TrainingProcess], host: HostFacts, latencies: LatencySource | None
) -> list[Finding]:
    findings: list[Finding] = []
    for process in processes:
        latency = latencies.latency(process) if latencies is not None else None
        findings.extend(lint_process(process, host, latency))
    return findings
