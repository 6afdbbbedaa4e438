"""The ``gpu`` collector: per-GPU readings from the GPU provider, Xid errors, NVML health.

Every GPU series is labelled ``gpu`` (index), ``uuid`` and ``name`` (model). A reading a GPU
does not support is left out for that GPU rather than exported as 0. When the provider cannot
answer at all, ``trainguard_nvml_up 0`` is still exported and the collector fails; a GPU lost
mid-run gets ``trainguard_gpu_up 0`` and the other GPUs are exported as usual. A provider that
reads no NVML (the simulated one) gets no ``trainguard_nvml_up`` at all: a 1 there would claim
an NVML that was never asked.

Remapped rows are two kinds of thing, kept in separate families so that sums mean something:
row counts (``trainguard_gpu_remapped_rows{kind=correctable|uncorrectable}``) and 0/1 states
(``trainguard_gpu_row_remap_pending``, ``trainguard_gpu_row_remap_failure``).

Xid errors (``trainguard_gpu_xid_errors_total{xid}``) are the driver's error codes, counted
since the exporter started. The ones seen most in training clusters: 13 graphics engine
exception, 31 GPU memory page fault, 43 GPU stopped processing (a user application fault),
45 preemptive cleanup after a previous error, 48 double-bit ECC error, 61/62 internal
micro-controller breakpoint/halt, 63/64 ECC page retirement or row remapping recorded/failed,
74 NVLink error, 79 GPU has fallen off the bus, 92 high single-bit ECC rate, 94/95
contained/uncontained ECC error, 119/120 GSP timeout/error. 48, 79, 95 and 64 mean the node
needs draining; 13, 31 and 43 usually point at the application.

With ``--dcgm-compat`` the same readings are also exported under dcgm-exporter's default names
and labels (``trainguard.exporters.dcgm``).
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.metrics_core import Metric

from trainguard import contract
from trainguard.exporters import dcgm
from trainguard.exporters.provider import GpuFailure, GpuIdentity, GpuSample, ThrottleReason
from trainguard.exporters.registry import ExporterContext, register
from trainguard.prometheus_families import counter_family, gauge_family

_COUNTERS = (
    contract.GPU_ENERGY,
    contract.GPU_ECC_ERRORS,
    contract.GPU_NVLINK_BYTES,
    contract.GPU_XID_ERRORS,
)
_GAUGES = (
    contract.GPU_UP,
    contract.GPU_UTILIZATION,
    contract.GPU_MEMORY_USED,
    contract.GPU_MEMORY_RESERVED,
    contract.GPU_MEMORY_TOTAL,
    contract.GPU_TEMPERATURE,
    contract.GPU_POWER,
    contract.GPU_SM_CLOCK,
    contract.GPU_MEMORY_CLOCK,
    contract.GPU_CLOCK_THROTTLED,
    contract.GPU_REMAPPED_ROWS,
    contract.GPU_ROW_REMAP_PENDING,
    contract.GPU_ROW_REMAP_FAILURE,
    contract.GPU_PCIE_THROUGHPUT,
)


def _labels(identity: GpuIdentity) -> list[str]:
    return [str(identity.index), identity.uuid, identity.name]


class GpuCollector:
    def __init__(self, context: ExporterContext) -> None:
        self._context = context

    def _families(self) -> dict[str, GaugeMetricFamily | CounterMetricFamily]:
        families: dict[str, GaugeMetricFamily | CounterMetricFamily] = {
            spec.name: counter_family(spec) for spec in _COUNTERS
        }
        families.update({spec.name: gauge_family(spec) for spec in _GAUGES})
        return families

    def describe(self) -> Iterator[Metric]:
        if self._context.provider.reads_nvml:
            yield gauge_family(contract.NVML_UP)
        yield from self._families().values()
        if self._context.settings.dcgm_compat:
            yield from dcgm.families()

    def collect(self) -> Iterator[Metric]:
        reads_nvml = self._context.provider.reads_nvml
        up = gauge_family(contract.NVML_UP)
        try:
            results = self._context.gpu_samples()
        except Exception:
            if reads_nvml:
                up.add_metric([], 0.0)
                yield up
            raise
        if reads_nvml:
            up.add_metric([], 1.0)
            yield up
        families = self._families()
        identities = dict(self._context.provider.identities())
        samples: list[GpuSample] = []
        for result in results:
            if isinstance(result, GpuFailure):
                identity = identities.get(
                    result.index, GpuIdentity(result.index, uuid="", name="", pci_bus_id="")
                )
                families[contract.GPU_UP.name].add_metric(_labels(identity), 0.0)
            else:
                samples.append(result)
                identities[result.identity.index] = result.identity
                families[contract.GPU_UP.name].add_metric(_labels(result.identity), 1.0)
                self._add_sample(families, result)
        xids = self._context.provider.xid_counts()
        for xid in xids:
            identity = identities.get(xid.index, GpuIdentity(xid.index, "", "", ""))
            families[contract.GPU_XID_ERRORS.name].add_metric(
                [*_labels(identity), str(xid.xid)], float(xid.count)
            )
        yield from families.values()
        if self._context.settings.dcgm_compat:
            yield from dcgm.render(samples, xids, self._context.settings.hostname)

    @staticmethod
    def _add_sample(
        families: dict[str, GaugeMetricFamily | CounterMetricFamily], sample: GpuSample
    ) -> None:
        labels = _labels(sample.identity)

        def put(spec: contract.MetricSpec, value: float | None, *extra: str) -> None:
            if value is not None:
                families[spec.name].add_metric([*labels, *extra], float(value))

        put(contract.GPU_UTILIZATION, sample.utilization_ratio)
        put(contract.GPU_MEMORY_USED, sample.memory_used_bytes)
        put(contract.GPU_MEMORY_RESERVED, sample.memory_reserved_bytes)
        put(contract.GPU_MEMORY_TOTAL, sample.memory_total_bytes)
        put(contract.GPU_TEMPERATURE, sample.temperature_celsius)
        put(contract.GPU_POWER, sample.power_watts)
        put(contract.GPU_ENERGY, sample.energy_joules)
        put(contract.GPU_SM_CLOCK, sample.sm_clock_hertz)
        put(contract.GPU_MEMORY_CLOCK, sample.memory_clock_hertz)
        if sample.throttle_reasons is not None:
            for reason in ThrottleReason:
                put(
                    contract.GPU_CLOCK_THROTTLED,
                    float(reason in sample.throttle_reasons),
                    reason.value,
                )
        put(contract.GPU_ECC_ERRORS, sample.ecc_corrected_total, "corrected")
        put(contract.GPU_ECC_ERRORS, sample.ecc_uncorrected_total, "uncorrected")
        put(contract.GPU_REMAPPED_ROWS, sample.remapped_rows_correctable, "correctable")
        put(contract.GPU_REMAPPED_ROWS, sample.remapped_rows_uncorrectable, "uncorrectable")
        put(contract.GPU_ROW_REMAP_PENDING, sample.remapped_rows_pending)
        put(contract.GPU_ROW_REMAP_FAILURE, sample.remapped_rows_failure)
        put(contract.GPU_PCIE_THROUGHPUT, sample.pcie_tx_bytes_per_second, "tx")
        put(contract.GPU_PCIE_THROUGHPUT, sample.pcie_rx_bytes_per_second, "rx")
        put(contract.GPU_NVLINK_BYTES, sample.nvlink_tx_bytes_total, "tx")
        put(contract.GPU_NVLINK_BYTES, sample.nvlink_rx_bytes_total, "rx")

    def close(self) -> None:
        """The provider is shared with other collectors; the exporter closes it."""


@register(
    contract.EXPORTER_COLLECTOR_GPU,
    "GPU readings through the GPU provider (NVML), Xid errors, trainguard_nvml_up.",
)
def _factory(context: ExporterContext) -> GpuCollector:
    return GpuCollector(context)
