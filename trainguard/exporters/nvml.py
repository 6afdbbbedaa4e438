"""The NVML provider: the only module of trainguard that imports ``pynvml`` (nvidia-ml-py).

NVML is initialised at the first scrape, not at import or registration, and again at later
scrapes while it keeps failing (a driver can be loaded after the exporter starts). A GPU that
reports ``GpuIsLost`` is returned as a :class:`GpuFailure` and the other GPUs are still read.
Xid errors arrive through an NVML event set, waited on by a background thread.

Memory is read with NVML's memory info v2 (``nvmlDeviceGetMemoryInfo_v2``, asked for through
nvidia-ml-py's ``nvmlDeviceGetMemoryInfo(handle, version=nvmlMemory_v2)``), whose ``used``
leaves out what the driver and firmware reserve and reports that as ``reserved``. A driver
without v2 (before R510) is read with v1, whose ``used`` includes the reserved memory; the
reserved amount is then unknown (``None``) and the exporter says so once in its log.

Activity (SM, tensor, DRAM, NVLink) comes from NVML's GPU Performance Monitoring (GPM) on GPUs
that support it (Hopper and newer, not in MIG mode): each sample takes a GPM snapshot and the
metrics are computed over the interval since the previous one, so the first sample has none.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

import pynvml

from trainguard.background import BackgroundThread
from trainguard.exporters.provider import (
    GpuActivity,
    GpuFailure,
    GpuIdentity,
    GpuLostError,
    GpuQueryError,
    GpuSample,
    ProviderUnavailableError,
    ThrottleReason,
    XidCount,
)

log = logging.getLogger(__name__)

T = TypeVar("T")

_THROTTLE_BITS: dict[int, ThrottleReason] = {
    0x1: ThrottleReason.GPU_IDLE,
    0x2: ThrottleReason.APPLICATIONS_CLOCKS_SETTING,
    0x4: ThrottleReason.SW_POWER_CAP,
    0x8: ThrottleReason.HW_SLOWDOWN,
    0x10: ThrottleReason.SYNC_BOOST,
    0x20: ThrottleReason.SW_THERMAL_SLOWDOWN,
    0x40: ThrottleReason.HW_THERMAL_SLOWDOWN,
    0x80: ThrottleReason.HW_POWER_BRAKE_SLOWDOWN,
    0x100: ThrottleReason.DISPLAY_CLOCK_SETTING,
}
_MHZ = 1_000_000.0
_KIB = 1024
_MIB = 1024 * 1024
_PERCENT = 0.01
# NVML's "all links" scope for per-link field values.
_ALL_LINKS = 0xFFFFFFFF
_XID_WAIT_MS = 1000


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _is_lost(error: pynvml.NVMLError) -> bool:
    return bool(error.value == pynvml.NVML_ERROR_GPU_IS_LOST)


def _optional(read: Callable[[], T]) -> T | None:
    """A reading some GPUs lack (ECC on GeForce, energy before Volta): ``None`` when missing."""
    try:
        return read()
    except pynvml.NVMLError as error:
        if _is_lost(error):
            raise GpuLostError(str(error)) from error
        return None


def _required(read: Callable[[], T]) -> T:
    try:
        return read()
    except pynvml.NVMLError as error:
        if _is_lost(error):
            raise GpuLostError(str(error)) from error
        raise GpuQueryError(str(error)) from error


def _throttle_reasons(handle: Any) -> frozenset[ThrottleReason]:
    getter = getattr(pynvml, "nvmlDeviceGetCurrentClocksEventReasons", None)
    mask = int(
        getter(handle) if getter else pynvml.nvmlDeviceGetCurrentClocksThrottleReasons(handle)
    )
    return frozenset(reason for bit, reason in _THROTTLE_BITS.items() if mask & bit)


def _nvlink_bytes(handle: Any) -> tuple[int, int] | None:
    fields = pynvml.nvmlDeviceGetFieldValues(
        handle,
        [
            (pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX, _ALL_LINKS),
            (pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX, _ALL_LINKS),
        ],
    )
    if any(f.nvmlReturn != pynvml.NVML_SUCCESS for f in fields):
        return None
    return int(fields[0].value.ullVal) * _KIB, int(fields[1].value.ullVal) * _KIB


def _memory_temperature(handle: Any) -> float | None:
    (value,) = pynvml.nvmlDeviceGetFieldValues(handle, [pynvml.NVML_FI_DEV_MEMORY_TEMP])
    if value.nvmlReturn != pynvml.NVML_SUCCESS:
        return None
    return float(value.value.uiVal)


# GpuActivity's fields and the GPM metric each is read from, with the factor to its unit (GPM
# gives percentages and MiB/s; GpuActivity holds ratios and bytes/s).
_GPM_METRICS: dict[str, tuple[int, float]] = {
    "graphics_active": (pynvml.NVML_GPM_METRIC_GRAPHICS_UTIL, _PERCENT),
    "sm_active": (pynvml.NVML_GPM_METRIC_SM_UTIL, _PERCENT),
    "sm_occupancy": (pynvml.NVML_GPM_METRIC_SM_OCCUPANCY, _PERCENT),
    "tensor_active": (pynvml.NVML_GPM_METRIC_ANY_TENSOR_UTIL, _PERCENT),
    "dram_active": (pynvml.NVML_GPM_METRIC_DRAM_BW_UTIL, _PERCENT),
    "fp64_active": (pynvml.NVML_GPM_METRIC_FP64_UTIL, _PERCENT),
    "fp32_active": (pynvml.NVML_GPM_METRIC_FP32_UTIL, _PERCENT),
    "fp16_active": (pynvml.NVML_GPM_METRIC_FP16_UTIL, _PERCENT),
    "nvlink_tx_bytes_per_second": (pynvml.NVML_GPM_METRIC_NVLINK_TOTAL_TX_PER_SEC, _MIB),
    "nvlink_rx_bytes_per_second": (pynvml.NVML_GPM_METRIC_NVLINK_TOTAL_RX_PER_SEC, _MIB),
}
# What a driver without memory info v2 answers when asked for it.
_NO_MEMORY_V2 = (
    pynvml.NVML_ERROR_FUNCTION_NOT_FOUND,
    pynvml.NVML_ERROR_NOT_SUPPORTED,
    pynvml.NVML_ERROR_ARGUMENT_VERSION_MISMATCH,
)


def _gpm_supported(handle: Any) -> bool:
    try:
        return bool(pynvml.nvmlGpmQueryDeviceSupport(handle).isSupportedDevice)
    except pynvml.NVMLError:  # a driver older than GPM, or a GPU in MIG mode
        return False


class _Gpm:
    """GPM snapshots of one GPU, two buffers used in turn: each call takes a snapshot and
    computes the activity since the previous one."""

    def __init__(self, handle: Any) -> None:
        self._handle = handle
        self._buffers = [pynvml.nvmlGpmSampleAlloc(), pynvml.nvmlGpmSampleAlloc()]
        self._next = 0
        self._primed = False

    def activity(self) -> GpuActivity | None:
        current, previous = self._buffers[self._next], self._buffers[1 - self._next]
        pynvml.nvmlGpmSampleGet(self._handle, current)
        self._next = 1 - self._next
        if not self._primed:  # one snapshot is no interval
            self._primed = True
            return None
        request = pynvml.c_nvmlGpmMetricsGet_t()
        request.version = pynvml.NVML_GPM_METRICS_GET_VERSION
        request.numMetrics = len(_GPM_METRICS)
        request.sample1 = previous
        request.sample2 = current
        for slot, (metric, _) in enumerate(_GPM_METRICS.values()):
            request.metrics[slot].metricId = metric
        pynvml.nvmlGpmMetricsGet(request)
        values = {}
        for slot, (name, (_, factor)) in enumerate(_GPM_METRICS.items()):
            result = request.metrics[slot]
            if result.nvmlReturn == pynvml.NVML_SUCCESS:
                values[name] = float(result.value) * factor
        return GpuActivity(**values)

    def close(self) -> None:
        for buffer in self._buffers:
            try:
                pynvml.nvmlGpmSampleFree(buffer)
            except pynvml.NVMLError as error:
                log.debug("freeing a GPM sample failed: %s", error)


def gpu_count() -> int:
    """How many GPUs the driver reports; 0 without a driver or GPU (never raises for that)."""
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return 0
    try:
        return int(pynvml.nvmlDeviceGetCount())
    except pynvml.NVMLError:
        return 0
    finally:
        pynvml.nvmlShutdown()


class NvmlProvider:
    """GPU readings from the NVIDIA driver through NVML."""

    kind = "nvml"
    reads_nvml = True

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._initialised = False
        self._handles: list[Any] = []
        self._driver_version = ""
        self._memory_v2 = True
        self._gpm: dict[int, _Gpm] = {}
        self._identities: dict[int, GpuIdentity] = {}
        self._xids: Counter[tuple[int, int]] = Counter()
        self._xid_seen: dict[tuple[int, int], float] = {}
        self._xid_thread: BackgroundThread | None = None

    def _ensure_initialised(self) -> None:
        if self._initialised:
            return
        try:
            pynvml.nvmlInit()
            count = pynvml.nvmlDeviceGetCount()
            self._handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
        except pynvml.NVMLError as error:
            raise ProviderUnavailableError(f"NVML unavailable: {error}") from error
        self._initialised = True
        try:
            self._driver_version = _text(pynvml.nvmlSystemGetDriverVersion())
        except pynvml.NVMLError as error:
            log.warning("the driver version is unreadable: %s", error)
        self._start_gpm()
        self._start_xid_thread()

    def _start_gpm(self) -> None:
        for index, handle in enumerate(self._handles):
            if not _gpm_supported(handle):
                continue
            try:
                self._gpm[index] = _Gpm(handle)
            except pynvml.NVMLError as error:
                log.warning("GPU %d: GPM samples cannot be allocated: %s", index, error)
        unsupported = sorted(set(range(len(self._handles))) - set(self._gpm))
        if unsupported:
            log.info(
                "GPUs %s have no GPM (before Hopper, or in MIG mode): their SM, tensor, DRAM "
                "and NVLink activity (DCGM_FI_PROF_*) is not exported",
                unsupported,
            )

    def _memory(self, handle: Any) -> tuple[int, int, int | None]:
        """Total, used and reserved bytes (reserved ``None`` without memory info v2)."""
        if self._memory_v2:
            try:
                info = pynvml.nvmlDeviceGetMemoryInfo(handle, version=pynvml.nvmlMemory_v2)
            except pynvml.NVMLError as error:
                if _is_lost(error):
                    raise GpuLostError(str(error)) from error
                if error.value not in _NO_MEMORY_V2:
                    raise GpuQueryError(str(error)) from error
                log.warning(
                    "NVML memory info v2 is unavailable (%s): used memory includes what the "
                    "driver reserves, and the reserved amount is not exported",
                    error,
                )
                self._memory_v2 = False
            else:
                return int(info.total), int(info.used), int(info.reserved)
        info = _required(lambda: pynvml.nvmlDeviceGetMemoryInfo(handle))
        return int(info.total), int(info.used), None

    def _start_xid_thread(self) -> None:
        try:
            event_set = pynvml.nvmlEventSetCreate()
        except pynvml.NVMLError as error:
            log.warning("NVML event sets unavailable, Xid errors will not be counted: %s", error)
            return
        for index, handle in enumerate(self._handles):
            try:
                pynvml.nvmlDeviceRegisterEvents(
                    handle, pynvml.nvmlEventTypeXidCriticalError, event_set
                )
            except pynvml.NVMLError as error:
                log.warning("GPU %d does not report Xid events: %s", index, error)
        self._xid_thread = BackgroundThread(
            "trainguard-xid", target=lambda thread: self._wait_for_xids(thread, event_set)
        )
        self._xid_thread.start()

    def _wait_for_xids(self, thread: BackgroundThread, event_set: Any) -> None:
        while not thread.stopping:
            try:
                data = pynvml.nvmlEventSetWait_v2(event_set, _XID_WAIT_MS)
            except pynvml.NVMLError as error:
                if error.value == pynvml.NVML_ERROR_TIMEOUT:
                    continue
                log.warning("waiting for Xid events failed, stopping: %s", error)
                break
            if data.eventType != pynvml.nvmlEventTypeXidCriticalError:
                continue
            try:
                index = int(pynvml.nvmlDeviceGetIndex(data.device))
            except pynvml.NVMLError:
                index = -1
            key = (index, int(data.eventData))
            with self._lock:
                self._xids[key] += 1
                self._xid_seen[key] = time.monotonic()
        try:
            pynvml.nvmlEventSetFree(event_set)
        except pynvml.NVMLError as error:
            log.debug("freeing the NVML event set failed: %s", error)

    def _identity(self, index: int, handle: Any) -> GpuIdentity:
        known = self._identities.get(index)
        if known is None:
            known = GpuIdentity(
                index=index,
                uuid=_text(_required(lambda: pynvml.nvmlDeviceGetUUID(handle))),
                name=_text(_required(lambda: pynvml.nvmlDeviceGetName(handle))),
                pci_bus_id=_text(_required(lambda: pynvml.nvmlDeviceGetPciInfo(handle)).busId),
                driver_version=self._driver_version,
            )
            self._identities[index] = known
        return known

    def _sample_one(self, index: int, handle: Any) -> GpuSample:
        identity = self._identity(index, handle)
        util = _required(lambda: pynvml.nvmlDeviceGetUtilizationRates(handle))
        memory_total, memory_used, memory_reserved = self._memory(handle)
        temperature = _required(
            lambda: pynvml.nvmlDeviceGetTemperature(handle, pynvml.NVML_TEMPERATURE_GPU)
        )
        power_mw = _optional(lambda: pynvml.nvmlDeviceGetPowerUsage(handle))
        energy_mj = _optional(lambda: pynvml.nvmlDeviceGetTotalEnergyConsumption(handle))
        sm_mhz = _optional(lambda: pynvml.nvmlDeviceGetClockInfo(handle, pynvml.NVML_CLOCK_SM))
        mem_mhz = _optional(lambda: pynvml.nvmlDeviceGetClockInfo(handle, pynvml.NVML_CLOCK_MEM))
        encoder = _optional(lambda: pynvml.nvmlDeviceGetEncoderUtilization(handle))
        decoder = _optional(lambda: pynvml.nvmlDeviceGetDecoderUtilization(handle))
        ecc_corrected = _optional(
            lambda: pynvml.nvmlDeviceGetTotalEccErrors(
                handle, pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED, pynvml.NVML_VOLATILE_ECC
            )
        )
        ecc_uncorrected = _optional(
            lambda: pynvml.nvmlDeviceGetTotalEccErrors(
                handle, pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, pynvml.NVML_VOLATILE_ECC
            )
        )
        remapped = _optional(lambda: pynvml.nvmlDeviceGetRemappedRows(handle))
        pcie_tx = _optional(
            lambda: pynvml.nvmlDeviceGetPcieThroughput(handle, pynvml.NVML_PCIE_UTIL_TX_BYTES)
        )
        pcie_rx = _optional(
            lambda: pynvml.nvmlDeviceGetPcieThroughput(handle, pynvml.NVML_PCIE_UTIL_RX_BYTES)
        )
        processes = _optional(lambda: pynvml.nvmlDeviceGetComputeRunningProcesses(handle)) or []
        nvlink = _optional(lambda: _nvlink_bytes(handle))
        gpm = self._gpm.get(index)
        activity = None if gpm is None else _optional(gpm.activity)
        return GpuSample(
            identity=identity,
            utilization_ratio=util.gpu / 100.0,
            memory_used_bytes=memory_used,
            memory_total_bytes=memory_total,
            memory_reserved_bytes=memory_reserved,
            temperature_celsius=float(temperature),
            power_watts=None if power_mw is None else power_mw / 1000.0,
            energy_joules=None if energy_mj is None else energy_mj / 1000.0,
            sm_clock_hertz=None if sm_mhz is None else sm_mhz * _MHZ,
            memory_clock_hertz=None if mem_mhz is None else mem_mhz * _MHZ,
            memory_copy_utilization_ratio=util.memory / 100.0,
            encoder_utilization_ratio=None if encoder is None else encoder[0] / 100.0,
            decoder_utilization_ratio=None if decoder is None else decoder[0] / 100.0,
            memory_temperature_celsius=_optional(lambda: _memory_temperature(handle)),
            throttle_reasons=_optional(lambda: _throttle_reasons(handle)),
            ecc_corrected_total=ecc_corrected,
            ecc_uncorrected_total=ecc_uncorrected,
            remapped_rows_correctable=None if remapped is None else int(remapped[0]),
            remapped_rows_uncorrectable=None if remapped is None else int(remapped[1]),
            remapped_rows_pending=None if remapped is None else bool(remapped[2]),
            remapped_rows_failure=None if remapped is None else bool(remapped[3]),
            pcie_tx_bytes_per_second=None if pcie_tx is None else float(pcie_tx) * _KIB,
            pcie_rx_bytes_per_second=None if pcie_rx is None else float(pcie_rx) * _KIB,
            pcie_replay_total=_optional(lambda: pynvml.nvmlDeviceGetPcieReplayCounter(handle)),
            nvlink_tx_bytes_total=None if nvlink is None else nvlink[0],
            nvlink_rx_bytes_total=None if nvlink is None else nvlink[1],
            activity=activity or GpuActivity(),
            process_ids=tuple(int(p.pid) for p in processes),
        )

    def sample(self) -> list[GpuSample | GpuFailure]:
        self._ensure_initialised()
        results: list[GpuSample | GpuFailure] = []
        for index, handle in enumerate(self._handles):
            try:
                results.append(self._sample_one(index, handle))
            except GpuLostError as error:
                results.append(GpuFailure(index=index, lost=True, message=str(error)))
            except GpuQueryError as error:
                results.append(GpuFailure(index=index, lost=False, message=str(error)))
        return results

    def xid_counts(self) -> list[XidCount]:
        with self._lock:
            return [
                XidCount(i, xid, n, self._xid_seen[(i, xid)])
                for (i, xid), n in sorted(self._xids.items())
            ]

    def identities(self) -> Mapping[int, GpuIdentity]:
        return dict(self._identities)

    def close(self) -> None:
        if self._xid_thread is not None:
            self._xid_thread.stop(timeout=2 * _XID_WAIT_MS / 1000)
        if self._initialised:
            for gpm in self._gpm.values():
                gpm.close()
            self._gpm.clear()
            try:
                pynvml.nvmlShutdown()
            except pynvml.NVMLError as error:
                log.debug("nvmlShutdown failed: %s", error)
            self._initialised = False
