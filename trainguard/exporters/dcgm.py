"""dcgm-exporter's names and labels, for dashboards and rules written for dcgm-exporter 4.x.

With ``--dcgm-compat`` the gpu collector also exports, under dcgm-exporter's exact names, in its
units (MHz, MiB, W, mJ, %, ratios) and with its labels, the fields of its default counters
(``etc/default-counters.csv`` of release 4.5.3-4.8.2) that NVML can supply, and the profiling
fields NVML's GPU Performance Monitoring (GPM) has an equivalent for. Every field is a gauge
under its exact name, so PromQL written for dcgm-exporter (``rate()`` over its counters
included) works unchanged.

Labels, in dcgm-exporter's order: ``gpu``, ``UUID``, ``pci_bus_id``, ``device`` (``nvidiaN``),
``modelName``, ``hostname``, then ``DCGM_FI_DRIVER_VERSION`` (dcgm-exporter turns the default
list's one ``label`` field into a label of that name on every series of the GPU), and on
``DCGM_FI_DEV_XID_ERRORS`` ``err_code`` and ``err_msg``. The host label is ``hostname`` as
dcgm-exporter's main branch writes it since its commit d5e5f51 (#655); its releases up to
4.5.3-4.8.2 wrote ``Hostname``. docs/exporter.md has the table of every default field (emitted,
from what, or why not) and the relabelling that gives old dashboards their ``Hostname``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

from prometheus_client.core import GaugeMetricFamily

from trainguard.exporters.provider import GpuIdentity, GpuSample, XidCount

HOSTNAME_LABEL = "hostname"
DRIVER_VERSION_LABEL = "DCGM_FI_DRIVER_VERSION"
LABELS = ("gpu", "UUID", "pci_bus_id", "device", "modelName", HOSTNAME_LABEL, DRIVER_VERSION_LABEL)
XID_LABELS = (*LABELS, "err_code", "err_msg")
_MIB = 1024 * 1024


def _percent(value: float | None) -> float | None:
    return None if value is None else value * 100.0


def _mhz(value: float | None) -> float | None:
    return None if value is None else value / 1e6


def _mib(value: int | None) -> float | None:
    return None if value is None else value / _MIB


def _number(value: int | bool | None) -> float | None:
    return None if value is None else float(value)


@dataclass(frozen=True)
class Field:
    """One dcgm-exporter field: its name, help text and how a sample gives its value."""

    name: str
    documentation: str
    read: Callable[[GpuSample], float | None]


FIELDS: tuple[Field, ...] = (
    Field("DCGM_FI_DEV_SM_CLOCK", "SM clock frequency (in MHz).", lambda s: _mhz(s.sm_clock_hertz)),
    Field(
        "DCGM_FI_DEV_MEM_CLOCK",
        "Memory clock frequency (in MHz).",
        lambda s: _mhz(s.memory_clock_hertz),
    ),
    Field(
        "DCGM_FI_DEV_MEMORY_TEMP",
        "Memory temperature (in C).",
        lambda s: s.memory_temperature_celsius,
    ),
    Field("DCGM_FI_DEV_GPU_TEMP", "GPU temperature (in C).", lambda s: s.temperature_celsius),
    Field("DCGM_FI_DEV_POWER_USAGE", "Power draw (in W).", lambda s: s.power_watts),
    Field(
        "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
        "Total energy consumption since boot (in mJ).",
        lambda s: None if s.energy_joules is None else s.energy_joules * 1000.0,
    ),
    Field(
        "DCGM_FI_DEV_PCIE_REPLAY_COUNTER",
        "Total number of PCIe retries.",
        lambda s: _number(s.pcie_replay_total),
    ),
    Field(
        "DCGM_FI_DEV_GPU_UTIL", "GPU utilization (in %).", lambda s: _percent(s.utilization_ratio)
    ),
    Field(
        "DCGM_FI_DEV_MEM_COPY_UTIL",
        "Memory utilization (in %).",
        lambda s: _percent(s.memory_copy_utilization_ratio),
    ),
    Field(
        "DCGM_FI_DEV_ENC_UTIL",
        "Encoder utilization (in %).",
        lambda s: _percent(s.encoder_utilization_ratio),
    ),
    Field(
        "DCGM_FI_DEV_DEC_UTIL",
        "Decoder utilization (in %).",
        lambda s: _percent(s.decoder_utilization_ratio),
    ),
    Field(
        "DCGM_FI_DEV_FB_FREE",
        "Framebuffer memory free (in MiB).",
        lambda s: _mib(s.memory_free_bytes),
    ),
    Field(
        "DCGM_FI_DEV_FB_USED",
        "Framebuffer memory used (in MiB).",
        lambda s: _mib(s.memory_used_bytes),
    ),
    Field(
        "DCGM_FI_DEV_FB_RESERVED",
        "Framebuffer memory reserved (in MiB).",
        lambda s: _mib(s.memory_reserved_bytes),
    ),
    Field(
        "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS",
        "Number of remapped rows for uncorrectable errors",
        lambda s: _number(s.remapped_rows_uncorrectable),
    ),
    Field(
        "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS",
        "Number of remapped rows for correctable errors",
        lambda s: _number(s.remapped_rows_correctable),
    ),
    Field(
        "DCGM_FI_DEV_ROW_REMAP_FAILURE",
        "Whether remapping of rows has failed",
        lambda s: _number(s.remapped_rows_failure),
    ),
    Field(
        "DCGM_FI_PROF_GR_ENGINE_ACTIVE",
        "Ratio of time the graphics engine is active.",
        lambda s: s.activity.graphics_active,
    ),
    Field(
        "DCGM_FI_PROF_SM_ACTIVE",
        "The ratio of cycles an SM has at least 1 warp assigned.",
        lambda s: s.activity.sm_active,
    ),
    Field(
        "DCGM_FI_PROF_SM_OCCUPANCY",
        "The ratio of number of warps resident on an SM.",
        lambda s: s.activity.sm_occupancy,
    ),
    Field(
        "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE",
        "Ratio of cycles the tensor (HMMA) pipe is active.",
        lambda s: s.activity.tensor_active,
    ),
    Field(
        "DCGM_FI_PROF_DRAM_ACTIVE",
        "Ratio of cycles the device memory interface is active sending or receiving data.",
        lambda s: s.activity.dram_active,
    ),
    Field(
        "DCGM_FI_PROF_PIPE_FP64_ACTIVE",
        "Ratio of cycles the fp64 pipes are active.",
        lambda s: s.activity.fp64_active,
    ),
    Field(
        "DCGM_FI_PROF_PIPE_FP32_ACTIVE",
        "Ratio of cycles the fp32 pipes are active.",
        lambda s: s.activity.fp32_active,
    ),
    Field(
        "DCGM_FI_PROF_PIPE_FP16_ACTIVE",
        "Ratio of cycles the fp16 pipes are active.",
        lambda s: s.activity.fp16_active,
    ),
    Field(
        "DCGM_FI_PROF_PCIE_TX_BYTES",
        "The rate of data transmitted over the PCIe bus - including both protocol headers and "
        "data payloads - in bytes per second.",
        lambda s: s.pcie_tx_bytes_per_second,
    ),
    Field(
        "DCGM_FI_PROF_PCIE_RX_BYTES",
        "The rate of data received over the PCIe bus - including both protocol headers and "
        "data payloads - in bytes per second.",
        lambda s: s.pcie_rx_bytes_per_second,
    ),
    Field(
        "DCGM_FI_PROF_NVLINK_TX_BYTES",
        "NVLink bytes sent per second over all links of the GPU.",
        lambda s: s.activity.nvlink_tx_bytes_per_second,
    ),
    Field(
        "DCGM_FI_PROF_NVLINK_RX_BYTES",
        "NVLink bytes received per second over all links of the GPU.",
        lambda s: s.activity.nvlink_rx_bytes_per_second,
    ),
)
XID_FIELD = "DCGM_FI_DEV_XID_ERRORS"
XID_HELP = "Value of the last XID error encountered."
NAMES: tuple[str, ...] = (*(f.name for f in FIELDS), XID_FIELD)

# dcgm-exporter's err_msg for each Xid it knows (internal/pkg/collector/xid_errors.go of
# release 4.5.3-4.8.2, itself after NVIDIA's Xid catalogue), grouped by message. Label values
# are an interface: rules match them exactly, so the wording is dcgm-exporter's, not ours.
_XID_MESSAGES: tuple[tuple[str, tuple[int, ...]], ...] = (
    ("No Error", (0,)),
    ("Invalid or corrupted push buffer stream", (1, 2, 3, 4, 6, 11, 32)),
    ("Unused", (5, 10, 14, 15, 17, 23, 39, 40, 41, 49, 50, 51, 52, 53, 55)),
    ("Invalid or corrupted push buffer address", (7,)),
    ("GPU stopped processing", (8, 43, 46)),
    ("Driver error programming GPU", (9,)),
    ("Driver error handling GPU exception", (12,)),
    ("Graphics Engine Exception", (13,)),
    ("Display engine hung", (16,)),
    ("Bus mastering disabled in PCI Config Space", (18,)),
    ("Display Engine error", (19, 56)),
    ("Invalid or corrupted Mpeg push buffer", (20,)),
    ("Invalid or corrupted Motion Estimation push buffer", (21,)),
    ("Invalid or corrupted Video Processor push buffer", (22,)),
    ("GPU semaphore timeout", (24,)),
    ("Invalid or illegal push buffer stream", (25,)),
    ("Framebuffer timeout", (26,)),
    ("Video processor exception", (27, 28, 29, 34, 35, 36, 42, 47, 60, 65)),
    ("GPU semaphore access error", (30,)),
    ("GPU memory page fault", (31,)),
    ("Internal micro-controller error", (33, 59)),
    ("Driver firmware error", (37, 38)),
    ("Graphics Engine fault during context switch", (44,)),
    (
        "Preemptive cleanup, due to previous errors -- Most likely to see when running "
        "multiple cuda",
        (45,),
    ),
    ("Double Bit ECC Error", (48,)),
    ("Auxiliary power is not connected to the GPU board", (54,)),
    ("Error programming video memory interface", (57,)),
    ("Unstable video memory interface detected", (58,)),
    ("Internal micro-controller breakpoint/warning", (61,)),
    ("Internal micro-controller halt", (62, 169)),
    ("ECC page retirement or row remapping recording event", (63,)),
    ("ECC page retirement or row remapper recording failure", (64,)),
    ("Illegal access by driver", (66, 67)),
    ("NVDEC0 Exception", (68,)),
    ("Graphics Engine class error", (69,)),
    ("NVENC2 Error", (73,)),
    ("NVLINK Error", (74,)),
    ("vGPU Start Error", (78,)),
    ("GPU has fallen off the bus", (79,)),
    ("Corrupted data sent to GPU", (80,)),
    ("VGA Subsystem Error", (81,)),
    ("OFA Exception", (86,)),
    ("Reserved", (87, 90, 91, 108)),
    ("High single-bit ECC error rate", (92,)),
    ("Non-fatal violation of provisioned InfoROM wear limit", (93,)),
    ("Contained ECC error", (94,)),
    ("Uncontained ECC error", (95,)),
    ("SMBPBI Test Message", (106,)),
    ("SMBPBI Test Message Silent", (107,)),
    ("Context Switch Timeout Error", (109,)),
    ("Security Fault Error", (110,)),
    ("Display Bundle Error Event", (111,)),
    ("Display Supervisor Error", (112,)),
    ("DP Link Training Error", (113,)),
    ("Display Pipeline Underflow Error", (114,)),
    ("Display Core Channel Error", (115,)),
    ("Display Window Channel Error", (116,)),
    ("Display Cursor Channel Error", (117,)),
    ("Display Pixel Pipeline Error", (118,)),
    ("GSP RPC Timeout", (119,)),
    ("GSP Error", (120,)),
    ("C2C Link Error", (121,)),
    ("SPI PMU RPC Read Failure", (122,)),
    ("SPI PMU RPC Write Failure", (123,)),
    ("SPI PMU RPC Erase Failure", (124,)),
    ("Inforom FS Failure", (125,)),
    ("ALI Training Fail", (136,)),
    ("NVLink Privilege Error", (137,)),
    ("Robust Channel DLA Error", (138,)),
    ("Robust Channel OFA1 Error", (139,)),
    ("Unrecovered ECC Error", (140,)),
    ("Robust Channel Fast Path Error", (141,)),
    ("Robust Channel NVENVC3 Error", (142,)),
    ("GPU Initialization Failure", (143,)),
    ("Robust Channel Key rotation Error", (151,)),
    ("Robust Channel DLA SMMU Error", (152,)),
    ("Robust Channel DLA timeout Error", (153,)),
    ("GPU Recovery Action Changed", (154,)),
    ("NVLINK: SW Defined Error", (155,)),
    ("Resource Retirement Event", (156,)),
    ("Resource Retirement Failure", (157,)),
    ("GPU Fatal Timeout", (158,)),
    ("Robust Channel CHI Non-Data Error", (159,)),
    ("Channel Retirement Event", (160,)),
    ("Channel Retirement Failure", (161,)),
    ("Power Smoothing HW Circuitry Reengaged", (162,)),
    ("Power Smoothing HW Circuitry Disengaged", (163,)),
    ("Power Smoothing HW Circuitry Low Lifetime", (164,)),
    ("Power Smoothing HW Circuitry Lifetime Exhausted", (165,)),
    ("NVLINK Secure Crypto Error", (166,)),
    ("PCIE Fatal Timeout", (167,)),
    ("Reduced GPU Memory Capacity (Errors found in write protection region)", (168,)),
    ("NVLINK: Interrupt seen in CC mode", (170,)),
    ("Uncorrectable DRAM Error", (171,)),
    ("Uncorrectable SRAM Error", (172,)),
)
# Families of codes dcgm-exporter names by a numbered unit: "<unit><n>: Unknown Error" for
# copy engines 3..9, "<unit><n> Error" for the video decoders and JPEG units, "Robust Channel
# CE<n> Error" for copy engines 10..19, "NVLINK: <unit> Error" for the NVLink units.
_XID_NUMBERED: tuple[tuple[str, tuple[tuple[int, str], ...]], ...] = (
    (
        "{}: Unknown Error",
        ((70, "CE3"), (71, "CE4"), (72, "CE5"), (75, "CE6"), (76, "CE7"), (77, "CE8"), (85, "CE9")),
    ),
    ("{} Error", ((82, "NVJPG0"), (83, "NVDEC1"), (84, "NVDEC2"), (88, "NVDEC3"), (89, "NVDEC4"))),
    ("{} Error", tuple((96 + n, f"NVDEC{5 + n}") for n in range(3))),
    ("{} Error", tuple((99 + n, f"NVJPG{1 + n}") for n in range(7))),
    ("Robust Channel {} Error", tuple((126 + n, f"CE{10 + n}") for n in range(10))),
    (
        "NVLINK: {} Error",
        tuple(
            zip(
                range(144, 151),
                ("Saw", "RLW", "TLW", "TREX", "NVLPW_CTRL", "NETIR", "MSE"),
                strict=True,
            )
        ),
    ),
)
UNKNOWN_XID_MESSAGE = "Unknown Error"
XID_MESSAGES: dict[int, str] = {
    **{code: message for message, codes in _XID_MESSAGES for code in codes},
    **{code: form.format(unit) for form, units in _XID_NUMBERED for code, unit in units},
}


def xid_message(code: int) -> str:
    """dcgm-exporter's ``err_msg`` for an Xid (``Unknown Error`` past its table)."""
    return XID_MESSAGES.get(code, UNKNOWN_XID_MESSAGE)


def families() -> Iterator[GaugeMetricFamily]:
    for field in FIELDS:
        yield GaugeMetricFamily(field.name, field.documentation, labels=LABELS)
    yield GaugeMetricFamily(XID_FIELD, XID_HELP, labels=XID_LABELS)


def _labels(identity: GpuIdentity, hostname: str) -> list[str]:
    return [
        str(identity.index),
        identity.uuid,
        identity.pci_bus_id,
        f"nvidia{identity.index}",
        identity.name,
        hostname,
        identity.driver_version,
    ]


def render(
    samples: Sequence[GpuSample], xids: Sequence[XidCount], hostname: str
) -> Iterator[GaugeMetricFamily]:
    """dcgm-exporter's families for the GPUs that answered this reading."""
    labels = {s.identity.index: _labels(s.identity, hostname) for s in samples}
    for field in FIELDS:
        family = GaugeMetricFamily(field.name, field.documentation, labels=LABELS)
        for sample in samples:
            value = field.read(sample)
            if value is not None:
                family.add_metric(labels[sample.identity.index], value)
        yield family
    latest: dict[int, XidCount] = {}
    for xid in xids:
        if xid.index not in latest or xid.last_seen >= latest[xid.index].last_seen:
            latest[xid.index] = xid
    family = GaugeMetricFamily(XID_FIELD, XID_HELP, labels=XID_LABELS)
    for index, gpu_labels in labels.items():
        code = latest[index].xid if index in latest else 0
        family.add_metric([*gpu_labels, str(code), xid_message(code)], float(code))
    yield family
