"""NVIDIA Xid codes: what each means and whether the node should be drained.

The meanings follow NVIDIA's published Xid catalog for the codes a training cluster actually
meets. ``drain`` is one of ``now`` (take the node out of scheduling before the next job),
``after_job`` (the GPU works but needs a reset to recover: drain when the current job ends)
and ``no`` (an application-level fault; the GPU is healthy).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class XidInfo:
    meaning: str
    drain: str
    advice: str


_APP = (
    "Usually the application (an out-of-bounds access or a bad kernel): rerun the failing "
    "step under compute-sanitizer. If it repeats on this GPU with different jobs, run "
    "`dcgmi diag -r 3` on the node."
)
_RESET = (
    "Drain the node, reset the GPU (`nvidia-smi -r` with no processes on it) or reboot, "
    "then run `dcgmi diag -r 3` before returning it to service; open an RMA if it recurs."
)

XID_TABLE: dict[int, XidInfo] = {
    8: XidInfo("GPU stopped processing (timeout)", "no", _APP),
    13: XidInfo("Graphics engine exception", "no", _APP),
    31: XidInfo("GPU memory page fault (illegal address)", "no", _APP),
    32: XidInfo(
        "Invalid or corrupted push buffer stream",
        "after_job",
        "Often PCIe or system-memory trouble: check `dmesg` for AER/PCIe errors and the GPU's "
        "seating; drain after the job if it repeats.",
    ),
    38: XidInfo("Driver firmware error", "now", _RESET),
    43: XidInfo("GPU stopped processing (a channel was reset after a user fault)", "no", _APP),
    45: XidInfo(
        "Preemptive cleanup after earlier errors",
        "no",
        "A consequence, not a cause: the process was killed or an earlier Xid hit this GPU; "
        "look at the Xid just before it.",
    ),
    48: XidInfo("Double-bit ECC error (uncorrectable)", "now", _RESET),
    61: XidInfo("Internal micro-controller breakpoint/warning", "now", _RESET),
    62: XidInfo("Internal micro-controller halt", "now", _RESET),
    63: XidInfo(
        "ECC page retirement or row-remapping event",
        "after_job",
        "The GPU recorded a memory remap that takes effect at the next GPU reset: drain the "
        "node when the current job ends and reset the GPU.",
    ),
    64: XidInfo("ECC page retirement or row-remapping failure", "now", _RESET),
    68: XidInfo("Video decoder (NVDEC) exception", "no", _APP),
    69: XidInfo("Graphics engine class error", "no", _APP),
    74: XidInfo(
        "NVLink error",
        "now",
        "Drain the node; check `nvidia-smi nvlink -e` and the NVSwitch/fabric manager logs, "
        "reset the GPUs; a link that keeps failing is a hardware replacement.",
    ),
    79: XidInfo(
        "GPU has fallen off the bus",
        "now",
        "Drain the node: the GPU is no longer reachable over PCIe. Reboot it and check power, "
        "thermals and PCIe seating; a repeat is a hardware replacement.",
    ),
    92: XidInfo(
        "High single-bit ECC error rate",
        "after_job",
        "Memory is degrading: drain after the job, reset the GPU and watch "
        "trainguard_gpu_ecc_errors_total.",
    ),
    94: XidInfo(
        "Contained ECC error",
        "after_job",
        "The error was contained to the process that used the memory (it was terminated); "
        "other processes are fine. Reset the GPU after the job so row remapping takes effect.",
    ),
    95: XidInfo("Uncontained ECC error", "now", _RESET),
    109: XidInfo("Context switch timeout", "no", _APP),
    119: XidInfo("GSP RPC timeout", "now", _RESET),
    120: XidInfo("GSP error", "now", _RESET),
    140: XidInfo("Unrecovered ECC error", "now", _RESET),
    154: XidInfo(
        "GPU recovery action changed",
        "now",
        "The driver says what recovery the GPU needs (in the message: GPU reset, node reboot, "
        "drain and reset); do it before the next job is scheduled.",
    ),
}

UNKNOWN = XidInfo(
    "Xid not in trainguard's table",
    "unknown",
    "Look the code up in NVIDIA's Xid catalog; treat it as needing a drain until you know.",
)


def lookup(code: int) -> XidInfo:
    return XID_TABLE.get(code, UNKNOWN)
