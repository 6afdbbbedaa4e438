"""The ``slurm_job`` collector: which Slurm job (and step) runs on each GPU of the node.

For every compute process NVML lists on a GPU, the job and step come from the process's cgroup
(slurmd's cgroup v1 or v2 layout), else from ``SLURM_JOB_ID`` / ``SLURM_STEP_ID`` in its
environment (:mod:`trainguard.exporters.slurm`).
``trainguard_gpu_slurm_job_info{gpu,uuid,slurm_job_id,slurm_step_id}`` is 1 for each GPU, job
and step, so GPU series join the job's rank series through ``slurm_job_id``
(``trainguard_rank_info`` carries it) or a job's GPUs are listed with
``trainguard_gpu_slurm_job_info{slurm_job_id="4242"}``.
``trainguard_gpu_slurm_unmapped_processes`` counts GPU processes that no job claims: on a
Slurm node, a process left over from a finished job, or started outside Slurm.

Off by default (a node without Slurm would count every GPU process as unmapped): turn it on
with ``--collector.slurm_job`` or ``TRAINGUARD_EXPORTER_COLLECTOR_SLURM_JOB=1``, as
``deploy/slurm/`` does. The exporter must see the host's PID namespace, as for ``gpu_process``.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import GaugeMetricFamily, InfoMetricFamily
from prometheus_client.metrics_core import Metric

from trainguard import contract
from trainguard.exporters.procs import ProcessFiles
from trainguard.exporters.provider import GpuSample
from trainguard.exporters.registry import ExporterContext, register
from trainguard.exporters.slurm import slurm_step_of
from trainguard.prometheus_families import gauge_family, info_family


def _families() -> tuple[InfoMetricFamily, GaugeMetricFamily]:
    return (
        info_family(contract.GPU_SLURM_JOB_INFO),
        gauge_family(contract.GPU_SLURM_UNMAPPED_PROCESSES),
    )


class ScannedEnvironments:
    """:class:`ProcessFiles` for a process source that is not ``/proc`` (a made-up one in
    tests and benchmarks): the environments of the training processes it lists, no cgroups."""

    def __init__(self, context: ExporterContext) -> None:
        self._context = context

    def cgroup(self, pid: int) -> str | None:
        return None

    def environ(self, pid: int) -> dict[str, str] | None:
        for process in self._context.process_scan().processes:
            if process.pid == pid:
                return dict(process.environ)
        return None


class SlurmJobCollector:
    def __init__(self, context: ExporterContext, files: ProcessFiles) -> None:
        self._context = context
        self._files = files

    def describe(self) -> Iterator[Metric]:
        yield from _families()

    def collect(self) -> Iterator[Metric]:
        samples = [s for s in self._context.gpu_samples() if isinstance(s, GpuSample)]
        info, unmapped = _families()
        seen: set[tuple[str, str, str, str]] = set()
        unclaimed = 0
        for sample in samples:
            for pid in sample.process_ids:
                step = slurm_step_of(pid, self._files)
                if step is None:
                    unclaimed += 1
                    continue
                labels = (
                    str(sample.identity.index),
                    sample.identity.uuid,
                    step.job_id,
                    step.step_id,
                )
                if labels not in seen:  # the ranks of one step sharing a GPU: one series
                    seen.add(labels)
                    info.add_metric(list(labels), {})
        unmapped.add_metric([], float(unclaimed))
        yield info
        yield unmapped

    def close(self) -> None:
        """Nothing of its own to release."""


@register(
    "slurm_job",
    "Map the processes on each GPU to their Slurm job and step (cgroup, else environment).",
    enabled_by_default=False,
)
def _factory(context: ExporterContext) -> SlurmJobCollector:
    # The exporter's own source is /proc (from --proc-root) and reads any process's files;
    # another source knows only the environments it lists.
    processes = context.processes
    files = processes if isinstance(processes, ProcessFiles) else ScannedEnvironments(context)
    return SlurmJobCollector(context, files)
