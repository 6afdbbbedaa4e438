"""GPU faults the NVIDIA kernel driver reports: ``NVRM: Xid`` lines, and the failures it reports
without an Xid (a GPU fallen off the bus at probe time, RmInitAdapter failures, crash dumps).

Every wording below is cited to the driver source that prints it; the variants found in real
logs are listed with their threads in ``tests/triage/corpus/gpu_fault/SOURCES.md``. Lines come
from dmesg (``[12345.678901]``, ``dmesg -T``), journalctl/syslog (``host kernel:``) or a paste of
either: the patterns are searched, never anchored, so any such prefix may stand before them.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, ClassVar

from trainguard.contract import Failure
from trainguard.thresholds import Thresholds
from trainguard.triage import xid as catalogue
from trainguard.triage.detectors.base import (
    Source,
    add_listed,
    bounded_get,
    register,
    trim,
)
from trainguard.triage.findings import Finding, Location

# The Xid line, NVIDIA/open-gpu-kernel-modules src/nvidia/src/kernel/gpu/rc/kernel_rc.c:
#   515.43.04 (1739a20ef) .. 570.x: "NVRM: Xid (PCI:%04x:%02x:%02x): %d, pid=%s, name=%s, %s\n",
#     pid "'<unknown>'" and name "<unknown>" when no channel is known; on a MIG GPU the
#     parenthesis also holds " GPU-I:%02u" and " GPU-CI:%02u".
#   570.86.15 (54d69484d) and later: also "NVRM: Xid (PCI:...): %d, %s%s\n" without pid/name.
#   570.124.04 and later: Xid 45 ends in " caused by previous Xid %d".
#   Drivers before the open modules (e.g. 169.09, 2008): "NVRM: Xid (0003:00): 8, Channel ..."
#     (bus:device only, no "PCI:"); posters also write "(PCI:...)" for a redacted address.
_XID = re.compile(
    r"NVRM: Xid \((?:PCI:)?(?P<pci>[^)\s]*)(?P<mig>[^)]*)\): (?P<code>\d+)(?:,\s*(?P<rest>.*))?"
)
_XID_PID = re.compile(r"pid=(?P<pid>\d+)")
_XID_NAME = re.compile(r"name=(?P<name>[^,\s]+)")
_XID_CAUSE = re.compile(r"caused by previous Xid (?P<code>\d+)")
_SYSLOG_HOST = re.compile(r"(?P<host>[\w.-]+) kernel:")
# gpu.c: nvErrorLog_va(GPU_RECOVERY_ACTION_CHANGED, "GPU recovery action changed from 0x%x (%s)
# to 0x%x (%s)")
_XID_154_ACTION = re.compile(r"to 0x[0-9a-fA-F]+ \((?P<action>[^)]+)\)")

# A PCI address as the driver prints it: NV_PCI_DEV_FMT "%04x:%02x:%02x.%x"
# (kernel-open/common/inc/nv.h), "%04x:%02x:%02x" in Xid lines, "bb:dd" in old drivers.
_PCI = r"(?:[0-9a-fA-F]{4,8}:)?[0-9a-fA-F]{2}:[0-9a-fA-F]{2}(?:\.[0-9a-fA-F])?"
# NV_DEV_PRINTF prefixes "NVRM: GPU " NV_PCI_DEV_FMT ": " (os-interface.h); drivers before the
# open modules printed "NVRM: GPU at %04x:%02x:%02x.%x has fallen off the bus." and some
# "NVRM: GPU at PCI:%04x:%02x:%02x: GPU has fallen off the bus.".
_GPU_PREFIX = re.compile(rf"NVRM: GPU (?:at )?(?:PCI:)?(?P<pci>{_PCI})\b")
# osinit.c osHandleGpuLost: NV_DEV_PRINTF(..., "GPU has fallen off the bus.\n").
_FALLEN = "fallen off the bus"
# osapi.c (RmInitAdapter's probe): "NVRM: The NVIDIA GPU %04x:%02x:%02x.%x\n"
# "NVRM: (PCI ID: %04x:%04x) installed in this system has\n"
# "NVRM: fallen off the bus and is not responding to commands.\n": one printf, three lines,
# each with its own prefix in the kernel log. The same opening also starts the "is not
# supported by the ... driver" notice, which is no fault: only the third line decides.
_THE_GPU = re.compile(rf"NVRM: The NVIDIA GPU (?P<pci>{_PCI})")
_PCI_ID = re.compile(r"\(PCI ID: (?P<id>[0-9a-fA-F]{4}:[0-9a-fA-F]{4})\)")
_PROBE_MIDDLE = "installed in this system"
_THE_GPU_FOLLOW = 3
# osinit.c RmInitAdapter: NV_DEV_PRINTF "RmInitAdapter failed! (0x%x:0x%x:%d)" (init status,
# RM status, source line); kernel-open/nvidia/nv.c: "rm_init_adapter failed, device minor
# number %d". Drivers before 515 printed "NVRM: RmInitAdapter failed! (0x..:0x..:..)" with no
# GPU prefix.
_INIT_FAILED = re.compile(r"RmInitAdapter failed!(?: \((?P<status>[^)]*)\))?")
_INIT_FAILED_MINOR = "rm_init_adapter failed"
# osapi.c RmLogGpuCrash: "NVRM: A GPU crash dump has been created. If possible, please run\n"
_CRASH_DUMP = "A GPU crash dump has been created"
# nvCheckOkFailedNoLog: "Check failed: GPU lost from the bus [NV_ERR_GPU_IS_LOST]" (the status
# text of src/common/sdk/nvidia/inc/nvstatuscodes.h); nv.c with debug prints on: "NVRM: GPU is
# lost, skipping ...".
_LOST = ("GPU lost from the bus", "GPU is lost")
# kernel_rc.c _krcLogUuidOnce: "NVRM: GPU at PCI:%04x:%02x:%02x: %s\n" (the GPU's UUID), printed
# before the first Xid of a GPU: not a failure, but it names the GPU.
_UUID = re.compile(rf"NVRM: GPU at PCI:(?P<pci>{_PCI}): (?P<uuid>GPU-[0-9a-fA-F-]+)")


def _pci_key(pci: str | None) -> str | None:
    """A GPU's address in one spelling: lower case, 4-digit domain, no function number."""
    if not pci:
        return None
    parts = pci.lower().removeprefix("pci:").split(".")[0].split(":")
    if len(parts) == 3:
        try:
            return f"{int(parts[0], 16):04x}:{parts[1]}:{parts[2]}"
        except ValueError:
            return None
    return ":".join(parts) if len(parts) == 2 else None


@dataclass
class _XidGroup:
    finding: Finding
    pids: set[int] = field(default_factory=set)


@dataclass
class _EventGroup:
    """A driver failure without an Xid, on one GPU (or none named) of one host."""

    event: str
    pci: str | None
    host: str | None
    where: Location
    message: str
    sources: set[str] = field(default_factory=set)
    count: int = 0
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass
class _Pending:
    """The first line of the three-line "The NVIDIA GPU ... fallen off the bus" message."""

    pci: str
    host: str | None
    where: Location
    lines: list[str]


@register
class XidDetector:
    """``NVRM: Xid (PCI:...): N, ...`` kernel lines (dmesg, journalctl, syslog) and the driver's
    failures without an Xid: fallen off the bus, GPU lost, RmInitAdapter failed, crash dump."""

    failure: ClassVar[Failure] = Failure.GPU_FAULT
    # Every driver line holds "NVRM"; one needle keeps the scan fast. (nvidia-smi's "Unable to
    # determine the device handle for GPU ...: GPU is lost" is no kernel line and is not read.)
    keywords: tuple[str, ...] = ("NVRM",)
    needles = keywords

    @classmethod
    def from_thresholds(cls, thresholds: Thresholds) -> XidDetector:
        return cls(thresholds.xid_critical)

    def __init__(self, critical: Iterable[int]) -> None:
        """``critical``: the Xids that drain the node (thresholds' ``xid_critical``)."""
        self.dropped = 0
        self.critical = frozenset(critical)
        self._groups: dict[tuple[str | None, str, int], _XidGroup] = {}
        self._events: dict[tuple[str | None, str | None, str], _EventGroup] = {}
        self._uuids: dict[tuple[str | None, str], str] = {}
        self._pending: _Pending | None = None

    def feed(self, line: str, where: Location, source: Source) -> bool:
        if self._pending is not None:
            return self._pending_line(line, where, source)
        host_match = _SYSLOG_HOST.search(line)
        host = host_match["host"] if host_match else None
        match = _XID.search(line)
        if match:
            self._xid(match, host, line, where)
            return False
        return self._driver_line(line, host, where, source)

    # --- Xid lines -----------------------------------------------------------------------
    def _xid(self, match: re.Match[str], host: str | None, line: str, where: Location) -> None:
        code = int(match["code"])
        pci = match["pci"]
        rest = match["rest"] or ""
        existing = self._groups.get((host, pci, code))
        if existing is None:
            existing = bounded_get(
                self._groups,
                (host, pci, code),
                lambda: _XidGroup(self._finding(code, pci, match["mig"], host, rest, where)),
                self,
            )
            if existing is None:
                return
        else:
            existing.finding.count += 1
        pid = _XID_PID.search(rest)
        if pid:
            add_listed(existing.pids, int(pid["pid"]))

    def _finding(
        self, code: int, pci: str, mig: str, host: str | None, rest: str, where: Location
    ) -> Finding:
        info = catalogue.lookup(code, self.critical)
        fields: dict[str, Any] = {
            "xid": code,
            "pci": pci,
            "meaning": info.meaning,
            "drain": info.drain,
            "message": trim(rest),
        }
        if mig.strip():
            fields["mig"] = mig.strip()
        if host:
            fields["host"] = host
        name = _XID_NAME.search(rest)
        if name and name["name"] != "<unknown>":
            fields["process_name"] = name["name"]
        cause = _XID_CAUSE.search(rest)
        if cause:
            fields["caused_by_xid"] = int(cause["code"])
        if code == catalogue.RECOVERY_ACTION_XID and code not in self.critical:
            action = _XID_154_ACTION.search(rest)
            if action:
                fields["recovery_action"] = action["action"]
            fields["drain"] = catalogue.recovery_drain(action["action"] if action else "")
        on = f" on {host}" if host else ""
        return Finding(
            Failure.GPU_FAULT,
            f"Xid {code} ({info.meaning}) on GPU PCI:{pci}{on}; drain: {fields['drain']}",
            where,
            info.advice,
            fields,
        )

    # --- failures without an Xid ---------------------------------------------------------
    def _driver_line(self, line: str, host: str | None, where: Location, source: Source) -> bool:
        uuid = _UUID.search(line)
        if uuid:
            key = _pci_key(uuid["pci"])
            if key is not None:
                self._uuids[(host, key)] = uuid["uuid"]
            return False
        the_gpu = _THE_GPU.search(line)
        if the_gpu:
            pending = _Pending(the_gpu["pci"], host, where, [line])
            if _FALLEN in line:  # a collector that kept the message on one line
                self._fallen_at_probe(pending, source)
                return False
            self._pending = pending
            return True
        prefix = _GPU_PREFIX.search(line)
        pci = prefix["pci"] if prefix else None
        if _FALLEN in line and prefix:
            self._event("fallen_off_bus", pci, host, where, line, source)
            return False
        init = _INIT_FAILED.search(line)
        if init:
            extra = {"status": init["status"]} if init["status"] else {}
            self._event("init_failed", pci, host, where, line, source, extra)
            return False
        if _INIT_FAILED_MINOR in line:
            self._event("init_failed", pci, host, where, line, source)
            return False
        if _CRASH_DUMP in line:
            self._event("crash_dump", None, host, where, line, source)
            return False
        if any(lost in line for lost in _LOST):
            self._event("gpu_lost", pci, host, where, line, source)
        return False

    def _pending_line(self, line: str, where: Location, source: Source) -> bool:
        pending = self._pending
        assert pending is not None
        if _FALLEN in line:
            pending.lines.append(line)
            self._pending = None
            self._fallen_at_probe(pending, source)
            return False
        if _PROBE_MIDDLE in line and len(pending.lines) < _THE_GPU_FOLLOW:
            pending.lines.append(line)
            return True
        # another notice ("... is not supported by the NVIDIA driver release"), or the message
        # was cut: this line is read on its own
        self._pending = None
        return self.feed(line, where, source)

    def _fallen_at_probe(self, pending: _Pending, source: Source) -> None:
        text = " ".join(part.strip() for part in pending.lines)
        pci_id = _PCI_ID.search(text)
        extra = {"pci_device_id": pci_id["id"]} if pci_id else {}
        self._event("fallen_off_bus", pending.pci, pending.host, pending.where, text, source, extra)

    def _event(
        self,
        event: str,
        pci: str | None,
        host: str | None,
        where: Location,
        line: str,
        source: Source,
        extra: dict[str, Any] | None = None,
    ) -> None:
        message = line[line.find("NVRM") :] if "NVRM" in line else line
        group = bounded_get(
            self._events,
            (host, _pci_key(pci), event),
            lambda: _EventGroup(event, pci, host, where, trim(message)),
            self,
        )
        if group is None:
            return
        group.count += 1
        group.sources.add(source.name)
        if extra:
            group.extra.update(extra)

    def _event_finding(self, group: _EventGroup) -> Finding:
        info = catalogue.DRIVER_EVENTS[group.event]
        drain = catalogue.driver_event_drain(group.event, self.critical)
        fields: dict[str, Any] = {
            "event": group.event,
            "pci": group.pci,
            "meaning": info.meaning,
            "drain": drain,
            "message": group.message,
            **group.extra,
        }
        if group.host:
            fields["host"] = group.host
        uuid = self._uuids.get((group.host, _pci_key(group.pci) or ""))
        if uuid:
            fields["uuid"] = uuid
        gpu = f"GPU PCI:{group.pci}" if group.pci else "a GPU"
        on = f" on {group.host}" if group.host else ""
        return Finding(
            Failure.GPU_FAULT,
            f"{info.meaning} ({gpu}{on}, no Xid); drain: {drain}",
            group.where,
            info.advice,
            fields,
            group.count,
        )

    def findings(self) -> list[Finding]:
        if self._pending is not None:  # the message was cut after its first line
            self._pending = None
        out: list[Finding] = []
        by_gpu: dict[tuple[str | None, str], Finding] = {}
        for group in self._groups.values():
            if group.pids:
                group.finding.fields["pids"] = sorted(group.pids)
            gpu = _pci_key(group.finding.fields["pci"])
            host = group.finding.fields.get("host")
            if gpu is not None:
                uuid = self._uuids.get((host, gpu))
                if uuid:
                    group.finding.fields["uuid"] = uuid
                by_gpu.setdefault((host, gpu), group.finding)
            out.append(group.finding)
        # A driver message about a GPU an Xid already names is part of that failure (Xid 79 is
        # followed by "GPU has fallen off the bus." and the crash dump notice): fold it in.
        unnamed: list[_EventGroup] = []
        for event in self._events.values():
            gpu = _pci_key(event.pci)
            if gpu is None:
                unnamed.append(event)
                continue
            owner = by_gpu.get((event.host, gpu))
            if owner is None:
                owner = self._event_finding(event)
                by_gpu[(event.host, gpu)] = owner
                out.append(owner)
            elif "event" not in owner.fields or owner.fields["event"] != event.event:
                _fold(owner, event)
        for event in unnamed:  # a crash dump names no GPU: it belongs to the host's failure
            owner = next((f for (host, _), f in by_gpu.items() if host == event.host), None)
            if owner is not None:
                _fold(owner, event)
            else:
                out.append(self._event_finding(event))
        return out


def _fold(owner: Finding, event: _EventGroup) -> None:
    events = owner.fields.setdefault("driver_events", [])
    if event.event not in events:
        events.append(event.event)
