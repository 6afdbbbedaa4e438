"""The gpu collector and the scrape supervisor, on a fresh registry with the fake provider."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.metrics_core import Metric

from tests.exporters.conftest import make_context, names, one, registry_of, scrape, values
from trainguard import contract
from trainguard.exporters import dcgm
from trainguard.exporters.collectors.gpu import GpuCollector
from trainguard.exporters.fake import H100_MEMORY_BYTES, FakeProvider
from trainguard.exporters.provider import ThrottleReason
from trainguard.exporters.registry import registered


def test_registering_never_touches_the_provider(fake: FakeProvider) -> None:
    context = make_context(fake, dcgm_compat=True, gpu_sample_ttl_seconds=60.0)
    collectors = {name: spec.factory(context) for name, spec in registered().items()}
    registry, supervisor = registry_of(collectors)
    assert fake.samples_taken == 0
    assert context.processes.scans == 0  # type: ignore[attr-defined]
    scrape(registry)
    assert fake.samples_taken == 1  # one NVML pass per scrape, shared by gpu and gpu_process
    supervisor.close()


def test_every_gpu_is_exported_with_its_identity_and_base_units(fake: FakeProvider) -> None:
    registry, _ = registry_of({"gpu": GpuCollector(make_context(fake))})
    samples = scrape(registry)
    assert one(samples, contract.NVML_UP.name) == 1.0
    used = values(samples, contract.GPU_MEMORY_USED.name)
    assert len(used) == 8
    gpu3 = {"gpu": "3", "uuid": fake.identity(3).uuid, "name": "NVIDIA H100 80GB HBM3"}
    assert one(samples, contract.GPU_MEMORY_USED.name, **gpu3) == (52_000 + 3 * 1024) * 2**20
    assert one(samples, contract.GPU_MEMORY_TOTAL.name, **gpu3) == H100_MEMORY_BYTES
    assert one(samples, contract.GPU_UTILIZATION.name, **gpu3) == pytest.approx(0.74)
    assert one(samples, contract.GPU_TEMPERATURE.name, **gpu3) == 61.0
    assert one(samples, contract.GPU_POWER.name, **gpu3) == pytest.approx(485.5)
    assert one(samples, contract.GPU_ENERGY.name, **gpu3) == pytest.approx(1.253e9)
    assert one(samples, contract.GPU_SM_CLOCK.name, **gpu3) == pytest.approx(1_935e6)
    assert one(samples, contract.GPU_ECC_ERRORS.name, kind="corrected", **gpu3) == 3
    assert one(samples, contract.GPU_ECC_ERRORS.name, kind="uncorrected", **gpu3) == 0
    assert one(samples, contract.GPU_REMAPPED_ROWS.name, kind="correctable", **gpu3) == 0
    assert one(samples, contract.GPU_MEMORY_RESERVED.name, **gpu3) == 512 * 2**20
    assert one(samples, contract.GPU_PCIE_THROUGHPUT.name, direction="rx", **gpu3) == 2.28e9
    assert one(samples, contract.GPU_NVLINK_BYTES.name, direction="tx", **gpu3) > 4e12
    assert one(samples, contract.GPU_UP.name, **gpu3) == 1.0


def test_one_series_per_throttle_reason() -> None:
    provider = FakeProvider(gpus=2)
    provider.throttled[1] = frozenset({ThrottleReason.HW_THERMAL_SLOWDOWN})
    registry, _ = registry_of({"gpu": GpuCollector(make_context(provider))})
    samples = scrape(registry)
    series = values(samples, contract.GPU_CLOCK_THROTTLED.name, gpu="1")
    assert len(series) == len(ThrottleReason)
    assert one(samples, contract.GPU_CLOCK_THROTTLED.name, gpu="1", reason="hw_thermal_slowdown")
    assert sum(series.values()) == 1.0
    assert sum(values(samples, contract.GPU_CLOCK_THROTTLED.name, gpu="0").values()) == 0.0


def test_a_lost_gpu_is_reported_and_the_others_continue(fake: FakeProvider) -> None:
    fake.lost.add(2)
    fake.failing[5] = "Unknown Error"
    registry, _ = registry_of({"gpu": GpuCollector(make_context(fake))})
    samples = scrape(registry)
    assert one(samples, contract.GPU_UP.name, gpu="2", uuid=fake.identity(2).uuid) == 0.0
    assert one(samples, contract.GPU_UP.name, gpu="5") == 0.0
    assert one(samples, contract.GPU_UP.name, gpu="4") == 1.0
    assert not values(samples, contract.GPU_TEMPERATURE.name, gpu="2")
    assert len(values(samples, contract.GPU_TEMPERATURE.name)) == 6
    assert one(samples, contract.NVML_UP.name) == 1.0
    assert one(samples, contract.EXPORTER_COLLECTOR_SUCCESS.name, collector="gpu") == 1.0


def test_no_driver_keeps_the_scrape_and_the_other_collectors(fake: FakeProvider) -> None:
    fake.unavailable = "NVML Shared Library Not Found"
    context = make_context(fake)
    collectors = {name: spec.factory(context) for name, spec in registered().items()}
    registry, supervisor = registry_of(collectors)
    samples = scrape(registry)
    assert one(samples, contract.NVML_UP.name) == 0.0
    assert not values(samples, contract.GPU_TEMPERATURE.name)
    success = contract.EXPORTER_COLLECTOR_SUCCESS.name
    assert one(samples, success, collector="gpu") == 0.0
    assert one(samples, success, collector="gpu_process") == 0.0
    assert one(samples, success, collector="nccl") == 1.0
    assert one(samples, success, collector="nccl_config") == 1.0
    fake.unavailable = None  # the driver came back: the next scrape sees it
    samples = scrape(registry)
    assert one(samples, contract.NVML_UP.name) == 1.0
    assert one(samples, success, collector="gpu") == 1.0
    supervisor.close()


class _Exploding:
    """Yields one family, then fails like a collector hitting a bug."""

    def describe(self) -> Iterator[Metric]:
        yield GaugeMetricFamily("trainguard_test_partial", "partial")

    def collect(self) -> Iterator[Metric]:
        family = GaugeMetricFamily("trainguard_test_partial", "partial")
        family.add_metric([], 7.0)
        yield family
        raise RuntimeError("bug in a collector")

    def close(self) -> None:
        """Nothing held."""


def test_a_failing_collector_never_fails_the_scrape(fake: FakeProvider) -> None:
    registry, _ = registry_of({"broken": _Exploding(), "gpu": GpuCollector(make_context(fake))})
    samples = scrape(registry)
    assert one(samples, "trainguard_test_partial") == 7.0  # what it produced before failing
    assert one(samples, contract.EXPORTER_COLLECTOR_SUCCESS.name, collector="broken") == 0.0
    assert one(samples, contract.EXPORTER_COLLECTOR_SUCCESS.name, collector="gpu") == 1.0
    durations = values(samples, contract.EXPORTER_COLLECTOR_DURATION.name)
    assert set(dict(k)["collector"] for k in durations) == {"broken", "gpu"}
    assert one(samples, "trainguard_exporter_info", provider="fake", version="0.1.0") == 1.0


def test_xid_errors_are_counted_per_gpu_and_code(fake: FakeProvider) -> None:
    fake.xids[(1, 79)] = 1
    fake.xids[(1, 13)] = 4
    fake.xids[(6, 48)] = 2
    registry, _ = registry_of({"gpu": GpuCollector(make_context(fake, dcgm_compat=True))})
    samples = scrape(registry)
    xid = contract.GPU_XID_ERRORS.name
    assert one(samples, xid, gpu="1", xid="79") == 1.0
    assert one(samples, xid, gpu="1", xid="13") == 4.0
    assert one(samples, xid, gpu="6", xid="48", name="NVIDIA H100 80GB HBM3") == 2.0
    # dcgm-exporter exports the latest Xid's code per GPU, 0 when none
    assert one(samples, "DCGM_FI_DEV_XID_ERRORS", gpu="1") == 13.0
    assert one(samples, "DCGM_FI_DEV_XID_ERRORS", gpu="6") == 48.0
    assert one(samples, "DCGM_FI_DEV_XID_ERRORS", gpu="0") == 0.0


ISSUE_DCGM_NAMES = {
    "DCGM_FI_DEV_GPU_UTIL",
    "DCGM_FI_DEV_FB_USED",
    "DCGM_FI_DEV_GPU_TEMP",
    "DCGM_FI_DEV_POWER_USAGE",
    "DCGM_FI_DEV_SM_CLOCK",
    "DCGM_FI_DEV_XID_ERRORS",
}


def test_dcgm_compat_names_labels_and_units(fake: FakeProvider) -> None:
    registry, _ = registry_of({"gpu": GpuCollector(make_context(fake, dcgm_compat=True))})
    samples = scrape(registry)
    exported = {n for n in names(samples) if n.startswith("DCGM_")}
    assert exported >= ISSUE_DCGM_NAMES
    assert exported == set(dcgm.NAMES)
    labels = {
        "gpu": "2",
        "UUID": fake.identity(2).uuid,
        "modelName": "NVIDIA H100 80GB HBM3",
        "hostname": "gpu-node-07",
        "device": "nvidia2",
        "pci_bus_id": "00000000:38:00.0",
        "DCGM_FI_DRIVER_VERSION": "550.90.07",
    }
    assert one(samples, "DCGM_FI_DEV_FB_USED", **labels) == 52_000 + 2 * 1024  # MiB
    assert one(samples, "DCGM_FI_DEV_GPU_UTIL", **labels) == pytest.approx(70.0)  # percent
    assert one(samples, "DCGM_FI_DEV_SM_CLOCK", **labels) == pytest.approx(1950.0)  # MHz
    assert one(samples, "DCGM_FI_DEV_POWER_USAGE", **labels) == pytest.approx(475.5)  # W
    assert one(samples, "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", **labels) == 1.252e12  # mJ
    assert one(samples, "DCGM_FI_DEV_GPU_TEMP", **labels) == 60.0


def test_dcgm_names_are_absent_without_the_flag(fake: FakeProvider) -> None:
    registry, _ = registry_of({"gpu": GpuCollector(make_context(fake))})
    assert not {n for n in names(scrape(registry)) if n.startswith("DCGM_")}


def test_unsupported_readings_are_left_out_not_zero() -> None:
    from tests.exporters.conftest import StaticProcesses
    from trainguard.exporters.simulated import SimulatedProvider

    provider = SimulatedProvider(2, StaticProcesses())
    registry, _ = registry_of({"gpu": GpuCollector(make_context(provider))})  # type: ignore[arg-type]
    samples = scrape(registry)
    assert len(values(samples, contract.GPU_TEMPERATURE.name)) == 2
    assert not values(samples, contract.GPU_ECC_ERRORS.name)  # the simulation has no ECC
    assert not values(samples, contract.GPU_CLOCK_THROTTLED.name)
