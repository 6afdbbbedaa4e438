"""What collectors know about GPUs: the provider Protocol, its samples and its errors.

Collectors never talk to NVML. They ask a :class:`GpuProvider`, which is NVML on a real node
(``trainguard.exporters.nvml``, the only module that imports ``pynvml``), a fake one in tests and
benchmarks, or the simulated one behind ``--simulate-gpus``. A provider opens lazily, at the first
scrape, so registering collectors never touches hardware.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol


class ProviderUnavailableError(Exception):
    """The provider cannot answer at all (no driver, no library, NVML init failed)."""


class GpuLostError(Exception):
    """One GPU fell off the bus (NVML's GpuIsLost); the other GPUs keep answering."""


class GpuQueryError(Exception):
    """One GPU failed a query for another reason (NVML returned an unexpected error)."""


class ThrottleReason(str, enum.Enum):
    """Why clocks are held down; the values are the ``reason`` label of the throttle metric."""

    GPU_IDLE = "gpu_idle"
    APPLICATIONS_CLOCKS_SETTING = "applications_clocks_setting"
    SW_POWER_CAP = "sw_power_cap"
    HW_SLOWDOWN = "hw_slowdown"
    SYNC_BOOST = "sync_boost"
    SW_THERMAL_SLOWDOWN = "sw_thermal_slowdown"
    HW_THERMAL_SLOWDOWN = "hw_thermal_slowdown"
    HW_POWER_BRAKE_SLOWDOWN = "hw_power_brake_slowdown"
    DISPLAY_CLOCK_SETTING = "display_clock_setting"


@dataclass(frozen=True)
class GpuIdentity:
    """What stays the same for a GPU while the driver is loaded (``driver_version``: the
    loaded driver's, empty when unknown)."""

    index: int
    uuid: str
    name: str
    pci_bus_id: str
    driver_version: str = ""


@dataclass(frozen=True)
class GpuActivity:
    """What the GPU's units did between two samples, as ratios of time or cycles (0..1), and
    NVLink throughput; ``None`` where the GPU cannot tell.

    On a real GPU these come from NVML's GPU Performance Monitoring (GPM, Hopper and newer),
    which measures over the interval between two samples, so the first sample has none.
    """

    graphics_active: float | None = None
    sm_active: float | None = None
    sm_occupancy: float | None = None
    tensor_active: float | None = None
    dram_active: float | None = None
    fp64_active: float | None = None
    fp32_active: float | None = None
    fp16_active: float | None = None
    nvlink_tx_bytes_per_second: float | None = None
    nvlink_rx_bytes_per_second: float | None = None


@dataclass(frozen=True)
class GpuSample:
    """One GPU at one scrape. ``None`` means the GPU does not support that reading.

    ``memory_used_bytes`` is what applications hold; ``memory_reserved_bytes`` what the driver
    and firmware keep for themselves. Drivers that cannot tell them apart (no NVML memory info
    v2) count the reserved memory as used and leave ``memory_reserved_bytes`` ``None``, so
    ``total - used - (reserved or 0)`` is always the free memory.
    """

    identity: GpuIdentity
    utilization_ratio: float
    memory_used_bytes: int
    memory_total_bytes: int
    temperature_celsius: float
    memory_reserved_bytes: int | None = None
    power_watts: float | None = None
    energy_joules: float | None = None
    sm_clock_hertz: float | None = None
    memory_clock_hertz: float | None = None
    memory_copy_utilization_ratio: float | None = None
    encoder_utilization_ratio: float | None = None
    decoder_utilization_ratio: float | None = None
    memory_temperature_celsius: float | None = None
    throttle_reasons: frozenset[ThrottleReason] | None = None
    ecc_corrected_total: int | None = None
    ecc_uncorrected_total: int | None = None
    remapped_rows_correctable: int | None = None
    remapped_rows_uncorrectable: int | None = None
    remapped_rows_pending: bool | None = None
    remapped_rows_failure: bool | None = None
    pcie_tx_bytes_per_second: float | None = None
    pcie_rx_bytes_per_second: float | None = None
    pcie_replay_total: int | None = None
    nvlink_tx_bytes_total: int | None = None
    nvlink_rx_bytes_total: int | None = None
    activity: GpuActivity = field(default_factory=GpuActivity)
    process_ids: tuple[int, ...] = field(default=())

    @property
    def memory_free_bytes(self) -> int:
        return self.memory_total_bytes - self.memory_used_bytes - (self.memory_reserved_bytes or 0)


@dataclass(frozen=True)
class GpuFailure:
    """A GPU that did not answer this scrape, and why."""

    index: int
    lost: bool
    message: str


@dataclass(frozen=True)
class XidCount:
    """How many times one GPU reported one Xid since the exporter started.

    ``last_seen`` orders Xids in time (monotonic seconds) so the latest one can be told apart.
    """

    index: int
    xid: int
    count: int
    last_seen: float = 0.0


class GpuProvider(Protocol):
    """Where GPU readings come from.

    ``kind`` names the provider in ``trainguard_exporter_info{provider}``: ``nvml``,
    ``simulated`` or ``fake``. ``reads_nvml`` says whether its readings stand for NVML's, and
    so whether ``trainguard_nvml_up`` means anything: the simulated provider reads no NVML and
    the exporter leaves that series out rather than claim an NVML it never asked.
    """

    @property
    def kind(self) -> str: ...

    @property
    def reads_nvml(self) -> bool: ...

    def sample(self) -> list[GpuSample | GpuFailure]:
        """Read every GPU; raises :class:`ProviderUnavailableError` when nothing can be read."""
        ...

    def xid_counts(self) -> list[XidCount]:
        """Xid errors seen so far, per GPU and Xid."""
        ...

    def identities(self) -> Mapping[int, GpuIdentity]:
        """The last known identity of each GPU (kept for GPUs that are lost later)."""
        ...

    def close(self) -> None: ...
