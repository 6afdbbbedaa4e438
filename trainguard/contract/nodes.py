"""The nodes' metrics (emitted by ``trainguard.exporters``)."""

from __future__ import annotations

from trainguard.contract.labels import (
    LABEL_CHANNELS,
    LABEL_CHECK,
    LABEL_COLLECTOR,
    LABEL_COMM_ID,
    LABEL_CONTAINER,
    LABEL_DEVICE_ID,
    LABEL_DIRECTION,
    LABEL_GPU,
    LABEL_INTERFACE,
    LABEL_JOB_ID,
    LABEL_KIND,
    LABEL_LOCAL_RANK,
    LABEL_MODEL_NAME,
    LABEL_NAMESPACE,
    LABEL_NETWORK,
    LABEL_NRANKS,
    LABEL_POD,
    LABEL_PROVIDER,
    LABEL_RANK,
    LABEL_REASON,
    LABEL_RESOURCE,
    LABEL_RUNBOOK_URL,
    LABEL_SLURM_JOB_ID,
    LABEL_SLURM_STEP_ID,
    LABEL_TRANSPORT,
    LABEL_TREES,
    LABEL_UUID,
    LABEL_VERSION,
    LABEL_XID,
)
from trainguard.contract.metric import MetricSpec, counter, gauge, info

# --- nodes (emitted by trainguard.exporters) ------------------------------------------------
GPU_LABELS: tuple[str, ...] = (LABEL_GPU, LABEL_UUID, LABEL_MODEL_NAME)

GPU_UTILIZATION = gauge("gpu_utilization_ratio", "GPU busy ratio (0..1).", GPU_LABELS)
GPU_MEMORY_USED = gauge(
    "gpu_memory_used_bytes",
    "GPU framebuffer memory used by applications (includes the driver's reserved memory where "
    "the driver cannot tell them apart: no trainguard_gpu_memory_reserved_bytes then).",
    GPU_LABELS,
)
GPU_MEMORY_RESERVED = gauge(
    "gpu_memory_reserved_bytes",
    "GPU framebuffer memory the driver and firmware reserve (never available to applications).",
    GPU_LABELS,
)
GPU_MEMORY_TOTAL = gauge("gpu_memory_total_bytes", "GPU framebuffer memory total.", GPU_LABELS)
GPU_TEMPERATURE = gauge("gpu_temperature_celsius", "GPU core temperature.", GPU_LABELS)
GPU_POWER = gauge("gpu_power_watts", "GPU power draw.", GPU_LABELS)
GPU_ENERGY = counter("gpu_energy_joules_total", "GPU energy used since driver load.", GPU_LABELS)
GPU_CLOCK_THROTTLED = gauge(
    "gpu_clock_throttled",
    "1 while the GPU clocks are held down for the given reason.",
    (*GPU_LABELS, LABEL_REASON),
)
GPU_XID_ERRORS = counter(
    "gpu_xid_errors_total", "NVIDIA Xid errors seen, by Xid code.", (*GPU_LABELS, LABEL_XID)
)
GPU_ECC_ERRORS = counter(
    "gpu_ecc_errors_total", "ECC errors (kind: corrected|uncorrected).", (*GPU_LABELS, LABEL_KIND)
)
NVML_UP = gauge(
    "nvml_up",
    "1 when NVML answered the last reading; absent when the exporter reads no NVML (simulated).",
)
NCCL_INFO = info(
    "nccl",
    "One NCCL communicator of one rank seen in NCCL debug logs: NCCL version, transports its "
    "channels connected through (NET/IB, NET/Socket, P2P, SHM...), network chosen, network "
    "interfaces, ranks, channels and tree channels.",
    (
        LABEL_VERSION,
        LABEL_TRANSPORT,
        LABEL_NETWORK,
        LABEL_INTERFACE,
        LABEL_NRANKS,
        LABEL_CHANNELS,
        LABEL_TREES,
        LABEL_COMM_ID,
        LABEL_RANK,
    ),
)
NCCL_LOG_ERRORS = counter(
    "nccl_log_errors_total", "NCCL warnings and errors in debug logs, by kind.", (LABEL_KIND,)
)
NCCL_CONFIG_WARNINGS = gauge(
    "nccl_config_warnings",
    "1 while a NCCL / TORCH_NCCL_* setting on this node fails the given check.",
    (LABEL_CHECK,),
)
GPU_UP = gauge("gpu_up", "1 when this GPU answered the last scrape, 0 when it is lost.", GPU_LABELS)
GPU_SM_CLOCK = gauge("gpu_sm_clock_hertz", "GPU SM clock.", GPU_LABELS)
GPU_MEMORY_CLOCK = gauge("gpu_memory_clock_hertz", "GPU memory clock.", GPU_LABELS)
GPU_REMAPPED_ROWS = gauge(
    "gpu_remapped_rows",
    "Memory rows remapped, by the kind of error that caused it (kind: correctable|uncorrectable).",
    (*GPU_LABELS, LABEL_KIND),
)
GPU_ROW_REMAP_PENDING = gauge(
    "gpu_row_remap_pending",
    "1 while a row remapping waits for the next GPU reset to take effect.",
    GPU_LABELS,
)
GPU_ROW_REMAP_FAILURE = gauge(
    "gpu_row_remap_failure",
    "1 when the GPU failed to remap a memory row (it needs service).",
    GPU_LABELS,
)
GPU_PCIE_THROUGHPUT = gauge(
    "gpu_pcie_throughput_bytes_per_second",
    "PCIe throughput over NVML's last 20 ms sample (direction: tx|rx).",
    (*GPU_LABELS, LABEL_DIRECTION),
)
GPU_NVLINK_BYTES = counter(
    "gpu_nvlink_bytes_total",
    "NVLink data bytes over all links (direction: tx|rx).",
    (*GPU_LABELS, LABEL_DIRECTION),
)
GPU_PROCESS_INFO = info(
    "gpu_process_info",
    "A torchrun rank with processes on a GPU (one series per GPU, job and rank; empty rank labels "
    "for processes that are not ranks); join GPU series to rank series on gpu or rank.",
    (LABEL_GPU, LABEL_UUID, LABEL_JOB_ID, LABEL_RANK, LABEL_LOCAL_RANK),
)
GPU_POD_INFO = info(
    "gpu_pod_info",
    "A GPU (or MIG device) the kubelet gave to a container; gpu and uuid are empty when the "
    "device names no GPU this exporter sees.",
    (
        LABEL_GPU,
        LABEL_UUID,
        LABEL_POD,
        LABEL_NAMESPACE,
        LABEL_CONTAINER,
        LABEL_RESOURCE,
        LABEL_DEVICE_ID,
    ),
)
GPU_SLURM_JOB_INFO = info(
    "gpu_slurm_job_info",
    "A Slurm job step with processes on a GPU (one series per GPU, job and step).",
    (LABEL_GPU, LABEL_UUID, LABEL_SLURM_JOB_ID, LABEL_SLURM_STEP_ID),
)
GPU_SLURM_UNMAPPED_PROCESSES = gauge(
    "gpu_slurm_unmapped_processes",
    "GPU processes whose Slurm job could not be told (no Slurm cgroup, no SLURM_JOB_ID in a "
    "readable environment): on a Slurm node, processes outside any job.",
)
NCCL_LOG_FILES = gauge("nccl_log_files", "NCCL debug files being followed.")
NCCL_LOG_BYTES = counter("nccl_log_bytes_total", "Bytes read from NCCL debug files.")
NCCL_LOG_LINES_DROPPED = counter(
    "nccl_log_lines_dropped_total",
    "Lines of NCCL debug files skipped because they were longer than the line limit.",
)
NCCL_CONFIG_PROCESSES = gauge(
    "nccl_config_processes", "Training processes on this node whose environment was linted."
)
NCCL_CONFIG_CHECK_INFO = info(
    "nccl_config_check_info",
    "Each NCCL configuration check and the page that explains its fix.",
    (LABEL_CHECK, LABEL_RUNBOOK_URL),
)
EXPORTER_INFO = info(
    "exporter_info",
    "The node exporter: its version and GPU provider (nvml, or simulated: made-up GPU values).",
    (LABEL_PROVIDER, LABEL_VERSION),
)
EXPORTER_COLLECTOR_DURATION = gauge(
    "exporter_collector_duration_seconds",
    "How long a collector took in the last sample (while it hangs: how long it has run).",
    (LABEL_COLLECTOR,),
)
# The collector that reads the GPU provider: its failure or timeout means NVML is not answering
# (a hung call drops trainguard_nvml_up altogether), so GpuNvmlDown watches its success too.
EXPORTER_COLLECTOR_GPU = "gpu"
EXPORTER_COLLECTOR_SUCCESS = gauge(
    "exporter_collector_success",
    "1 when a collector succeeded in the last sample, 0 when it failed or timed out.",
    (LABEL_COLLECTOR,),
)
EXPORTER_COLLECTOR_TIMEOUTS = counter(
    "exporter_collector_timeouts_total",
    "Samples in which a collector gave no answer within the sample timeout (its families are "
    "left out; while one read hangs, every sample counts).",
    (LABEL_COLLECTOR,),
)
EXPORTER_LAST_SAMPLE_TIMESTAMP = gauge(
    "exporter_last_sample_timestamp_seconds",
    "When the served data was sampled (Unix time); its age is time() minus this.",
)

NODE_METRICS: tuple[MetricSpec, ...] = (
    GPU_UTILIZATION,
    GPU_MEMORY_USED,
    GPU_MEMORY_RESERVED,
    GPU_MEMORY_TOTAL,
    GPU_TEMPERATURE,
    GPU_POWER,
    GPU_ENERGY,
    GPU_CLOCK_THROTTLED,
    GPU_XID_ERRORS,
    GPU_ECC_ERRORS,
    NVML_UP,
    NCCL_INFO,
    NCCL_LOG_ERRORS,
    NCCL_CONFIG_WARNINGS,
    GPU_UP,
    GPU_SM_CLOCK,
    GPU_MEMORY_CLOCK,
    GPU_REMAPPED_ROWS,
    GPU_ROW_REMAP_PENDING,
    GPU_ROW_REMAP_FAILURE,
    GPU_PCIE_THROUGHPUT,
    GPU_NVLINK_BYTES,
    GPU_PROCESS_INFO,
    GPU_POD_INFO,
    GPU_SLURM_JOB_INFO,
    GPU_SLURM_UNMAPPED_PROCESSES,
    NCCL_LOG_FILES,
    NCCL_LOG_BYTES,
    NCCL_LOG_LINES_DROPPED,
    NCCL_CONFIG_PROCESSES,
    NCCL_CONFIG_CHECK_INFO,
    EXPORTER_INFO,
    EXPORTER_COLLECTOR_DURATION,
    EXPORTER_COLLECTOR_SUCCESS,
    EXPORTER_COLLECTOR_TIMEOUTS,
    EXPORTER_LAST_SAMPLE_TIMESTAMP,
)
