"""The node exporter: GPUs through NVML, NCCL debug logs and NCCL configuration."""
