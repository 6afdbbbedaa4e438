"""Memory of a training rank, sampled at step boundaries (never per op).

On CUDA the caching allocator's own statistics (``torch.cuda.memory_stats``); on CPU the
process RSS against the cgroup limit, or the host's memory when there is none.
The fragmentation ratio is the share of reserved memory that no tensor holds,
``(reserved - allocated) / reserved``: the memory that ``expandable_segments`` gives back.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import psutil
import torch

_CGROUP_LIMIT_FILES = (
    Path("/sys/fs/cgroup/memory.max"),  # cgroup v2
    Path("/sys/fs/cgroup/memory/memory.limit_in_bytes"),  # cgroup v1
)
# cgroup v1 reports "no limit" as a huge page-aligned number.
_NO_LIMIT_THRESHOLD = 1 << 60


@dataclass(frozen=True, slots=True)
class MemorySample:
    allocated_bytes: int
    reserved_bytes: int
    capacity_bytes: int
    alloc_retries: int  # cumulative
    ooms: int  # cumulative, as counted by the allocator

    @property
    def fragmentation_ratio(self) -> float:
        if self.reserved_bytes <= 0:
            return 0.0
        return max(0.0, (self.reserved_bytes - self.allocated_bytes) / self.reserved_bytes)

    def summary(self) -> dict[str, int | float]:
        return {
            "allocated_bytes": self.allocated_bytes,
            "reserved_bytes": self.reserved_bytes,
            "capacity_bytes": self.capacity_bytes,
            "fragmentation_ratio": round(self.fragmentation_ratio, 4),
            "alloc_retries": self.alloc_retries,
        }


def parse_cgroup_limit(text: str) -> int | None:
    """The limit in a cgroup memory file, or ``None`` for "max"/unlimited."""
    value = text.strip()
    if not value or value == "max":
        return None
    limit = int(value)
    return None if limit >= _NO_LIMIT_THRESHOLD else limit


def host_memory_limit() -> int:
    for path in _CGROUP_LIMIT_FILES:
        try:
            limit = parse_cgroup_limit(path.read_text())
        except (OSError, ValueError):
            continue
        if limit is not None:
            return limit
    return int(psutil.virtual_memory().total)


class MemorySampler:
    """Reads the memory of ``device``; create once, call :meth:`sample` per step.

    ``cpu_capacity_bytes`` replaces the host's limit as a CPU rank's capacity.
    """

    def __init__(self, device: torch.device, cpu_capacity_bytes: int | None = None) -> None:
        self.device = device
        self._process = psutil.Process()
        if device.type == "cuda":
            self._capacity = int(torch.cuda.get_device_properties(device).total_memory)
        else:
            self._capacity = cpu_capacity_bytes or host_memory_limit()

    def sample(self) -> MemorySample:
        if self.device.type == "cuda":
            stats = torch.cuda.memory_stats(self.device)
            return MemorySample(
                allocated_bytes=int(stats.get("allocated_bytes.all.current", 0)),
                reserved_bytes=int(stats.get("reserved_bytes.all.current", 0)),
                capacity_bytes=self._capacity,
                alloc_retries=int(stats.get("num_alloc_retries", 0)),
                ooms=int(stats.get("num_ooms", 0)),
            )
        rss = int(self._process.memory_info().rss)
        return MemorySample(rss, rss, self._capacity, 0, 0)
