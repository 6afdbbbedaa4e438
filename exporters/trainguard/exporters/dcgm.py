"""dcgm-exporter's default names and labels, for dashboards written for dcgm-exporter.

With ``--dcgm-compat`` the gpu collector also exports the fields of dcgm-exporter's
``default-counters.csv`` that NVML can supply, in dcgm-exporter's units (MHz, MiB, W, mJ, %)
and with its labels (``gpu``, ``UUID``, ``pci_bus_id``, ``device``, ``modelName``,
``Hostname``). Every field is exported as a gauge under its exact name, so PromQL written for
dcgm-exporter (``rate()`` over the counters included) works unchanged.

Fields of the default list with no NVML source, never exported here:
``DCGM_FI_PROF_GR_ENGINE_ACTIVE``, ``DCGM_FI_PROF_PIPE_TENSOR_ACTIVE``,
``DCGM_FI_PROF_DRAM_ACTIVE`` (DCGM's profiling module reads hardware performance counters
NVML does not expose), ``DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL`` (DCGM's own aggregation of
per-lane counters; NVML's data-throughput fields count something else and are exported as
``trainguard_gpu_nvlink_bytes_total`` instead) and ``DCGM_FI_DEV_VGPU_LICENSE_STATUS`` (vGPU
only).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence

from prometheus_client.core import GaugeMetricFamily

from trainguard.exporters.provider import GpuSample, XidCount

LABELS = ("gpu", "UUID", "pci_bus_id", "device", "modelName", "Hostname")
_MIB = 1024 * 1024


def _percent(value: float | None) -> float | None:
    return None if value is None else value * 100.0


def _mhz(value: float | None) -> float | None:
    return None if value is None else value / 1e6


def _flag(value: bool | None) -> float | None:
    return None if value is None else float(value)


Field = tuple[str, str, Callable[[GpuSample], float | None]]

FIELDS: tuple[Field, ...] = (
    ("DCGM_FI_DEV_SM_CLOCK", "SM clock frequency (in MHz).", lambda s: _mhz(s.sm_clock_hertz)),
    (
        "DCGM_FI_DEV_MEM_CLOCK",
        "Memory clock frequency (in MHz).",
        lambda s: _mhz(s.memory_clock_hertz),
    ),
    (
        "DCGM_FI_DEV_MEMORY_TEMP",
        "Memory temperature (in C).",
        lambda s: s.memory_temperature_celsius,
    ),
    ("DCGM_FI_DEV_GPU_TEMP", "GPU temperature (in C).", lambda s: s.temperature_celsius),
    ("DCGM_FI_DEV_POWER_USAGE", "Power draw (in W).", lambda s: s.power_watts),
    (
        "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
        "Total energy consumption since boot (in mJ).",
        lambda s: None if s.energy_joules is None else s.energy_joules * 1000.0,
    ),
    (
        "DCGM_FI_DEV_PCIE_REPLAY_COUNTER",
        "Total number of PCIe retries.",
        lambda s: None if s.pcie_replay_total is None else float(s.pcie_replay_total),
    ),
    ("DCGM_FI_DEV_GPU_UTIL", "GPU utilization (in %).", lambda s: _percent(s.utilization_ratio)),
    (
        "DCGM_FI_DEV_MEM_COPY_UTIL",
        "Memory utilization (in %).",
        lambda s: _percent(s.memory_copy_utilization_ratio),
    ),
    (
        "DCGM_FI_DEV_ENC_UTIL",
        "Encoder utilization (in %).",
        lambda s: _percent(s.encoder_utilization_ratio),
    ),
    (
        "DCGM_FI_DEV_DEC_UTIL",
        "Decoder utilization (in %).",
        lambda s: _percent(s.decoder_utilization_ratio),
    ),
    (
        "DCGM_FI_DEV_FB_FREE",
        "Frame buffer memory free (in MiB).",
        lambda s: (s.memory_total_bytes - s.memory_used_bytes) / _MIB,
    ),
    (
        "DCGM_FI_DEV_FB_USED",
        "Frame buffer memory used (in MiB).",
        lambda s: s.memory_used_bytes / _MIB,
    ),
    (
        "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS",
        "Number of remapped rows for uncorrectable errors.",
        lambda s: (
            None if s.remapped_rows_uncorrectable is None else float(s.remapped_rows_uncorrectable)
        ),
    ),
    (
        "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS",
        "Number of remapped rows for correctable errors.",
        lambda s: (
            None if s.remapped_rows_correctable is None else float(s.remapped_rows_correctable)
        ),
    ),
    (
        "DCGM_FI_DEV_ROW_REMAP_FAILURE",
        "Whether remapping of rows has failed.",
        lambda s: _flag(s.remapped_rows_failure),
    ),
    (
        "DCGM_FI_PROF_PCIE_TX_BYTES",
        "The rate of data transmitted over the PCIe bus - including both protocol headers and "
        "data payloads - in bytes per second.",
        lambda s: s.pcie_tx_bytes_per_second,
    ),
    (
        "DCGM_FI_PROF_PCIE_RX_BYTES",
        "The rate of data received over the PCIe bus - including both protocol headers and "
        "data payloads - in bytes per second.",
        lambda s: s.pcie_rx_bytes_per_second,
    ),
)
XID_FIELD = "DCGM_FI_DEV_XID_ERRORS"
XID_HELP = "Value of the last XID error encountered."
NAMES: tuple[str, ...] = (*(name for name, _, _ in FIELDS), XID_FIELD)


def families() -> Iterator[GaugeMetricFamily]:
    for name, documentation, _ in FIELDS:
        yield GaugeMetricFamily(name, documentation, labels=LABELS)
    yield GaugeMetricFamily(XID_FIELD, XID_HELP, labels=LABELS)


def render(
    samples: Sequence[GpuSample], xids: Sequence[XidCount], hostname: str
) -> Iterator[GaugeMetricFamily]:
    """dcgm-exporter's families for GPUs that answered this scrape."""
    labels = {
        s.identity.index: [
            str(s.identity.index),
            s.identity.uuid,
            s.identity.pci_bus_id,
            f"nvidia{s.identity.index}",
            s.identity.name,
            hostname,
        ]
        for s in samples
    }
    for name, documentation, read in FIELDS:
        family = GaugeMetricFamily(name, documentation, labels=LABELS)
        for sample in samples:
            value = read(sample)
            if value is not None:
                family.add_metric(labels[sample.identity.index], value)
        yield family
    latest: dict[int, XidCount] = {}
    for xid in xids:
        if xid.index not in latest or xid.last_seen >= latest[xid.index].last_seen:
            latest[xid.index] = xid
    family = GaugeMetricFamily(XID_FIELD, XID_HELP, labels=LABELS)
    for index, gpu_labels in labels.items():
        family.add_metric(gpu_labels, float(latest[index].xid) if index in latest else 0.0)
    yield family
