"""Environment variables the parts read, and the job id every part derives from them."""

from __future__ import annotations

from collections.abc import Mapping

# --- environment variables ------------------------------------------------------------------
ENV_JOB_ID = "TRAINGUARD_JOB_ID"
ENV_METRICS_PORT = "TRAINGUARD_METRICS_PORT"
ENV_METRICS_ADDR = "TRAINGUARD_METRICS_ADDR"
ENV_FILE_SD_DIR = "TRAINGUARD_FILE_SD_DIR"
ENV_DUMP_DIR = "TRAINGUARD_DUMP_DIR"
# In a stall's dump folder the hook writes each rank's Flight Recorder trace as
# <FLIGHT_RECORDER_DUMP_PREFIX><rank> (the layout torch's analyzer expects) and its threads'
# stacks as <STACKS_DUMP_PREFIX><rank>.txt; diagnose reads them by these names.
FLIGHT_RECORDER_DUMP_PREFIX = "fr_rank"
STACKS_DUMP_PREFIX = "stacks_rank"
ENV_NODE = "TRAINGUARD_NODE"
ENV_STALL_FLOOR = "TRAINGUARD_STALL_FLOOR_SECONDS"
ENV_MEMORY_CAPACITY = "TRAINGUARD_MEMORY_CAPACITY_BYTES"
ENV_REMEDIATION_URL = "TRAINGUARD_REMEDIATION_URL"
# Opt-in detail on a rank's /metrics (see RANK_SERIES_BUDGET): "1" turns on the bucketed
# phase / compute / sync-wait histograms (metrics_detail=True), and per-bucket gradient sync
# timing through a comm hook (per_bucket=True).
ENV_METRICS_DETAIL = "TRAINGUARD_METRICS_DETAIL"
ENV_PER_BUCKET = "TRAINGUARD_PER_BUCKET"
# Overrides the detected scheduler (one of SCHEDULERS).
ENV_SCHEDULER = "TRAINGUARD_SCHEDULER"
# The node exporter: TRAINGUARD_EXPORTER_COLLECTOR_<NAME>=0|1 switches a collector.
ENV_EXPORTER_COLLECTOR_PREFIX = "TRAINGUARD_EXPORTER_COLLECTOR_"
ENV_EXPORTER_LISTEN_ADDRESS = "TRAINGUARD_EXPORTER_LISTEN_ADDRESS"
ENV_EXPORTER_NCCL_LOG_GLOB = "TRAINGUARD_EXPORTER_NCCL_LOG_GLOB"
# Seconds between two readings of every collector, and how long one collector may take.
ENV_EXPORTER_SAMPLE_INTERVAL = "TRAINGUARD_EXPORTER_SAMPLE_INTERVAL"
ENV_EXPORTER_SAMPLE_TIMEOUT = "TRAINGUARD_EXPORTER_SAMPLE_TIMEOUT"
# The kubelet's pod-resources socket (the exporter's kubelet collector; set by the DaemonSet).
ENV_POD_RESOURCES_SOCKET = "TRAINGUARD_POD_RESOURCES_SOCKET"
# torchrun's TORCHELASTIC_RUN_ID when no --rdzv-id was given: a placeholder, not an id.
TORCHRUN_RUN_ID_UNSET = "none"


def job_id_from_environment(env: Mapping[str, str]) -> str:
    """A rank's job id from the environment it was started with ("" when none is set).

    The one precedence the hook (the ``job_id`` label) and the exporter (its /proc join of GPU
    processes to ranks) share: ``TRAINGUARD_JOB_ID``; else torchrun's ``TORCHELASTIC_RUN_ID``;
    else Slurm's ``SLURM_JOB_ID``; torchrun's ``none`` placeholder only when nothing else is set.
    """
    run_id = env.get("TORCHELASTIC_RUN_ID", "")
    if run_id == TORCHRUN_RUN_ID_UNSET:
        return env.get(ENV_JOB_ID) or env.get("SLURM_JOB_ID") or run_id
    return env.get(ENV_JOB_ID) or run_id or env.get("SLURM_JOB_ID", "")
