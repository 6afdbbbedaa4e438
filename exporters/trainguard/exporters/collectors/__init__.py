"""The collectors of the node exporter; importing this package registers each of them."""

from trainguard.exporters.collectors import gpu, gpu_process, nccl, nccl_config

__all__ = ["gpu", "gpu_process", "nccl", "nccl_config"]
