"""The ``nccl`` collector: NCCL debug logs followed like ``tail -F``.

Files matching ``--nccl.log-glob`` (set ``NCCL_DEBUG=INFO`` and
``NCCL_DEBUG_FILE=/var/log/nccl/%h.%p.log`` in the training job to produce them) are read from
their start, in a child process so a scrape never waits on a large file
(``trainguard.exporters.nccl_follow``). Exported: ``trainguard_nccl_info`` per communicator and
rank, ``trainguard_nccl_log_errors_total{kind}`` (every kind, from 0) and the follower's own
health.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, InfoMetricFamily
from prometheus_client.metrics_core import Metric

from trainguard import contract
from trainguard.exporters.nccl_follow import (
    ChildProcessSource,
    PollingSource,
    SnapshotSource,
)
from trainguard.exporters.nccl_log import LogFollower, NcclLogState
from trainguard.exporters.registry import ExporterContext, register
from trainguard.prometheus_families import counter_family, gauge_family, info_family


class NcclCollector:
    def __init__(self, source: SnapshotSource) -> None:
        self.source = source

    @staticmethod
    def _families() -> tuple[
        InfoMetricFamily,
        CounterMetricFamily,
        GaugeMetricFamily,
        CounterMetricFamily,
        CounterMetricFamily,
    ]:
        return (
            info_family(contract.NCCL_INFO),
            counter_family(contract.NCCL_LOG_ERRORS),
            gauge_family(contract.NCCL_LOG_FILES),
            counter_family(contract.NCCL_LOG_BYTES),
            counter_family(contract.NCCL_LOG_LINES_DROPPED),
        )

    def describe(self) -> Iterator[Metric]:
        yield from self._families()

    def collect(self) -> Iterator[Metric]:
        snapshot = self.source.snapshot()
        info, errors, files, read, dropped = self._families()
        for comm in snapshot.communicators:
            info.add_metric(
                [
                    comm.version,
                    comm.transport,
                    comm.network,
                    comm.interface,
                    str(comm.nranks),
                    str(comm.channels),
                    str(comm.trees),
                    comm.comm_id,
                    str(comm.rank),
                ],
                {},
            )
        for kind in contract.NcclErrorKind:
            errors.add_metric([kind.value], float(snapshot.errors.get(kind, 0)))
        files.add_metric([], float(snapshot.files))
        read.add_metric([], float(snapshot.bytes_read))
        dropped.add_metric([], float(snapshot.lines_dropped))
        yield from (info, errors, files, read, dropped)

    def close(self) -> None:
        self.source.close()


@register("nccl", "Follow NCCL debug files (--nccl.log-glob): versions, transports, warnings.")
def _factory(context: ExporterContext) -> NcclCollector:
    settings = context.settings
    source: SnapshotSource
    if settings.nccl_poll_seconds is None:
        source = PollingSource(LogFollower(settings.nccl_log_globs, NcclLogState()))
    else:
        source = ChildProcessSource(settings.nccl_log_globs, settings.nccl_poll_seconds)
    return NcclCollector(source)
