"""The NVML provider against a stand-in for the driver: nvidia-ml-py's functions replaced.

What only a GPU can show (real readings, GPM on Hopper) is in test_nvml.py, marked ``gpu``. This
file checks the provider's own logic at the boundary of nvidia-ml-py: memory info v2 and its
fallback to v1, the driver version, and GPM's snapshots in turn with their conversion to
ratios and bytes per second.
"""

from __future__ import annotations

import ctypes
from types import SimpleNamespace
from typing import Any

import pynvml
import pytest

from trainguard.exporters.nvml import NvmlProvider
from trainguard.exporters.provider import GpuFailure, GpuSample

MIB = 1024 * 1024
TOTAL, USED, RESERVED = 143_771 * MIB, 20_000 * MIB, 600 * MIB
DRIVER = "580.159.04"
# What the stand-in's GPM answers, per metric (percent or MiB/s); NVLink RX is not supported.
GPM_VALUES = {
    pynvml.NVML_GPM_METRIC_GRAPHICS_UTIL: 91.0,
    pynvml.NVML_GPM_METRIC_SM_UTIL: 80.0,
    pynvml.NVML_GPM_METRIC_SM_OCCUPANCY: 37.5,
    pynvml.NVML_GPM_METRIC_ANY_TENSOR_UTIL: 45.0,
    pynvml.NVML_GPM_METRIC_DRAM_BW_UTIL: 30.0,
    pynvml.NVML_GPM_METRIC_FP64_UTIL: 0.0,
    pynvml.NVML_GPM_METRIC_FP32_UTIL: 6.25,
    pynvml.NVML_GPM_METRIC_FP16_UTIL: 1.5,
    pynvml.NVML_GPM_METRIC_NVLINK_TOTAL_TX_PER_SEC: 1024.0,
}


def _error(code: int) -> pynvml.NVMLError:
    return pynvml.NVMLError(code)


class FakeDriver:
    """Two GPUs answering the calls the provider needs; everything optional is unsupported."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, *, memory_v2: bool, gpm: bool) -> None:
        self.memory_v2 = memory_v2
        self.gpm = gpm
        self.v2_asked = 0
        self.snapshots: list[tuple[int, int]] = []  # (gpu, buffer address) in order taken
        self.intervals: list[tuple[int, int]] = []  # (sample1, sample2) buffer addresses
        self.allocated: list[Any] = []
        self.freed: list[Any] = []
        self.lost: set[int] = set()

        def unsupported(*_: object) -> None:
            raise _error(pynvml.NVML_ERROR_NOT_SUPPORTED)

        for name in (
            "nvmlEventSetCreate",
            "nvmlDeviceGetPowerUsage",
            "nvmlDeviceGetTotalEnergyConsumption",
            "nvmlDeviceGetClockInfo",
            "nvmlDeviceGetEncoderUtilization",
            "nvmlDeviceGetDecoderUtilization",
            "nvmlDeviceGetTotalEccErrors",
            "nvmlDeviceGetRemappedRows",
            "nvmlDeviceGetPcieThroughput",
            "nvmlDeviceGetComputeRunningProcesses",
            "nvmlDeviceGetFieldValues",
            "nvmlDeviceGetCurrentClocksEventReasons",
            "nvmlDeviceGetPcieReplayCounter",
        ):
            monkeypatch.setattr(pynvml, name, unsupported)
        calls: dict[str, Any] = {
            "nvmlInit": lambda: None,
            "nvmlShutdown": lambda: None,
            "nvmlDeviceGetCount": lambda: 2,
            "nvmlDeviceGetHandleByIndex": lambda index: index,
            "nvmlSystemGetDriverVersion": lambda: DRIVER,
            "nvmlDeviceGetUUID": lambda h: f"GPU-0000000{h}",
            "nvmlDeviceGetName": lambda h: "NVIDIA H200",
            "nvmlDeviceGetPciInfo": lambda h: SimpleNamespace(busId=f"00000000:{h:02X}:00.0"),
            "nvmlDeviceGetUtilizationRates": lambda h: SimpleNamespace(gpu=50, memory=20),
            "nvmlDeviceGetTemperature": lambda h, sensor: 41,
            "nvmlDeviceGetMemoryInfo": self.memory_info,
            "nvmlGpmQueryDeviceSupport": self.gpm_support,
            "nvmlGpmSampleAlloc": self.gpm_alloc,
            "nvmlGpmSampleGet": self.gpm_snapshot,
            "nvmlGpmMetricsGet": self.gpm_metrics,
            "nvmlGpmSampleFree": self.freed.append,
        }
        for name, call in calls.items():
            monkeypatch.setattr(pynvml, name, call)

    def memory_info(self, handle: int, version: int | None = None) -> SimpleNamespace:
        if version is not None:
            assert version == pynvml.nvmlMemory_v2
            self.v2_asked += 1
            if not self.memory_v2:
                raise _error(pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)  # a driver before R510
            return SimpleNamespace(
                total=TOTAL, reserved=RESERVED, used=USED, free=TOTAL - USED - RESERVED
            )
        return SimpleNamespace(total=TOTAL, used=USED + RESERVED, free=TOTAL - USED - RESERVED)

    def gpm_support(self, handle: int) -> SimpleNamespace:
        if not self.gpm:
            raise _error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return SimpleNamespace(isSupportedDevice=1)

    def gpm_alloc(self) -> Any:
        buffer = pynvml.c_nvmlGpmSample_t(pynvml.struct_c_nvmlGpmSample_t())
        self.allocated.append(buffer)
        return buffer

    def gpm_snapshot(self, handle: int, buffer: Any) -> Any:
        if handle in self.lost:
            raise _error(pynvml.NVML_ERROR_GPU_IS_LOST)
        self.snapshots.append((handle, ctypes.addressof(buffer.contents)))
        return buffer

    def gpm_metrics(self, request: Any) -> Any:
        assert request.version == pynvml.NVML_GPM_METRICS_GET_VERSION
        self.intervals.append(
            (ctypes.addressof(request.sample1.contents), ctypes.addressof(request.sample2.contents))
        )
        for slot in range(request.numMetrics):
            metric = request.metrics[slot]
            if metric.metricId in GPM_VALUES:
                metric.value = GPM_VALUES[metric.metricId]
                metric.nvmlReturn = pynvml.NVML_SUCCESS
            else:
                metric.nvmlReturn = pynvml.NVML_ERROR_NOT_SUPPORTED
        return request


def _gpus(provider: NvmlProvider) -> list[GpuSample]:
    results = provider.sample()
    assert all(isinstance(r, GpuSample) for r in results), results
    return [r for r in results if isinstance(r, GpuSample)]


def test_memory_info_v2_separates_reserved_from_used(monkeypatch: pytest.MonkeyPatch) -> None:
    FakeDriver(monkeypatch, memory_v2=True, gpm=False)
    provider = NvmlProvider()
    gpu = _gpus(provider)[0]
    assert (gpu.memory_used_bytes, gpu.memory_reserved_bytes) == (USED, RESERVED)
    assert gpu.memory_free_bytes == TOTAL - USED - RESERVED
    assert gpu.identity.driver_version == DRIVER
    provider.close()


def test_without_memory_info_v2_used_includes_reserved(monkeypatch: pytest.MonkeyPatch) -> None:
    driver = FakeDriver(monkeypatch, memory_v2=False, gpm=False)
    provider = NvmlProvider()
    for _ in range(3):
        gpu = _gpus(provider)[1]
        assert (gpu.memory_used_bytes, gpu.memory_reserved_bytes) == (USED + RESERVED, None)
        assert gpu.memory_free_bytes == TOTAL - USED - RESERVED
    assert driver.v2_asked == 1  # asked once, then v1 only
    provider.close()


def test_gpm_activity_is_the_interval_between_two_snapshots(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    driver = FakeDriver(monkeypatch, memory_v2=True, gpm=True)
    provider = NvmlProvider()
    first = _gpus(provider)
    assert all(gpu.activity.sm_active is None for gpu in first)  # one snapshot: no interval
    assert driver.intervals == []
    second = _gpus(provider)[0].activity
    assert second.graphics_active == pytest.approx(0.91)
    assert second.sm_active == pytest.approx(0.80)
    assert second.sm_occupancy == pytest.approx(0.375)
    assert second.tensor_active == pytest.approx(0.45)
    assert second.dram_active == pytest.approx(0.30)
    assert second.fp32_active == pytest.approx(0.0625)
    assert second.nvlink_tx_bytes_per_second == 1024 * MIB
    assert second.nvlink_rx_bytes_per_second is None  # that metric failed alone
    _gpus(provider)
    # GPU 0's snapshots alternate between its two buffers; each interval runs from the
    # previous snapshot to the one just taken
    taken = [address for gpu, address in driver.snapshots if gpu == 0]
    assert taken[0] == taken[2] != taken[1]
    assert driver.intervals[0::2] == [(taken[0], taken[1]), (taken[1], taken[2])]
    provider.close()
    assert len(driver.freed) == len(driver.allocated) == 4  # two buffers per GPU


def test_without_gpm_there_is_no_activity_and_nothing_allocated(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    driver = FakeDriver(monkeypatch, memory_v2=True, gpm=False)
    provider = NvmlProvider()
    for _ in range(2):
        assert all(gpu.activity.tensor_active is None for gpu in _gpus(provider))
    assert driver.allocated == []
    provider.close()


def test_a_gpu_lost_during_its_gpm_snapshot_is_reported_lost(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    driver = FakeDriver(monkeypatch, memory_v2=True, gpm=True)
    provider = NvmlProvider()
    _gpus(provider)
    driver.lost.add(1)
    results = provider.sample()
    assert isinstance(results[0], GpuSample)
    assert isinstance(results[1], GpuFailure) and results[1].lost
    provider.close()
