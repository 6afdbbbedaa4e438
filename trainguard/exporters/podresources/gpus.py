"""Which of the kubelet's device assignments are GPUs, and which GPU of the node each one is.

The ids are the ones NVIDIA's device plugin advertises to the kubelet:

- ``nvidia.com/gpu``: a whole GPU, named by its UUID (``GPU-…``), or by its index when the
  plugin runs with ``--device-id-strategy=index``. A GPU shared by time-slicing or MPS is
  advertised once per replica as ``<id>::<replica>``, under ``nvidia.com/gpu`` or, when the
  plugin renames shared resources, ``nvidia.com/gpu.shared``.
- ``nvidia.com/mig-<profile>`` (MIG strategy ``mixed``; ``single`` keeps ``nvidia.com/gpu``): a
  MIG device, named ``MIG-GPU-<GPU UUID>/<GPU instance>/<compute instance>`` by drivers before
  R470 and ``MIG-<MIG UUID>`` since. The first form names its GPU; the second does not, and the
  GPU provider does not list MIG devices, so such a device is reported with its id and no GPU.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from trainguard.exporters.provider import GpuIdentity

GPU_RESOURCE = "nvidia.com/gpu"
SHARED_GPU_RESOURCE_PREFIX = "nvidia.com/gpu."
MIG_RESOURCE_PREFIX = "nvidia.com/mig-"
_REPLICA_SEPARATOR = "::"
_OLD_MIG_PREFIX = "MIG-GPU-"


def is_gpu_resource(resource: str) -> bool:
    """Whole, shared or MIG GPUs of NVIDIA's device plugin; any other resource is not a GPU."""
    return resource == GPU_RESOURCE or resource.startswith(
        (SHARED_GPU_RESOURCE_PREFIX, MIG_RESOURCE_PREFIX)
    )


@dataclass(frozen=True)
class GpuRef:
    """The ``gpu`` (index) and ``uuid`` labels of the GPU a device id names; empty if unknown."""

    index: str = ""
    uuid: str = ""


def resolve(device_id: str, gpus: Iterable[GpuIdentity]) -> GpuRef:
    """The GPU of the node that ``device_id`` names (see the module's list of forms)."""
    base = device_id.partition(_REPLICA_SEPARATOR)[0]
    if base.startswith(_OLD_MIG_PREFIX):
        base = base.removeprefix("MIG-").partition("/")[0]
    for gpu in gpus:
        if base == gpu.uuid or base == str(gpu.index):
            return GpuRef(str(gpu.index), gpu.uuid)
    if base.startswith("GPU-"):
        return GpuRef(uuid=base)  # a GPU this exporter does not see (lost, or not on this node)
    return GpuRef()
