"""NVIDIA Xid codes: what each means and whether the node should be drained.

The meanings follow NVIDIA's published Xid catalog for the codes a training cluster actually
meets. Which Xids need the node drained is not decided here: it is ``xid_critical`` in
``thresholds.yml``, the one list the GpuXidError alert pages on and remediation drains on.
``drain`` is derived from it:

* ``now``: the code is in ``xid_critical`` and the GPU cannot be trusted with the next step
  (take the node out of scheduling before the next job);
* ``after_job``: the code is in ``xid_critical`` but NVIDIA's catalog says the GPU keeps
  working until a reset applies the repair (63, 92, 94: ``reset_can_wait`` below), so drain when
  the current job ends;
* ``no``: a known code outside ``xid_critical`` (an application-level fault; the GPU is
  healthy), ``unknown`` for a code not in this table and not in ``xid_critical``.

One exception, on purpose: Xid 154 ("GPU recovery action changed") carries the action the GPU
needs in its message, which the exporter's counter (and so the alert) cannot read; the alert
only warns on it, while triage reads the action and says ``now`` unless it is "None"
(``recovery_drain``). NVIDIA's catalog also asks for a GPU reset after 38 (driver firmware
error) and 140 (unrecovered ECC error), which ``xid_critical`` does not list yet: until it does,
their advice says to reset the GPU but ``drain`` follows the list (see thresholds.yml).

``DRIVER_EVENTS``: the failures the driver reports without an Xid (a GPU fallen off the bus at
probe time, RmInitAdapter failures, a lost GPU, a crash dump); each drains like the Xid it
amounts to (``like_xid``), or ``unknown`` where the message cannot say.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass


@dataclass(frozen=True)
class XidInfo:
    meaning: str
    drain: str
    advice: str


@dataclass(frozen=True)
class _Fact:
    """What NVIDIA's catalog says about one code; ``reset_can_wait``: the GPU keeps working
    until the next reset applies the repair (drain after the job rather than now)."""

    meaning: str
    advice: str
    reset_can_wait: bool = False


_APP = (
    "Usually the application (an out-of-bounds access or a bad kernel): rerun the failing "
    "step under compute-sanitizer. If it repeats on this GPU with different jobs, run "
    "`dcgmi diag -r 3` on the node."
)
_RESET = (
    "Drain the node, reset the GPU (`nvidia-smi -r` with no processes on it) or reboot, "
    "then run `dcgmi diag -r 3` before returning it to service; open an RMA if it recurs."
)

# Facts only: whether a code drains the node is thresholds.yml's xid_critical (see above).
CATALOGUE: dict[int, _Fact] = {
    8: _Fact("GPU stopped processing (timeout)", _APP),
    13: _Fact("Graphics engine exception", _APP),
    31: _Fact("GPU memory page fault (illegal address)", _APP),
    32: _Fact(
        "Invalid or corrupted push buffer stream",
        "Often PCIe or system-memory trouble: check `dmesg` for AER/PCIe errors and the GPU's "
        "seating; drain after the job if it repeats.",
    ),
    38: _Fact(
        "Driver firmware error",
        "NVIDIA's catalog asks for a GPU reset: reset the GPU (`nvidia-smi -r`) or reboot when "
        "the job ends and run `dcgmi diag -r 3`; drain the node if it recurs.",
    ),
    43: _Fact("GPU stopped processing (a channel was reset after a user fault)", _APP),
    45: _Fact(
        "Preemptive cleanup after earlier errors",
        "A consequence, not a cause: the process was killed or an earlier Xid hit this GPU; "
        "look at the Xid just before it.",
    ),
    48: _Fact("Double-bit ECC error (uncorrectable)", _RESET),
    61: _Fact("Internal micro-controller breakpoint/warning", _RESET),
    62: _Fact("Internal micro-controller halt", _RESET),
    63: _Fact(
        "ECC page retirement or row-remapping event",
        "The GPU recorded a memory remap that takes effect at the next GPU reset: drain the "
        "node when the current job ends and reset the GPU.",
        reset_can_wait=True,
    ),
    64: _Fact("ECC page retirement or row-remapping failure", _RESET),
    68: _Fact("Video decoder (NVDEC) exception", _APP),
    69: _Fact("Graphics engine class error", _APP),
    74: _Fact(
        "NVLink error",
        "Drain the node; check `nvidia-smi nvlink -e` and the NVSwitch/fabric manager logs, "
        "reset the GPUs; a link that keeps failing is a hardware replacement.",
    ),
    79: _Fact(
        "GPU has fallen off the bus",
        "Drain the node: the GPU is no longer reachable over PCIe. Reboot it and check power, "
        "thermals and PCIe seating; a repeat is a hardware replacement.",
    ),
    92: _Fact(
        "High single-bit ECC error rate",
        "Memory is degrading: drain after the job, reset the GPU and watch "
        "trainguard_gpu_ecc_errors_total.",
        reset_can_wait=True,
    ),
    94: _Fact(
        "Contained ECC error",
        "The error was contained to the process that used the memory (it was terminated); "
        "other processes are fine. Reset the GPU after the job so row remapping takes effect.",
        reset_can_wait=True,
    ),
    95: _Fact("Uncontained ECC error", _RESET),
    109: _Fact("Context switch timeout", _APP),
    119: _Fact("GSP RPC timeout", _RESET),
    120: _Fact("GSP error", _RESET),
    140: _Fact(
        "Unrecovered ECC error",
        "NVIDIA's catalog asks for a GPU reset: reset the GPU (`nvidia-smi -r`) or reboot before "
        "the next job and run `dcgmi diag -r 3`; open an RMA if it recurs.",
    ),
    154: _Fact(
        "GPU recovery action changed",
        "The driver says what recovery the GPU needs (in the message: GPU reset, node reboot, "
        "drain and reset); do it before the next job is scheduled.",
    ),
}

# Xid 154 names the recovery the GPU needs; the exporter's counter cannot, so the alert only
# warns on it and triage decides from the message (recovery_drain).
RECOVERY_ACTION_XID = 154

_UNKNOWN = _Fact(
    "Xid not in trainguard's table",
    "Look the code up in NVIDIA's Xid catalog; treat it as needing a drain until you know.",
)


# Failures the driver reports without an Xid (NVIDIA/open-gpu-kernel-modules 595.45.04, commit
# df1c9a3de2be4b130f4fc7680f7198193d8ac6ad; the older wordings are quoted in
# tests/triage/corpus/gpu_fault/SOURCES.md). Triage reports them as gpu_fault findings with no
# ``xid`` field, an ``event`` instead; on the same GPU as an Xid they are folded into the Xid's
# finding. ``like_xid``: the Xid whose drain decision applies (the GPU is as unusable as after
# it), None where the message alone cannot say.
@dataclass(frozen=True)
class DriverEvent:
    meaning: str
    advice: str
    like_xid: int | None


DRIVER_EVENTS: dict[str, DriverEvent] = {
    # osinit.c osHandleGpuLost: NV_DEV_PRINTF "GPU has fallen off the bus." (after Xid 79 when
    # bEmitXid); osapi.c RmInitAdapter probe: "The NVIDIA GPU %04x:%02x:%02x.%x\n(PCI ID:
    # %04x:%04x) installed in this system has\nfallen off the bus and is not responding to
    # commands." (no Xid: the GPU is already gone when the driver probes it).
    "fallen_off_bus": DriverEvent(
        "GPU has fallen off the bus (reported without an Xid)",
        CATALOGUE[79].advice,
        79,
    ),
    # "Check failed: GPU lost from the bus [NV_ERR_GPU_IS_LOST]" (nvCheckOkFailedNoLog) and, with
    # debug prints on, nv.c's "GPU is lost, skipping ...".
    "gpu_lost": DriverEvent(
        "GPU lost: the driver can no longer reach it",
        CATALOGUE[79].advice,
        79,
    ),
    # osinit.c RmInitAdapter: NV_DEV_PRINTF "RmInitAdapter failed! (0x%x:0x%x:%d)" and nv.c
    # "rm_init_adapter failed, device minor number %d".
    "init_failed": DriverEvent(
        "The driver could not initialise the GPU (RmInitAdapter failed)",
        "The GPU cannot run anything until the driver initialises it: drain the node, look for "
        "the Xid or PCIe/AER errors before this message, reseat or power-cycle the GPU and run "
        "`dcgmi diag -r 3`; one that keeps failing is a hardware replacement. The same status "
        "on every GPU of the node after a driver update points at the driver or its GSP "
        "firmware instead.",
        79,
    ),
    # osapi.c RmLogGpuCrash: "A GPU crash dump has been created. If possible, please run\n
    # nvidia-bug-report.sh as root to collect this data before\nthe NVIDIA kernel module is
    # unloaded." It names no GPU and no cause.
    "crash_dump": DriverEvent(
        "The driver saved a GPU crash dump after a serious GPU error",
        "Run `nvidia-bug-report.sh` as root before the driver is unloaded; the Xid or driver "
        "message just before the dump says what failed and whether to drain.",
        None,
    ),
}


def driver_event_drain(event: str, critical: Collection[int]) -> str:
    """The drain decision for a driver failure reported without an Xid."""
    like = DRIVER_EVENTS[event].like_xid
    return "unknown" if like is None else lookup(like, critical).drain


def lookup(code: int, critical: Collection[int]) -> XidInfo:
    """Meaning, drain decision and advice for ``code``; ``critical``: the thresholds'
    ``xid_critical``, the Xids that page and drain the node."""
    fact = CATALOGUE.get(code)
    if code in critical:
        fact = fact or _UNKNOWN
        return XidInfo(fact.meaning, "after_job" if fact.reset_can_wait else "now", fact.advice)
    if fact is None:
        return XidInfo(_UNKNOWN.meaning, "unknown", _UNKNOWN.advice)
    return XidInfo(fact.meaning, "no", fact.advice)


def recovery_drain(action: str) -> str:
    """Xid 154's drain decision from the recovery action its message names."""
    return "no" if "none" in action.lower() else "now"
