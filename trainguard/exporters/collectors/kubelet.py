"""The ``kubelet`` collector: which pod, namespace and container holds each GPU (Kubernetes).

At every sample it asks the kubelet's pod-resources API (``List``, over the unix socket named
by ``TRAINGUARD_POD_RESOURCES_SOCKET``, else ``/var/lib/kubelet/pod-resources/kubelet.sock``)
which devices each container was given, keeps NVIDIA's GPU and MIG resources, and exports
``trainguard_gpu_pod_info{gpu,uuid,pod,namespace,container,resource,device_id} 1`` for each,
joined to the GPU index and UUID the GPU provider reports. GPU series then carry their pod in
PromQL: ``trainguard_gpu_temperature_celsius * on(node, gpu) group_left(pod, namespace)
trainguard_gpu_pod_info``. It complements ``gpu_process`` (processes on each GPU, from /proc):
the kubelet knows the pod even before its process touches the GPU.

The call has a deadline (2 s, below the supervisor's collector timeout), so a kubelet that
never answers fails the collector (``trainguard_exporter_collector_success{collector="kubelet"}
0``) and the rest of the sample is served. A missing socket fails it the same way, with a
message saying what to mount.

On by default only where it can work: when ``TRAINGUARD_POD_RESOURCES_SOCKET`` is set (the
DaemonSet sets it) or the default socket exists when the exporter starts; ``--collector.kubelet``
/ ``--no-collector.kubelet`` decide otherwise.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from pathlib import Path

from prometheus_client.core import InfoMetricFamily
from prometheus_client.metrics_core import Metric

from trainguard import contract
from trainguard.exporters.podresources import DEFAULT_SOCKET
from trainguard.exporters.podresources.gpus import is_gpu_resource, resolve
from trainguard.exporters.provider import GpuIdentity, GpuSample, ProviderUnavailableError
from trainguard.exporters.registry import ExporterContext, register
from trainguard.prometheus_families import info_family

DEFAULT_TIMEOUT_SECONDS = 2.0


def socket_path(env: Mapping[str, str]) -> Path:
    """The pod-resources socket: the environment's choice, else the kubelet's default."""
    return Path(env.get(contract.ENV_POD_RESOURCES_SOCKET) or DEFAULT_SOCKET)


def enabled_by_default(env: Mapping[str, str], default_socket: Path = DEFAULT_SOCKET) -> bool:
    """On where it can work: the socket's path was given, or the default one exists."""
    return bool(env.get(contract.ENV_POD_RESOURCES_SOCKET)) or default_socket.exists()


def _family() -> InfoMetricFamily:
    return info_family(contract.GPU_POD_INFO)


class KubeletCollector:
    def __init__(
        self,
        context: ExporterContext,
        socket: Path,
        timeout_seconds: float = DEFAULT_TIMEOUT_SECONDS,
    ) -> None:
        self._context = context
        self._socket = socket
        self._timeout = timeout_seconds

    def describe(self) -> Iterator[Metric]:
        yield _family()

    def collect(self) -> Iterator[Metric]:
        # Imported here: gRPC and protobuf cost ~28 MB, paid only where the collector runs.
        from trainguard.exporters.podresources.client import list_devices

        assignments = list_devices(self._socket, self._timeout)
        gpus = self._gpus()
        family = _family()
        for assignment in assignments:
            if not is_gpu_resource(assignment.resource):
                continue
            gpu = resolve(assignment.device_id, gpus)
            family.add_metric(
                [
                    gpu.index,
                    gpu.uuid,
                    assignment.pod,
                    assignment.namespace,
                    assignment.container,
                    assignment.resource,
                    assignment.device_id,
                ],
                {},
            )
        yield family

    def _gpus(self) -> list[GpuIdentity]:
        """The GPUs the provider knows; without a driver, the identities it saw before (pods
        are still exported, with the UUIDs the kubelet gives)."""
        known = dict(self._context.provider.identities())
        try:
            samples = self._context.gpu_samples()
        except ProviderUnavailableError:
            return list(known.values())
        known.update({s.identity.index: s.identity for s in samples if isinstance(s, GpuSample)})
        return list(known.values())

    def close(self) -> None:
        """Each sample opens and closes its own channel: nothing is held between samples."""


@register(
    "kubelet",
    "Map GPUs to the pod, namespace and container the kubelet gave them to "
    f"(pod-resources socket from {contract.ENV_POD_RESOURCES_SOCKET}).",
    enabled_by_default=enabled_by_default(os.environ),
)
def _factory(context: ExporterContext) -> KubeletCollector:
    return KubeletCollector(context, socket_path(os.environ))
