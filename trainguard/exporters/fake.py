"""A fake GPU provider with realistic multi-GPU values and injectable NVML failures.

Used by the tests and the scrape benchmark; never chosen by the exporter's command line. Values
look like an 8x H100 SXM node under training load, differ per GPU and are deterministic, so a
golden exposition can be compared byte for byte.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from trainguard.exporters.provider import (
    GpuActivity,
    GpuFailure,
    GpuIdentity,
    GpuSample,
    ProviderUnavailableError,
    ThrottleReason,
    XidCount,
)

H100_MEMORY_BYTES = 81_559 * 1024 * 1024  # what NVML reports for an H100 80GB HBM3
H100_RESERVED_BYTES = 512 * 1024 * 1024  # memory info v2's "reserved" (driver and firmware)
DRIVER_VERSION = "550.90.07"


@dataclass
class FakeProvider:
    """``gpus`` GPUs; set the public fields to inject failures between scrapes.

    ``unavailable``: every sample raises :class:`ProviderUnavailableError` with this message
    (no driver).
    ``lost``: indices whose GPU fell off the bus. ``failing``: index -> NVML error message.
    ``processes``: index -> pids running there. ``xids``: (index, xid) -> count, in the order
    they happened. It stands for NVML (``reads_nvml``), so ``trainguard_nvml_up`` follows
    ``unavailable``.
    """

    gpus: int = 8
    model: str = "NVIDIA H100 80GB HBM3"
    unavailable: str | None = None
    lost: set[int] = field(default_factory=set)
    failing: dict[int, str] = field(default_factory=dict)
    processes: dict[int, tuple[int, ...]] = field(default_factory=dict)
    xids: dict[tuple[int, int], int] = field(default_factory=dict)
    throttled: dict[int, frozenset[ThrottleReason]] = field(default_factory=dict)
    kind: str = "fake"
    reads_nvml: bool = True
    samples_taken: int = 0

    def identity(self, index: int) -> GpuIdentity:
        return GpuIdentity(
            index=index,
            uuid=f"GPU-5c3e7f2a-{index:04x}-4d1b-9a6e-0123456789{index:02x}",
            name=self.model,
            pci_bus_id=f"00000000:{0x18 + 0x10 * index:02X}:00.0",
            driver_version=DRIVER_VERSION,
        )

    def _sample_one(self, index: int) -> GpuSample:
        util = 0.62 + 0.04 * (index % 8)
        return GpuSample(
            identity=self.identity(index),
            utilization_ratio=util,
            memory_used_bytes=(52_000 + 1_024 * index) * 1024 * 1024,
            memory_total_bytes=H100_MEMORY_BYTES,
            memory_reserved_bytes=H100_RESERVED_BYTES,
            temperature_celsius=58.0 + index,
            power_watts=455.5 + 10 * index,
            energy_joules=1.25e9 + 1.0e6 * index,
            sm_clock_hertz=1_980e6 - 15e6 * index,
            memory_clock_hertz=2_619e6,
            memory_copy_utilization_ratio=0.31 + 0.01 * index,
            encoder_utilization_ratio=0.0,
            decoder_utilization_ratio=0.0,
            memory_temperature_celsius=66.0 + index,
            throttle_reasons=self.throttled.get(index, frozenset()),
            ecc_corrected_total=index,
            ecc_uncorrected_total=0,
            remapped_rows_correctable=index % 3,
            remapped_rows_uncorrectable=0,
            remapped_rows_pending=False,
            remapped_rows_failure=False,
            pcie_tx_bytes_per_second=1.5e9 + 1e7 * index,
            pcie_rx_bytes_per_second=2.25e9 + 1e7 * index,
            pcie_replay_total=0,
            nvlink_tx_bytes_total=4_500_000_000_000 + index * 1_000_000,
            nvlink_rx_bytes_total=4_400_000_000_000 + index * 1_000_000,
            activity=GpuActivity(
                graphics_active=0.90 + 0.01 * index,
                sm_active=0.80 + 0.01 * index,
                sm_occupancy=0.375,
                tensor_active=0.40 + 0.02 * index,
                dram_active=0.30 + 0.01 * index,
                fp64_active=0.0,
                fp32_active=0.0625,
                fp16_active=0.015625,
                nvlink_tx_bytes_per_second=1.25e11 + 1e9 * index,
                nvlink_rx_bytes_per_second=1.5e11 + 1e9 * index,
            ),
            process_ids=self.processes.get(index, ()),
        )

    def sample(self) -> list[GpuSample | GpuFailure]:
        self.samples_taken += 1
        if self.unavailable is not None:
            raise ProviderUnavailableError(self.unavailable)
        results: list[GpuSample | GpuFailure] = []
        for index in range(self.gpus):
            if index in self.lost:
                results.append(GpuFailure(index, lost=True, message="GPU is lost"))
            elif index in self.failing:
                results.append(GpuFailure(index, lost=False, message=self.failing[index]))
            else:
                results.append(self._sample_one(index))
        return results

    def xid_counts(self) -> list[XidCount]:
        return [
            XidCount(i, xid, n, last_seen=float(order))
            for order, ((i, xid), n) in enumerate(self.xids.items())
        ]

    def identities(self) -> Mapping[int, GpuIdentity]:
        return {i: self.identity(i) for i in range(self.gpus)}

    def close(self) -> None:
        """Nothing to release."""
