"""The ``gpu_process`` collector: which training rank runs on which GPU.

NVML lists the compute processes of each GPU; their environments (``/proc/<pid>/environ``) say
which torchrun rank they are. ``trainguard_gpu_process_info{gpu,uuid,job_id,rank,local_rank}``
is 1 for each rank with processes on the GPU, so a GPU series joins its rank's series in PromQL,
e.g. ``trainguard_gpu_temperature_celsius * on(node, gpu) group_left(rank, job_id)
trainguard_gpu_process_info{rank!=""}``.

There is one series per GPU, job and rank, whatever the number of processes: a rank with a
second CUDA process (a helper it forked, or the old process of a restart still exiting) keeps
one series, so the join above keeps matching one series per GPU, and a restarted rank keeps its
series rather than starting a new one per pid. Processes that are not torchrun ranks (or whose
environment is unreadable) share one series per GPU with empty rank labels; the join leaves them
out with ``{rank!=""}``. The exporter must see the host's PID namespace (``hostPID: true`` in
Kubernetes) for NVML's pids to match ``/proc``.
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
        seen: set[tuple[str, ...]] = set()
        for sample in samples:
            for pid in sample.process_ids:
                proc = ranks.get(pid)
                labels = (
                    str(sample.identity.index),
                    sample.identity.uuid,
                    proc.job_id if proc else "",
                    proc.rank if proc else "",
                    proc.local_rank if proc else "",
                )
                if labels not in seen:
                    seen.add(labels)
                    family.add_metric(list(labels), {})
        yield family

    def close(self) -> None:
        """Nothing of its own to release."""


@register("gpu_process", "Map the processes on each GPU to their torchrun rank and job id.")
def _factory(context: ExporterContext) -> GpuProcessCollector:
    return GpuProcessCollector(context)
