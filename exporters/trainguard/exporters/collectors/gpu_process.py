"""The ``gpu_process`` collector: which training rank runs on which GPU.

NVML lists the compute processes of each GPU; their environments (``/proc/<pid>/environ``) say
which torchrun rank they are. ``trainguard_gpu_process_info{gpu,uuid,pid,job_id,rank,local_rank}``
is 1 for each, so a GPU series joins its rank's series in PromQL, e.g.
``trainguard_gpu_temperature_celsius * on(gpu) group_left(rank, job_id)
trainguard_gpu_process_info``. A process that is not a torchrun rank (or whose environment is
unreadable) is listed with empty rank labels. The exporter must see the host's PID namespace
(``hostPID: true`` in Kubernetes) for NVML's pids to match ``/proc``.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import InfoMetricFamily
from prometheus_client.metrics_core import Metric

from trainguard import contract
from trainguard.exporters.provider import GpuSample
from trainguard.exporters.registry import ExporterContext, register
from trainguard.prometheus_families import info_family


def _family() -> InfoMetricFamily:
    return info_family(contract.GPU_PROCESS_INFO)


class GpuProcessCollector:
    def __init__(self, context: ExporterContext) -> None:
        self._context = context

    def describe(self) -> Iterator[Metric]:
        yield _family()

    def collect(self) -> Iterator[Metric]:
        samples = [s for s in self._context.gpu_samples() if isinstance(s, GpuSample)]
        ranks = {p.pid: p for p in self._context.process_scan().processes}
        family = _family()
        for sample in samples:
            for pid in sample.process_ids:
                proc = ranks.get(pid)
                family.add_metric(
                    [
                        str(sample.identity.index),
                        sample.identity.uuid,
                        str(pid),
                        proc.job_id if proc else "",
                        proc.rank if proc else "",
                        proc.local_rank if proc else "",
                    ],
                    {},
                )
        yield family

    def close(self) -> None:
        """Nothing of its own to release."""


@register("gpu_process", "Map the processes on each GPU to their torchrun rank and job id.")
def _factory(context: ExporterContext) -> GpuProcessCollector:
    return GpuProcessCollector(context)
