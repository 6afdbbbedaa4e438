"""The simulated GPU provider behind ``--simulate-gpus N``, for demos on machines with no GPU.

GPU ``i`` carries the load of the local training process with ``LOCAL_RANK=i``: its CPU use
becomes the GPU's utilisation, its resident memory the GPU's used memory, and temperature and
power follow utilisation. Every series it produces says so: the model name starts with
``Simulated``, the UUID with ``GPU-SIMULATED`` and ``trainguard_exporter_info{provider}`` is
``simulated``. It is only ever chosen explicitly.
"""

from __future__ import annotations

import time
from collections.abc import Mapping

import psutil

from trainguard.exporters.procs import ProcessSource
from trainguard.exporters.provider import GpuFailure, GpuIdentity, GpuSample, XidCount

SIMULATED_MEMORY_BYTES = 80 * 1024**3
_IDLE_WATTS = 70.0
_MAX_EXTRA_WATTS = 530.0
_IDLE_CELSIUS = 34.0
_MAX_EXTRA_CELSIUS = 46.0
_IDLE_SM_CLOCK_HERTZ = 345e6
_MAX_SM_CLOCK_HERTZ = 1980e6


class SimulatedProvider:
    kind = "simulated"

    def __init__(self, gpus: int, processes: ProcessSource) -> None:
        if gpus < 1:
            raise ValueError(f"--simulate-gpus needs at least 1 GPU, got {gpus}")
        self._gpus = gpus
        self._processes = processes
        self._tracked: dict[int, psutil.Process] = {}
        self._energy = [0.0] * gpus
        self._last = time.monotonic()

    def identity(self, index: int) -> GpuIdentity:
        return GpuIdentity(
            index=index,
            uuid=f"GPU-SIMULATED-0000-0000-0000-{index:012d}",
            name="Simulated GPU",
            pci_bus_id=f"00000000:{index:02X}:00.0",
        )

    def _load(self, pid: int) -> tuple[float, int]:
        """CPU share (0..1) since the last look, and resident memory, of one process."""
        proc = self._tracked.get(pid)
        if proc is None:
            proc = psutil.Process(pid)
            proc.cpu_percent(None)  # the first call only starts the measurement
            self._tracked[pid] = proc
        return min(proc.cpu_percent(None) / 100.0, 1.0), int(proc.memory_info().rss)

    def sample(self) -> list[GpuSample | GpuFailure]:
        now = time.monotonic()
        elapsed, self._last = now - self._last, now
        by_gpu: dict[int, list[int]] = {}
        for proc in self._processes.scan().processes:
            if proc.local_rank.isdigit() and int(proc.local_rank) < self._gpus:
                by_gpu.setdefault(int(proc.local_rank), []).append(proc.pid)
        live: set[int] = set()
        results: list[GpuSample | GpuFailure] = []
        for index in range(self._gpus):
            util, used = 0.0, 0
            for pid in by_gpu.get(index, []):
                try:
                    share, rss = self._load(pid)
                except psutil.Error:
                    continue  # exited between the scan and now
                live.add(pid)
                util, used = min(util + share, 1.0), used + rss
            power = _IDLE_WATTS + _MAX_EXTRA_WATTS * util
            self._energy[index] += power * elapsed
            results.append(
                GpuSample(
                    identity=self.identity(index),
                    utilization_ratio=util,
                    memory_used_bytes=min(used, SIMULATED_MEMORY_BYTES),
                    memory_total_bytes=SIMULATED_MEMORY_BYTES,
                    temperature_celsius=_IDLE_CELSIUS + _MAX_EXTRA_CELSIUS * util,
                    power_watts=power,
                    energy_joules=self._energy[index],
                    sm_clock_hertz=_IDLE_SM_CLOCK_HERTZ
                    + (_MAX_SM_CLOCK_HERTZ - _IDLE_SM_CLOCK_HERTZ) * util,
                    process_ids=tuple(by_gpu.get(index, [])),
                )
            )
        self._tracked = {pid: p for pid, p in self._tracked.items() if pid in live}
        return results

    def xid_counts(self) -> list[XidCount]:
        return []

    def identities(self) -> Mapping[int, GpuIdentity]:
        return {i: self.identity(i) for i in range(self._gpus)}

    def close(self) -> None:
        self._tracked.clear()
