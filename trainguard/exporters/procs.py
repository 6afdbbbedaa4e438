"""The training processes on this node and the facts about the host that lint needs.

Process environments come from ``/proc/<pid>/environ``: the environment a process was started
with (what torchrun handed it), not later changes made inside Python. Other users' processes
are unreadable without privileges; they are counted, not fatal. Both sources are Protocols so
tests give made-up processes and hosts. :class:`ProcfsSource` also reads one process's
``cgroup`` and ``environ`` on demand (:class:`ProcessFiles`), for collectors that look up the
processes NVML lists rather than the training ranks.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol, runtime_checkable

from trainguard import contract

# A process is a training rank when torchrun (or torch.distributed's env:// launchers) gave it
# both of these.
_RANK_VARS = ("RANK", "LOCAL_RANK")
# Interfaces that never carry NCCL traffic between nodes.
_VIRTUAL_INTERFACE_PREFIXES = ("lo", "docker", "veth", "virbr", "br-", "cni", "flannel", "cali")


@dataclass(frozen=True)
class TrainingProcess:
    pid: int
    environ: Mapping[str, str]
    ppid: int = 0

    @property
    def rank(self) -> str:
        return self.environ.get("RANK", "")

    @property
    def local_rank(self) -> str:
        return self.environ.get("LOCAL_RANK", "")

    @property
    def job_id(self) -> str:
        return contract.job_id_from_environment(self.environ)


@dataclass(frozen=True)
class ProcessScan:
    processes: list[TrainingProcess]
    unreadable: int = 0


class ProcessSource(Protocol):
    def scan(self) -> ProcessScan: ...


@runtime_checkable
class ProcessFiles(Protocol):
    """One process's ``/proc`` files, read when asked; ``None`` when the process is gone or
    the file cannot be read (another user's environment without privileges)."""

    def cgroup(self, pid: int) -> str | None: ...

    def environ(self, pid: int) -> dict[str, str] | None: ...


@dataclass(frozen=True)
class HostFacts:
    """What the node has: InfiniBand devices and network interfaces that are up."""

    ib_devices: tuple[str, ...] = ()
    interfaces: tuple[str, ...] = ()


class HostSource(Protocol):
    def facts(self) -> HostFacts: ...


def parse_environ(raw: bytes) -> dict[str, str]:
    """``/proc/<pid>/environ``: NUL-separated ``NAME=value``; entries without ``=`` are skipped."""
    env: dict[str, str] = {}
    for entry in raw.split(b"\0"):
        name, sep, value = entry.partition(b"=")
        if sep and name:
            env[name.decode(errors="replace")] = value.decode(errors="replace")
    return env


def is_training_process(environ: Mapping[str, str]) -> bool:
    return all(var in environ for var in _RANK_VARS)


def parent_pid(stat: str) -> int:
    """The ppid field of ``/proc/<pid>/stat`` (the command name before it may hold spaces)."""
    fields = stat[stat.rfind(")") + 2 :].split()
    return int(fields[1]) if len(fields) > 1 and fields[1].isdigit() else 0


def ranks_only(processes: list[TrainingProcess]) -> list[TrainingProcess]:
    """Drop the children of a rank that inherited its environment (DataLoader workers,
    compile workers): they are the same rank, not another one."""
    by_pid = {p.pid: p for p in processes}

    def same_rank_as_parent(p: TrainingProcess) -> bool:
        parent = by_pid.get(p.ppid)
        return parent is not None and (parent.rank, parent.local_rank, parent.job_id) == (
            p.rank,
            p.local_rank,
            p.job_id,
        )

    return [p for p in processes if not same_rank_as_parent(p)]


@dataclass
class ProcfsSource:
    """Training processes found under ``proc_root`` (``/proc``, or a host's /proc mounted in)."""

    proc_root: Path = field(default_factory=lambda: Path("/proc"))

    def scan(self) -> ProcessScan:
        found: list[TrainingProcess] = []
        unreadable = 0
        for entry in self.proc_root.iterdir():
            if not entry.name.isdigit():
                continue
            try:
                raw = (entry / "environ").read_bytes()
            except PermissionError:
                unreadable += 1
                continue
            except (FileNotFoundError, ProcessLookupError):
                continue  # the process exited while we looked
            environ = parse_environ(raw)
            if is_training_process(environ):
                try:
                    ppid = parent_pid((entry / "stat").read_text(errors="replace"))
                except OSError:
                    ppid = 0
                found.append(TrainingProcess(int(entry.name), environ, ppid))
        found.sort(key=lambda p: p.pid)
        return ProcessScan(ranks_only(found), unreadable)

    def cgroup(self, pid: int) -> str | None:
        try:
            return (self.proc_root / str(pid) / "cgroup").read_text(errors="replace")
        except OSError:  # gone (ENOENT, ESRCH) or unreadable
            return None

    def environ(self, pid: int) -> dict[str, str] | None:
        try:
            return parse_environ((self.proc_root / str(pid) / "environ").read_bytes())
        except OSError:
            return None


@dataclass
class SysfsHost:
    """Host facts from ``/sys``: ``class/infiniband`` devices and ``class/net`` interfaces up."""

    sys_root: Path = field(default_factory=lambda: Path("/sys"))

    def facts(self) -> HostFacts:
        ib_root = self.sys_root / "class" / "infiniband"
        ib = tuple(sorted(p.name for p in ib_root.iterdir())) if ib_root.is_dir() else ()
        interfaces: list[str] = []
        net_root = self.sys_root / "class" / "net"
        if net_root.is_dir():
            for iface in sorted(net_root.iterdir()):
                if iface.name.startswith(_VIRTUAL_INTERFACE_PREFIXES):
                    continue
                try:
                    state = (iface / "operstate").read_text().strip()
                except OSError:
                    continue
                if state == "up":
                    interfaces.append(iface.name)
        return HostFacts(ib_devices=ib, interfaces=tuple(interfaces))
