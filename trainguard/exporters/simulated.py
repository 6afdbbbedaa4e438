"""The simulated GPU provider behind ``--simulate-gpus N``, for demos on machines with no GPU.

GPU ``i`` carries the load of the local training process with ``LOCAL_RANK=i``: its CPU use
becomes the GPU's utilisation, its resident memory the GPU's used memory, and temperature and
power follow utilisation. Every series it produces says so: the model name starts with
``Simulated``, the UUID with ``GPU-SIMULATED``, the driver version is ``simulated`` and
``trainguard_exporter_info{provider}`` is ``simulated``; ``trainguard_nvml_up`` is left out,
since no NVML is read. It is only ever chosen explicitly.

It fills every reading the ``--dcgm-compat`` fields are made of, so each DCGM family it emits
has a sample per GPU: clocks, memory temperature and copy utilisation, PCIe, NVLink and the
profiling activities (SM, tensor, DRAM, FP pipes) all follow utilisation in fixed, made-up
proportions (plausible for mixed-precision training, not measured). ECC, throttling and Xids
are never simulated: a simulated node has no faults.
"""

from __future__ import annotations

import time
from collections.abc import Mapping

import psutil

from trainguard.exporters.procs import ProcessSource
from trainguard.exporters.provider import (
    GpuActivity,
    GpuFailure,
    GpuIdentity,
    GpuSample,
    XidCount,
)

SIMULATED_MEMORY_BYTES = 80 * 1024**3
SIMULATED_RESERVED_BYTES = 512 * 1024**2
SIMULATED_DRIVER_VERSION = "simulated"
_IDLE_WATTS = 70.0
_MAX_EXTRA_WATTS = 530.0
_IDLE_CELSIUS = 34.0
_MAX_EXTRA_CELSIUS = 46.0
_IDLE_SM_CLOCK_HERTZ = 345e6
_MAX_SM_CLOCK_HERTZ = 1980e6
_MEMORY_CLOCK_HERTZ = 2619e6
_MEMORY_ABOVE_CORE_CELSIUS = 8.0
# At full utilisation: bytes per second over PCIe and over all NVLink links.
_MAX_PCIE_BYTES_PER_SECOND = 4e9
_MAX_NVLINK_BYTES_PER_SECOND = 2e11


def _activity(util: float) -> GpuActivity:
    """What the units do when the GPU is ``util`` busy (made-up proportions)."""
    return GpuActivity(
        graphics_active=util,
        sm_active=0.9 * util,
        sm_occupancy=0.4 * util,
        tensor_active=0.5 * util,
        dram_active=0.35 * util,
        fp64_active=0.0,
        fp32_active=0.08 * util,
        fp16_active=0.02 * util,
        nvlink_tx_bytes_per_second=_MAX_NVLINK_BYTES_PER_SECOND * util,
        nvlink_rx_bytes_per_second=_MAX_NVLINK_BYTES_PER_SECOND * util,
    )


class SimulatedProvider:
    kind = "simulated"
    reads_nvml = False

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
            driver_version=SIMULATED_DRIVER_VERSION,
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
            temperature = _IDLE_CELSIUS + _MAX_EXTRA_CELSIUS * util
            self._energy[index] += power * elapsed
            results.append(
                GpuSample(
                    identity=self.identity(index),
                    utilization_ratio=util,
                    memory_used_bytes=min(used, SIMULATED_MEMORY_BYTES - SIMULATED_RESERVED_BYTES),
                    memory_total_bytes=SIMULATED_MEMORY_BYTES,
                    memory_reserved_bytes=SIMULATED_RESERVED_BYTES,
                    temperature_celsius=temperature,
                    power_watts=power,
                    energy_joules=self._energy[index],
                    sm_clock_hertz=_IDLE_SM_CLOCK_HERTZ
                    + (_MAX_SM_CLOCK_HERTZ - _IDLE_SM_CLOCK_HERTZ) * util,
                    memory_clock_hertz=_MEMORY_CLOCK_HERTZ,
                    memory_copy_utilization_ratio=0.35 * util,
                    encoder_utilization_ratio=0.0,
                    decoder_utilization_ratio=0.0,
                    memory_temperature_celsius=temperature + _MEMORY_ABOVE_CORE_CELSIUS,
                    remapped_rows_correctable=0,
                    remapped_rows_uncorrectable=0,
                    remapped_rows_pending=False,
                    remapped_rows_failure=False,
                    pcie_tx_bytes_per_second=_MAX_PCIE_BYTES_PER_SECOND * util,
                    pcie_rx_bytes_per_second=_MAX_PCIE_BYTES_PER_SECOND * util,
                    pcie_replay_total=0,
                    activity=_activity(util),
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
