"""The ``nccl_config`` collector: lint of the training processes' NCCL settings on this node.

``trainguard_nccl_config_warnings{check}`` is 1 while at least one training process fails the
check and 0 otherwise (every check is always exported); ``trainguard_nccl_config_check_info``
gives each check's runbook link. Findings are recomputed at most once per process-scan period,
since asking each rank for its latency takes an HTTP request.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import GaugeMetricFamily, InfoMetricFamily
from prometheus_client.metrics_core import Metric

from trainguard import contract
from trainguard.exporters.nccl_lint import (
    RUNBOOK_URLS,
    Check,
    Finding,
    LatencySource,
    RankMetricsLatency,
    lint,
)
from trainguard.exporters.registry import ExporterContext, TtlCache, register
from trainguard.prometheus_families import gauge_family, info_family


class NcclConfigCollector:
    def __init__(self, context: ExporterContext, latencies: LatencySource | None) -> None:
        self._context = context
        self._latencies = latencies
        self._findings = TtlCache(self._lint, ttl=context.settings.process_scan_ttl_seconds)

    def _lint(self) -> tuple[int, list[Finding]]:
        scan = self._context.process_scan()
        return len(scan.processes), lint(
            scan.processes, self._context.host.facts(), self._latencies
        )

    def _families(self) -> tuple[GaugeMetricFamily, GaugeMetricFamily, InfoMetricFamily]:
        return (
            gauge_family(contract.NCCL_CONFIG_WARNINGS),
            gauge_family(contract.NCCL_CONFIG_PROCESSES),
            info_family(contract.NCCL_CONFIG_CHECK_INFO),
        )

    def describe(self) -> Iterator[Metric]:
        yield from self._families()

    def collect(self) -> Iterator[Metric]:
        count, findings = self._findings.get()
        failing = {f.check for f in findings}
        warnings, processes, info = self._families()
        for check in Check:
            warnings.add_metric([check.value], float(check in failing))
            info.add_metric([check.value, RUNBOOK_URLS[check]], {})
        processes.add_metric([], float(count))
        yield from (warnings, processes, info)

    def close(self) -> None:
        """Nothing of its own to release."""


@register("nccl_config", "Lint NCCL / TORCH_NCCL_* / TORCH_FR_* settings of local training ranks.")
def _factory(context: ExporterContext) -> NcclConfigCollector:
    return NcclConfigCollector(context, RankMetricsLatency())
