"""The collectors of the node exporter; importing this package registers each of them."""

from trainguard.exporters.collectors import (
    gpu,
    gpu_process,
    kubelet,
    nccl,
    nccl_config,
    slurm_job,
)

__all__ = ["gpu", "gpu_process", "kubelet", "nccl", "nccl_config", "slurm_job"]
