"""The gpu_fault detector on every wording the NVIDIA driver's source prints.

Each case is rendered from a format string of NVIDIA/open-gpu-kernel-modules (tag and file named
beside it; tests/triage/corpus/gpu_fault/SOURCES.md lists them) or quoted from an older
driver's output, so a variant the corpus has not met yet is still covered.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from trainguard.contract import Failure
from trainguard.thresholds import load_default
from trainguard.triage.detectors import default_detectors
from trainguard.triage.scanner import Scanner


def triage(tmp_path: Path, text: str) -> list[dict[str, Any]]:
    log = tmp_path / "kern.log"
    log.write_text(text)
    scanner = Scanner(default_detectors(load_default()))
    scanner.scan_paths([str(log)])
    return [f.to_json() for f in scanner.findings()]


def gpu_faults(tmp_path: Path, text: str) -> list[dict[str, Any]]:
    findings = triage(tmp_path, text)
    assert {f["failure"] for f in findings} <= {Failure.GPU_FAULT.value}
    return [f["fields"] for f in findings]


# kernel_rc.c krcReportXid (XID_PRINT_WITH_ATTR), 570.86.15 and later; the attributions on a MIG
# GPU, the process-less form, and Xid 45's cause (570.124.04 and later).
@pytest.mark.parametrize(
    ("line", "xid", "pci", "extra"),
    [
        (
            "NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, name=python3, GPU has fallen off the bus.",
            79,
            "0000:3b:00",
            {"process_name": "python3", "pids": [1234]},
        ),
        (
            "NVRM: Xid (PCI:0000:01:00 GPU-I:05): 94, pid=7194, name=python, Contained: CE User "
            "Channel (0x9). RST: No, D-RST: No",
            94,
            "0000:01:00",
            {"mig": "GPU-I:05", "drain": "after_job"},
        ),
        (
            "NVRM: Xid (PCI:0000:01:00 GPU-I:02 GPU-CI:01): 31, pid=88, name=a.out, MMU Fault",
            31,
            "0000:01:00",
            {"mig": "GPU-I:02 GPU-CI:01", "drain": "no"},
        ),
        (
            "NVRM: Xid (PCI:0000:06:00): 79, GPU has fallen off the bus.",
            79,
            "0000:06:00",
            {"drain": "now"},
        ),
        (
            "NVRM: Xid (PCI:0000:dc:00): 45, pid=1818990, name=python3, Ch 00000001 caused by "
            "previous Xid 149",
            45,
            "0000:dc:00",
            {"caused_by_xid": 149},
        ),
        # drivers before the open modules: bus:device only, no "PCI:"
        ("NVRM: Xid (0003:00): 8, Channel 00000001", 8, "0003:00", {}),
        ("NVRM: Xid (0000:02:00): 13, 0003 00000000 0000a0c0 000017f0", 13, "0000:02:00", {}),
    ],
)
def test_xid_line_formats(tmp_path, line, xid, pci, extra) -> None:
    (fields,) = gpu_faults(tmp_path, f"[ 9912.118722] {line}\n")
    assert fields["xid"] == xid and fields["pci"] == pci
    for key, value in extra.items():
        assert fields[key] == value, key


def test_unknown_process_is_not_a_process_name(tmp_path) -> None:
    line = "NVRM: Xid (PCI:0000:cb:00): 13, pid='<unknown>', name=<unknown>, Graphics Exception"
    (fields,) = gpu_faults(tmp_path, line + "\n")
    assert "process_name" not in fields and "pids" not in fields


def test_probe_message_over_three_lines_without_xid(tmp_path) -> None:
    # osapi.c: one printf, three kernel lines; journald repeats the prefix on each
    text = (
        "Jun 02 13:13:04 gpu-7 kernel: NVRM: The NVIDIA GPU 0000:18:00.0\n"
        "Jun 02 13:13:04 gpu-7 kernel: NVRM: (PCI ID: 10de:2901) installed in this system has\n"
        "Jun 02 13:13:04 gpu-7 kernel: NVRM: fallen off the bus and is not responding to "
        "commands.\n"
    )
    (fields,) = gpu_faults(tmp_path, text)
    assert "xid" not in fields
    assert fields["event"] == "fallen_off_bus" and fields["drain"] == "now"
    assert (fields["pci"], fields["pci_device_id"], fields["host"]) == (
        "0000:18:00.0",
        "10de:2901",
        "gpu-7",
    )


def test_probe_message_of_an_unsupported_gpu_is_no_fault(tmp_path) -> None:
    text = (
        "NVRM: The NVIDIA GPU 0000:01:00.0 (PCI ID: 10de:0fc6)\n"
        "NVRM: installed in this system is not supported by the\n"
        "NVRM: NVIDIA 470.82.00 driver release.\n"
        "NVRM: GPU at PCI:0000:3b:00: GPU-979426f2-893a-7cbb-c4cf-81472f89a462\n"
        "NVRM: loading NVIDIA UNIX x86_64 Kernel Module  535.161.07\n"
    )
    assert gpu_faults(tmp_path, text) == []


def test_a_line_after_a_cut_probe_message_is_still_read(tmp_path) -> None:
    text = (
        "NVRM: The NVIDIA GPU 0000:b3:00.0\n"
        "NVRM: GPU 0000:17:00.0: RmInitAdapter failed! (0x22:0x56:894)\n"
    )
    (fields,) = gpu_faults(tmp_path, text)
    assert fields["event"] == "init_failed" and fields["status"] == "0x22:0x56:894"


@pytest.mark.parametrize(
    ("line", "event", "pci"),
    [
        # osinit.c osHandleGpuLost via NV_DEV_PRINTF (515.43.04 and later)
        ("NVRM: GPU 0000:29:00.0: GPU has fallen off the bus.", "fallen_off_bus", "0000:29:00.0"),
        # drivers before the open modules
        ("NVRM: GPU at 0000:01:00.0 has fallen off the bus.", "fallen_off_bus", "0000:01:00.0"),
        (
            "NVRM: GPU at PCI:0000:01:00: GPU has fallen off the bus.",
            "fallen_off_bus",
            "0000:01:00",
        ),
        # osinit.c RmInitAdapter, nv.c rm_init_adapter; the old unprefixed form
        (
            "NVRM: GPU 0000:81:00.0: RmInitAdapter failed! (0x25:0x40:1470)",
            "init_failed",
            "0000:81:00.0",
        ),
        (
            "NVRM: GPU 0000:0a:00.0: rm_init_adapter failed, device minor number 5",
            "init_failed",
            "0000:0a:00.0",
        ),
        ("NVRM: RmInitAdapter failed! (0x26:0xffff:1227)", "init_failed", None),
        ("NVRM: rm_init_adapter failed for device bearing minor number 0", "init_failed", None),
        # nvCheckOkFailedNoLog with NV_ERR_GPU_IS_LOST's text
        (
            "NVRM: nvCheckOkFailedNoLog: Check failed: GPU lost from the bus [NV_ERR_GPU_IS_LOST]"
            " (0x0000000F) returned from _issueRpcAndWait",
            "gpu_lost",
            None,
        ),
        ("NVRM: GPU 0000:02:00.0: GPU is lost, skipping nv_pci_probe", "gpu_lost", "0000:02:00.0"),
        ("NVRM: A GPU crash dump has been created. If possible, please run", "crash_dump", None),
    ],
)
def test_failures_without_an_xid(tmp_path, line, event, pci) -> None:
    (fields,) = gpu_faults(tmp_path, f"[   49.261458] {line}\n")
    assert "xid" not in fields
    assert (fields["event"], fields["pci"]) == (event, pci)
    assert fields["drain"] == ("unknown" if event == "crash_dump" else "now")


def test_driver_messages_after_an_xid_are_part_of_it(tmp_path) -> None:
    text = (
        "[Fri Apr  5 21:29:39 2024] NVRM: GPU at PCI:0000:a1:00: GPU-979426f2-893a-7cbb-c4cf\n"
        "[Fri Apr  5 21:29:39 2024] NVRM: Xid (PCI:0000:a1:00): 79, pid='<unknown>', "
        "name=<unknown>, GPU has fallen off the bus.\n"
        "[Fri Apr  5 21:29:39 2024] NVRM: GPU 0000:a1:00.0: GPU has fallen off the bus.\n"
        "[Fri Apr  5 21:29:39 2024] NVRM: A GPU crash dump has been created. If possible, "
        "please run\n"
        "                           NVRM: nvidia-bug-report.sh as root to collect this data\n"
    )
    (fields,) = gpu_faults(tmp_path, text)
    assert fields["xid"] == 79 and fields["uuid"] == "GPU-979426f2-893a-7cbb-c4cf"
    assert fields["driver_events"] == ["fallen_off_bus", "crash_dump"]


def test_other_gpus_driver_messages_stay_findings_of_their_own(tmp_path) -> None:
    text = (
        "NVRM: Xid (PCI:0000:a1:00): 79, GPU has fallen off the bus.\n"
        "NVRM: GPU 0000:b1:00.0: RmInitAdapter failed! (0x24:0x72:1568)\n"
    )
    found = gpu_faults(tmp_path, text)
    assert sorted(f.get("xid", 0) for f in found) == [0, 79]
    (init,) = [f for f in found if "event" in f]
    assert init["pci"] == "0000:b1:00.0"


def test_ordinary_driver_lines_are_no_fault(tmp_path) -> None:
    text = (
        "[    2.757687] NVRM: loading NVIDIA UNIX Open Kernel Module for x86_64  530.41.03\n"
        "[  190.444608] NVRM: gpuClearFbhubPoisonIntrForBug2924523_GA100: FBHUB Interrupt\n"
        "[  195.083145] NVRM: GPU Board Serial Number: 1653923026510\n"
        "[  240.209498] NVRM: Attempting to remove minor device 0 with non-zero usage count!\n"
        "NVRM: RmInitAdapter: osInitNvMapping failed, bailing out of RmInitAdapter\n"
    )
    assert gpu_faults(tmp_path, text) == []
