"""The names every part of trainguard relies on: read this module first.

Metric names, label names, alert names, span names and attributes, the event schema, and the
vocabulary of failures and remediation actions with the catalogue that ties them together are
an API: dashboards, alert rules, runbooks, policies and users' own queries depend on them. This
module is the only place that spells them out; everything else imports them from here
(docs/design.md, "Contract"). Renaming anything here needs a note in docs/migrations.md.

Conventions: prefix ``trainguard_``, base units (seconds, bytes, joules, ratios in 0..1),
``_total`` on counters. Labels never include ``job`` (Prometheus owns it), a step number or a
tensor name (unbounded cardinality).
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass

PREFIX = "trainguard_"

# --- label names -------------------------------------------------------------------------
LABEL_JOB_ID = "job_id"
LABEL_RANK = "rank"
LABEL_LOCAL_RANK = "local_rank"
LABEL_NODE = "node"
LABEL_GPU = "gpu"
LABEL_PHASE = "phase"
LABEL_COMPONENT = "component"
LABEL_UUID = "uuid"
LABEL_MODEL_NAME = "name"
LABEL_REASON = "reason"
LABEL_XID = "xid"
LABEL_KIND = "kind"
LABEL_CHECK = "check"
LABEL_COLLECTOR = "collector"
LABEL_PROVIDER = "provider"
LABEL_VERSION = "version"
LABEL_TRANSPORT = "transport"
LABEL_BACKEND = "backend"
LABEL_DIRECTION = "direction"
LABEL_RUNBOOK_URL = "runbook_url"
LABEL_INTERFACE = "interface"
LABEL_NETWORK = "network"
LABEL_NRANKS = "nranks"
LABEL_CHANNELS = "channels"
LABEL_TREES = "trees"
LABEL_COMM_ID = "comm_id"
LABEL_PARALLELISM = "parallelism"
LABEL_TIMING_SOURCE = "timing_source"

# Labels every training-rank series carries; they identify the process.
RANK_IDENTITY_LABELS: tuple[str, ...] = (LABEL_JOB_ID, LABEL_RANK, LABEL_LOCAL_RANK, LABEL_NODE)


class Parallelism(str, enum.Enum):
    """How the instrumented model is parallelised (``rank_info{parallelism}``), detected by
    the hook from the model it is given."""

    DDP = "ddp"  # DistributedDataParallel
    FSDP2 = "fsdp2"  # torch.distributed.fsdp.fully_shard
    FSDP1 = "fsdp1"  # torch.distributed.fsdp.FullyShardedDataParallel
    NONE = "none"  # a plain module (its collectives, if any, are the training loop's own)


class TimingSource(str, enum.Enum):
    """Where a rank's compute / sync-wait split comes from (``rank_info{timing_source}``).

    Anything but ``wall_clock`` separates waiting on peers from local work; ``wall_clock``
    is the visible fallback, where compute time includes the wait and stragglers blur.
    """

    DDP_REDUCER = "ddp_reducer"  # DDP's own reducer timers (+ the collective timeline)
    COLLECTIVE_TIMELINE = "collective_timeline"  # the hook's per-rank collective timeline
    WALL_CLOCK = "wall_clock"


class Phase(str, enum.Enum):
    """The phases a training step is split into (label ``phase``)."""

    DATA = "data"
    FORWARD = "forward"
    BACKWARD = "backward"
    OPTIMIZER = "optimizer"


class MetricKind(str, enum.Enum):
    COUNTER = "counter"
    GAUGE = "gauge"
    HISTOGRAM = "histogram"
    INFO = "info"


# The suffix Prometheus stores after a family's name (prometheus_client adds it).
_STORED_SUFFIX: dict[MetricKind, str] = {MetricKind.COUNTER: "_total", MetricKind.INFO: "_info"}


@dataclass(frozen=True)
class MetricSpec:
    """One metric of the contract: its exposed name, type, help text and extra labels.

    Names, by what they are for:

    - ``name``: the name a query uses. For counters, gauges and info metrics it is the one
      sample name Prometheus stores (counters end in ``_total``, info metrics in ``_info``,
      which construction checks); for histograms it is the base the
      ``_bucket``/``_sum``/``_count`` series share.
    - ``client_name``: the metric family name prometheus_client takes (``Counter(...)``,
      ``Info(...)``, ...), which adds ``_total`` / ``_info`` itself. Metric families are
      built by ``trainguard.prometheus_families.family``, which picks it for you.
    - ``sample_names``: every sample name Prometheus stores for the family.
    - ``bucket_name`` / ``sum_name`` / ``count_name``: a histogram's three series.

    ``labels`` are the labels beyond the identity labels of the emitting process.
    """

    name: str
    kind: MetricKind
    documentation: str
    labels: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        suffix = _STORED_SUFFIX.get(self.kind)
        if suffix is not None and not self.name.endswith(suffix):
            raise ValueError(f"{self.kind.value} {self.name!r} must end in {suffix!r}")

    @property
    def client_name(self) -> str:
        """The family name for prometheus_client: ``name`` without ``_total`` / ``_info``."""
        return self.name.removesuffix(_STORED_SUFFIX.get(self.kind, ""))

    @property
    def sample_names(self) -> tuple[str, ...]:
        """Every sample name Prometheus stores for this metric.

        Counters: ``(<base>_total,)``; gauges: ``(<name>,)``; info: ``(<base>_info,)``;
        histograms: ``(<name>_bucket, <name>_sum, <name>_count)``. A ``_created`` series,
        which prometheus_client may add to counters and histograms, is not part of the
        contract and is not listed.
        """
        if self.kind is MetricKind.HISTOGRAM:
            return (self.bucket_name, self.sum_name, self.count_name)
        return (self.name,)

    def _histogram_series(self, suffix: str) -> str:
        if self.kind is not MetricKind.HISTOGRAM:
            raise ValueError(f"{self.name} is a {self.kind.value}, not a histogram")
        return self.name + suffix

    @property
    def bucket_name(self) -> str:
        """A histogram's ``<name>_bucket`` series (``ValueError`` for other kinds)."""
        return self._histogram_series("_bucket")

    @property
    def sum_name(self) -> str:
        """A histogram's ``<name>_sum`` series (``ValueError`` for other kinds)."""
        return self._histogram_series("_sum")

    @property
    def count_name(self) -> str:
        """A histogram's ``<name>_count`` series (``ValueError`` for other kinds)."""
        return self._histogram_series("_count")


def _counter(name: str, doc: str, labels: tuple[str, ...] = ()) -> MetricSpec:
    """A counter; ``name`` with or without its ``_total``."""
    full = PREFIX + name.removesuffix("_total") + "_total"
    return MetricSpec(full, MetricKind.COUNTER, doc, labels)


def _gauge(name: str, doc: str, labels: tuple[str, ...] = ()) -> MetricSpec:
    return MetricSpec(PREFIX + name, MetricKind.GAUGE, doc, labels)


def _histogram(name: str, doc: str, labels: tuple[str, ...] = ()) -> MetricSpec:
    return MetricSpec(PREFIX + name, MetricKind.HISTOGRAM, doc, labels)


def _info(name: str, doc: str, labels: tuple[str, ...] = ()) -> MetricSpec:
    """An info metric; ``name`` with or without its ``_info``."""
    full = PREFIX + name.removesuffix("_info") + "_info"
    return MetricSpec(full, MetricKind.INFO, doc, labels)


# --- training ranks (emitted by trainguard.instrumentation) --------------------------------
STEPS = _counter("steps_total", "Training steps completed by this rank.")
STEP_DURATION = _histogram(
    "step_duration_seconds",
    "Wall time of a whole training step (equal on every rank of a synchronous job).",
)
STEP_PHASE_DURATION = _histogram(
    "step_phase_duration_seconds",
    "Wall time of one phase of a training step: data wait, forward, backward "
    "(including gradient sync) and optimizer.",
    (LABEL_PHASE,),
)
STEP_COMPUTE_DURATION = _histogram(
    "step_compute_duration_seconds",
    "Local work of a step with no waiting on peers: data wait + forward compute + backward "
    "compute. The straggler signal. On DDP, the steps DDP's runtime statistics time "
    "(runtime_stats_every).",
)
SYNC_WAIT_DURATION = _histogram(
    "sync_wait_duration_seconds",
    "Time a step spent blocked on peers: the part of the gradient sync not overlapped with "
    "backward compute. On DDP, the steps DDP's runtime statistics time (runtime_stats_every).",
)
COLLECTIVES_LAUNCHED = _counter(
    "collectives_launched_total",
    "Collectives this rank has launched (its collective sequence number).",
)
COLLECTIVES_COMPLETED = _counter(
    "collectives_completed_total", "Collectives this rank has seen complete."
)
LAST_STEP_TIMESTAMP = _gauge(
    "last_step_timestamp_seconds", "Unix time at which this rank last completed a step."
)
GRAD_SYNC_DURATION = _histogram(
    "grad_sync_duration_seconds",
    "Duration of a gradient synchronisation (whole step by default, per bucket in bucket mode; "
    "on DDP by default, the steps DDP's runtime statistics time).",
)
GRAD_SYNC_BYTES = _counter("grad_sync_bytes_total", "Gradient bytes synchronised by this rank.")
PARAM_GATHER_DURATION = _histogram(
    "param_gather_duration_seconds",
    "Time spent all-gathering sharded parameters (FSDP): a whole step's all-gathers by "
    "default, one observation per FSDP unit in bucket mode.",
)
COLLECTIVE_INFLIGHT = _gauge(
    "collective_inflight", "Collectives of this rank launched and not yet completed."
)
COLLECTIVE_OLDEST_INFLIGHT = _gauge(
    "collective_oldest_inflight_seconds",
    "Age of this rank's oldest collective that has not completed (0 when none).",
)
COLLECTIVE_TIMEOUTS = _counter(
    "collective_timeouts_total",
    "Collectives of this rank that ran past their process group's timeout.",
)
COLLECTIVE_STALLS = _counter(
    "collective_stalls_total",
    "Stalls detected by the collective watchdog (oldest in-flight collective past the stall "
    "threshold); one per stall.",
)
MEMORY_ALLOCATED = _gauge("memory_allocated_bytes", "Memory held by live tensors (CUDA) or RSS.")
MEMORY_RESERVED = _gauge(
    "memory_reserved_bytes", "Memory reserved by the caching allocator (CUDA) or RSS."
)
MEMORY_CAPACITY = _gauge(
    "memory_capacity_bytes", "Total device memory (CUDA) or the cgroup/host memory limit."
)
MEMORY_FRAGMENTATION = _gauge(
    "memory_fragmentation_ratio",
    "Share of reserved memory not held by tensors: (reserved - allocated) / reserved.",
)
MEMORY_ALLOC_RETRIES = _counter(
    "memory_alloc_retries_total",
    "cudaMalloc retries after the allocator freed its cache (a sign of memory pressure).",
)
OOM_EVENTS = _counter("oom_events_total", "Out-of-memory errors seen inside a training step.")
OOM_RECOVERIES = _counter(
    "oom_recoveries_total", "Steps that succeeded after an OOM by splitting into micro-batches."
)
INSTRUMENTATION_ERRORS = _counter(
    "instrumentation_errors_total",
    "Failures inside trainguard's own instrumentation (caught; training went on).",
    (LABEL_COMPONENT,),
)
SPANS_DROPPED = _counter(
    "spans_dropped_total", "Spans that could not be exported (endpoint down, queue full)."
)
# Where a job runs: the scheduler that launched it (one of SCHEDULERS) and that scheduler's
# handle on it. The ranks export them in rank_info; the alert rules copy them onto every alert
# of the job, and the remediation service picks the executor they name.
LABEL_SCHEDULER = "scheduler"
LABEL_NAMESPACE = "namespace"  # Kubernetes namespace of the job's pods
LABEL_SLURM_JOB_ID = "slurm_job_id"
SCHEDULER_LABELS: tuple[str, ...] = (LABEL_SCHEDULER, LABEL_NAMESPACE, LABEL_SLURM_JOB_ID)
SCHEDULER_LOCAL = "local"  # torchrun (elastic) on hosts trainguard's local executor reaches
SCHEDULER_KUBERNETES = "kubernetes"
SCHEDULER_SLURM = "slurm"
SCHEDULERS: tuple[str, ...] = (SCHEDULER_LOCAL, SCHEDULER_KUBERNETES, SCHEDULER_SLURM)

RANK_INFO = _info(
    "rank_info",
    "Static facts about this training rank: its backend, world size and device, and where the "
    "job runs (scheduler, Kubernetes namespace, Slurm job id; empty when not applicable).",
    (
        LABEL_BACKEND,
        "world_size",
        "device",
        LABEL_PARALLELISM,
        LABEL_TIMING_SOURCE,
        *SCHEDULER_LABELS,
    ),
)

# Progress and membership, as values the rules and the remediation service's verifier compare:
# a repair has worked once the job's step passes the one it had reached before the incident, and
# a rank at or above its job's current world size was removed on purpose (exclude, scale-down).
TRAINING_STEP = _gauge(
    "step",
    "The training step this rank last completed, the job's own numbering (it continues from "
    "instrument(start_step=...) after a restart from a checkpoint).",
)
WORLD_SIZE = _gauge("world_size", "Ranks in this rank's job as it last formed.")
RANK_INDEX = _gauge(
    "rank_index", "This process's rank, as a value (the rules compare it with world_size)."
)
ELASTIC_RESTARTS = _gauge(
    "elastic_restarts",
    "How many times torchrun's elastic agent has restarted this rank's worker group after a "
    "worker failed (TORCHELASTIC_RESTART_COUNT; 0 outside torchrun). A rise means a rank died.",
)

RANK_METRICS: tuple[MetricSpec, ...] = (
    STEPS,
    TRAINING_STEP,
    WORLD_SIZE,
    RANK_INDEX,
    ELASTIC_RESTARTS,
    STEP_DURATION,
    STEP_PHASE_DURATION,
    STEP_COMPUTE_DURATION,
    SYNC_WAIT_DURATION,
    COLLECTIVES_LAUNCHED,
    COLLECTIVES_COMPLETED,
    LAST_STEP_TIMESTAMP,
    GRAD_SYNC_DURATION,
    GRAD_SYNC_BYTES,
    PARAM_GATHER_DURATION,
    COLLECTIVE_INFLIGHT,
    COLLECTIVE_OLDEST_INFLIGHT,
    COLLECTIVE_TIMEOUTS,
    COLLECTIVE_STALLS,
    MEMORY_ALLOCATED,
    MEMORY_RESERVED,
    MEMORY_CAPACITY,
    MEMORY_FRAGMENTATION,
    MEMORY_ALLOC_RETRIES,
    OOM_EVENTS,
    OOM_RECOVERIES,
    INSTRUMENTATION_ERRORS,
    SPANS_DROPPED,
    RANK_INFO,
)

# --- cardinality budget of one rank ----------------------------------------------------------
# The series one rank's /metrics may hold by default (what Prometheus stores per scrape; a
# 4,096-rank job at 80 is some 330k series). A test (tests/instrumentation/test_budget.py)
# instruments real models and fails past it. Histograms that keep their buckets by default
# (their quantiles feed dashboards, exemplars and diagnose; few buckets, docs/instrumentation.md):
BUCKETED_HISTOGRAMS: tuple[MetricSpec, ...] = (
    STEP_DURATION,
    GRAD_SYNC_DURATION,
    PARAM_GATHER_DURATION,
)
# Histograms whose buckets are opt-in detail (ENV_METRICS_DETAIL): by default they are exposed
# as summaries without quantiles, i.e. the same _sum and _count series (what the rules' means
# read) and no _bucket series.
DETAIL_HISTOGRAMS: tuple[MetricSpec, ...] = (
    STEP_PHASE_DURATION,
    STEP_COMPUTE_DURATION,
    SYNC_WAIT_DURATION,
)
RANK_SERIES_BUDGET = 81
# With the detail on: the bound the same test holds the detailed exposition to.
RANK_DETAIL_SERIES_BUDGET = 131

# --- nodes (emitted by trainguard.exporters) ------------------------------------------------
GPU_LABELS: tuple[str, ...] = (LABEL_GPU, LABEL_UUID, LABEL_MODEL_NAME)

GPU_UTILIZATION = _gauge("gpu_utilization_ratio", "GPU busy ratio (0..1).", GPU_LABELS)
GPU_MEMORY_USED = _gauge(
    "gpu_memory_used_bytes",
    "GPU framebuffer memory used by applications (includes the driver's reserved memory where "
    "the driver cannot tell them apart: no trainguard_gpu_memory_reserved_bytes then).",
    GPU_LABELS,
)
GPU_MEMORY_RESERVED = _gauge(
    "gpu_memory_reserved_bytes",
    "GPU framebuffer memory the driver and firmware reserve (never available to applications).",
    GPU_LABELS,
)
GPU_MEMORY_TOTAL = _gauge("gpu_memory_total_bytes", "GPU framebuffer memory total.", GPU_LABELS)
GPU_TEMPERATURE = _gauge("gpu_temperature_celsius", "GPU core temperature.", GPU_LABELS)
GPU_POWER = _gauge("gpu_power_watts", "GPU power draw.", GPU_LABELS)
GPU_ENERGY = _counter("gpu_energy_joules_total", "GPU energy used since driver load.", GPU_LABELS)
GPU_CLOCK_THROTTLED = _gauge(
    "gpu_clock_throttled",
    "1 while the GPU clocks are held down for the given reason.",
    (*GPU_LABELS, LABEL_REASON),
)
GPU_XID_ERRORS = _counter(
    "gpu_xid_errors_total", "NVIDIA Xid errors seen, by Xid code.", (*GPU_LABELS, LABEL_XID)
)
GPU_ECC_ERRORS = _counter(
    "gpu_ecc_errors_total", "ECC errors (kind: corrected|uncorrected).", (*GPU_LABELS, LABEL_KIND)
)
NVML_UP = _gauge(
    "nvml_up",
    "1 when NVML answered the last reading; absent when the exporter reads no NVML (simulated).",
)
NCCL_INFO = _info(
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
NCCL_LOG_ERRORS = _counter(
    "nccl_log_errors_total", "NCCL warnings and errors in debug logs, by kind.", (LABEL_KIND,)
)
NCCL_CONFIG_WARNINGS = _gauge(
    "nccl_config_warnings",
    "1 while a NCCL / TORCH_NCCL_* setting on this node fails the given check.",
    (LABEL_CHECK,),
)
GPU_UP = _gauge(
    "gpu_up", "1 when this GPU answered the last scrape, 0 when it is lost.", GPU_LABELS
)
GPU_SM_CLOCK = _gauge("gpu_sm_clock_hertz", "GPU SM clock.", GPU_LABELS)
GPU_MEMORY_CLOCK = _gauge("gpu_memory_clock_hertz", "GPU memory clock.", GPU_LABELS)
GPU_REMAPPED_ROWS = _gauge(
    "gpu_remapped_rows",
    "Memory rows remapped, by the kind of error that caused it (kind: correctable|uncorrectable).",
    (*GPU_LABELS, LABEL_KIND),
)
GPU_ROW_REMAP_PENDING = _gauge(
    "gpu_row_remap_pending",
    "1 while a row remapping waits for the next GPU reset to take effect.",
    GPU_LABELS,
)
GPU_ROW_REMAP_FAILURE = _gauge(
    "gpu_row_remap_failure",
    "1 when the GPU failed to remap a memory row (it needs service).",
    GPU_LABELS,
)
GPU_PCIE_THROUGHPUT = _gauge(
    "gpu_pcie_throughput_bytes_per_second",
    "PCIe throughput over NVML's last 20 ms sample (direction: tx|rx).",
    (*GPU_LABELS, LABEL_DIRECTION),
)
GPU_NVLINK_BYTES = _counter(
    "gpu_nvlink_bytes_total",
    "NVLink data bytes over all links (direction: tx|rx).",
    (*GPU_LABELS, LABEL_DIRECTION),
)
GPU_PROCESS_INFO = _info(
    "gpu_process_info",
    "A torchrun rank with processes on a GPU (one series per GPU, job and rank; empty rank labels "
    "for processes that are not ranks); join GPU series to rank series on gpu or rank.",
    (LABEL_GPU, LABEL_UUID, LABEL_JOB_ID, LABEL_RANK, LABEL_LOCAL_RANK),
)
# GPU -> pod (the kubelet's pod-resources API) and GPU -> Slurm job (slurmd's cgroups).
LABEL_POD = "pod"
LABEL_CONTAINER = "container"
LABEL_RESOURCE = "resource"  # a device plugin's resource name, e.g. nvidia.com/gpu
LABEL_DEVICE_ID = "device_id"  # the device plugin's id: a GPU or MIG UUID, or an index
LABEL_SLURM_STEP_ID = "slurm_step_id"  # 0, 1, ..., batch, extern, interactive
GPU_POD_INFO = _info(
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
GPU_SLURM_JOB_INFO = _info(
    "gpu_slurm_job_info",
    "A Slurm job step with processes on a GPU (one series per GPU, job and step).",
    (LABEL_GPU, LABEL_UUID, LABEL_SLURM_JOB_ID, LABEL_SLURM_STEP_ID),
)
GPU_SLURM_UNMAPPED_PROCESSES = _gauge(
    "gpu_slurm_unmapped_processes",
    "GPU processes whose Slurm job could not be told (no Slurm cgroup, no SLURM_JOB_ID in a "
    "readable environment): on a Slurm node, processes outside any job.",
)
NCCL_LOG_FILES = _gauge("nccl_log_files", "NCCL debug files being followed.")
NCCL_LOG_BYTES = _counter("nccl_log_bytes_total", "Bytes read from NCCL debug files.")
NCCL_LOG_LINES_DROPPED = _counter(
    "nccl_log_lines_dropped_total",
    "Lines of NCCL debug files skipped because they were longer than the line limit.",
)
NCCL_CONFIG_PROCESSES = _gauge(
    "nccl_config_processes", "Training processes on this node whose environment was linted."
)
NCCL_CONFIG_CHECK_INFO = _info(
    "nccl_config_check_info",
    "Each NCCL configuration check and the page that explains its fix.",
    (LABEL_CHECK, LABEL_RUNBOOK_URL),
)
EXPORTER_INFO = _info(
    "exporter_info",
    "The node exporter: its version and GPU provider (nvml, or simulated: made-up GPU values).",
    (LABEL_PROVIDER, LABEL_VERSION),
)
EXPORTER_COLLECTOR_DURATION = _gauge(
    "exporter_collector_duration_seconds",
    "How long a collector took in the last sample (while it hangs: how long it has run).",
    (LABEL_COLLECTOR,),
)
# The collector that reads the GPU provider: its failure or timeout means NVML is not answering
# (a hung call drops trainguard_nvml_up altogether), so GpuNvmlDown watches its success too.
EXPORTER_COLLECTOR_GPU = "gpu"
EXPORTER_COLLECTOR_SUCCESS = _gauge(
    "exporter_collector_success",
    "1 when a collector succeeded in the last sample, 0 when it failed or timed out.",
    (LABEL_COLLECTOR,),
)
EXPORTER_COLLECTOR_TIMEOUTS = _counter(
    "exporter_collector_timeouts_total",
    "Samples in which a collector gave no answer within the sample timeout (its families are "
    "left out; while one read hangs, every sample counts).",
    (LABEL_COLLECTOR,),
)
EXPORTER_LAST_SAMPLE_TIMESTAMP = _gauge(
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


# --- alerts ---------------------------------------------------------------------------------
class Alert(str, enum.Enum):
    """Alert names (CamelCase); each has ``severity`` and summary/description/runbook_url."""

    TRAINING_OOM = "TrainingOOM"
    TRAINING_OOM_RISK = "TrainingOOMRisk"
    TRAINING_STRAGGLER = "TrainingStraggler"
    TRAINING_COLLECTIVE_STALLED = "TrainingCollectiveStalled"
    TRAINING_NCCL_TIMEOUT = "TrainingNCCLTimeout"
    TRAINING_STALLED = "TrainingStalled"
    TRAINING_RANK_DOWN = "TrainingRankDown"
    TRAINING_RANK_RESTARTED = "TrainingRankRestarted"
    TRAINING_DATALOADER_BOUND = "TrainingDataLoaderBound"
    TRAINING_MEMORY_FRAGMENTATION = "TrainingMemoryFragmentation"
    GPU_XID_ERROR = "GpuXidError"
    GPU_THERMAL_THROTTLING = "GpuThermalThrottling"
    GPU_NVML_DOWN = "GpuNvmlDown"
    NCCL_SOCKET_TRANSPORT_FALLBACK = "NcclSocketTransportFallback"


# --- the failure vocabulary ------------------------------------------------------------------
# Read this section first: it is the path of every failure from signal to repair. Alerts,
# triage findings, diagnose causes, events and remediation records name failures and actions
# with these values and no others; tests/core/test_catalogue.py fails when the catalogue below
# and the rules, the runbook, the default policy, the action catalogue or the executors disagree.


class Failure(str, enum.Enum):
    """Which failure: the one name every component gives it (``failure`` in records)."""

    OOM = "oom"
    STRAGGLER = "straggler"
    JOB_SLOWDOWN = "job_slowdown"
    DATALOADER_BOUND = "dataloader_bound"
    HANG = "hang"
    NCCL_TIMEOUT = "nccl_timeout"
    NCCL_ERROR = "nccl_error"
    RANK_FAILURE = "rank_failure"
    GPU_FAULT = "gpu_fault"
    GPU_THROTTLING = "gpu_throttling"


class Action(str, enum.Enum):
    """What remediation can do: the protocol between policy, service, executors and ranks."""

    RESTART_FROM_CHECKPOINT = "restart_from_checkpoint"
    EXCLUDE_NODE = "exclude_node"
    DRAIN_NODE = "drain_node"
    ANNOTATE = "annotate"
    CHECKPOINT_NOW = "checkpoint_now"
    DUMP_DIAGNOSTICS = "dump_diagnostics"
    SET_GRAD_COMPRESSION = "set_grad_compression"
    SPLIT_MICRO_BATCHES = "split_micro_batches"
    SET_COLLECTIVE_TIMEOUT = "set_collective_timeout"
    RECOMMEND = "recommend"
    PAGE = "page"  # the last rung of a ladder: an alert posted to Alertmanager for a human


class NcclErrorKind(str, enum.Enum):
    """One taxonomy of NCCL errors: the exporter's ``kind`` label and triage's ``kind`` field."""

    REMOTE = "remote"  # a peer died or the network dropped: this rank is usually a victim
    CUDA = "cuda"  # a CUDA call failed inside NCCL (illegal address, out of memory, ...)
    SYSTEM = "system"  # a system or library call failed (sockets, /dev/shm, IB verbs)
    INTERNAL = "internal"  # NCCL's own internal error (often mismatched versions)
    INVALID_USAGE = "invalid_usage"  # ranks issued mismatched collectives, wrong device
    IB = "ib"  # InfiniBand / RoCE verbs errors (failed work completions, ibv_* calls)
    SOCKET = "socket"  # TCP between ranks: refused, closed or reset by the peer
    TIMEOUT = "timeout"  # NCCL gave up waiting for a peer
    PROXY = "proxy"  # the proxy thread failed a network operation
    OTHER = "other"


@dataclass(frozen=True)
class FailureSpec:
    """One row of the failure catalogue: how a failure is seen, named, explained and repaired.

    ``runbook_anchor`` is the section of ``alerts/trainguard/alerts/runbook.md`` about it;
    ``actions`` are the default policy's actions for its alerts, in the order they are tried.
    ``triage_detector`` and ``diagnose_analysis`` name (``module:attribute``) the code that
    finds it in raw logs and explains it from Prometheus; None where that component cannot.
    """

    failure: Failure
    summary: str
    alerts: tuple[Alert, ...]
    signals: tuple[MetricSpec, ...]
    actions: tuple[Action, ...]
    triage_detector: str | None
    diagnose_analysis: str | None

    @property
    def runbook_anchor(self) -> str:
        """The runbook's section heading is the failure's name, so this is its anchor."""
        return self.failure.value


def _failure(
    failure: Failure,
    summary: str,
    *,
    alerts: tuple[Alert, ...],
    signals: tuple[MetricSpec, ...],
    actions: tuple[Action, ...],
    triage: str | None,
    diagnose: str | None,
) -> FailureSpec:
    return FailureSpec(failure, summary, alerts, signals, actions, triage, diagnose)


_TRIAGE = "trainguard.triage.detectors."
_DIAGNOSE = "trainguard.diagnose."

FAILURES: dict[Failure, FailureSpec] = {
    spec.failure: spec
    for spec in (
        _failure(
            Failure.OOM,
            "CUDA out of memory, memory close to capacity, or a fragmented caching allocator.",
            alerts=(
                Alert.TRAINING_OOM,
                Alert.TRAINING_OOM_RISK,
                Alert.TRAINING_MEMORY_FRAGMENTATION,
            ),
            signals=(
                OOM_EVENTS,
                OOM_RECOVERIES,
                MEMORY_ALLOCATED,
                MEMORY_RESERVED,
                MEMORY_CAPACITY,
                MEMORY_FRAGMENTATION,
                MEMORY_ALLOC_RETRIES,
            ),
            actions=(Action.SPLIT_MICRO_BATCHES, Action.RECOMMEND, Action.CHECKPOINT_NOW),
            triage=_TRIAGE + "oom:CudaOomDetector",
            diagnose=_DIAGNOSE + "oom:analyse",
        ),
        _failure(
            Failure.STRAGGLER,
            "One rank's local work is slower than the job's median and holds every rank back.",
            alerts=(Alert.TRAINING_STRAGGLER,),
            signals=(STEP_COMPUTE_DURATION, SYNC_WAIT_DURATION, STEP_PHASE_DURATION),
            actions=(Action.RECOMMEND, Action.EXCLUDE_NODE),
            triage=_TRIAGE + "straggler:StragglerDetector",
            diagnose=_DIAGNOSE + "straggler:analyse",
        ),
        _failure(
            Failure.JOB_SLOWDOWN,
            "Every rank slowed down together (no single straggler): input, network or model.",
            alerts=(),
            signals=(STEP_DURATION, STEPS),
            actions=(),
            triage=None,
            diagnose=_DIAGNOSE + "slowdown:analyse",
        ),
        _failure(
            Failure.DATALOADER_BOUND,
            "A rank spends a large share of its step waiting for its data loader.",
            alerts=(Alert.TRAINING_DATALOADER_BOUND,),
            signals=(STEP_PHASE_DURATION,),
            actions=(Action.RECOMMEND,),
            triage=None,
            diagnose=_DIAGNOSE + "dataloader:analyse",
        ),
        _failure(
            Failure.HANG,
            "A collective never completes, or no rank completes a step: the job is stuck.",
            alerts=(Alert.TRAINING_COLLECTIVE_STALLED, Alert.TRAINING_STALLED),
            signals=(
                COLLECTIVE_OLDEST_INFLIGHT,
                COLLECTIVES_LAUNCHED,
                COLLECTIVES_COMPLETED,
                LAST_STEP_TIMESTAMP,
            ),
            actions=(Action.DUMP_DIAGNOSTICS, Action.RESTART_FROM_CHECKPOINT),
            triage=None,
            diagnose=_DIAGNOSE + "hang:analyse",
        ),
        _failure(
            Failure.NCCL_TIMEOUT,
            "A collective ran past the process group's timeout and the watchdog aborted it.",
            alerts=(Alert.TRAINING_NCCL_TIMEOUT,),
            signals=(COLLECTIVE_TIMEOUTS,),
            actions=(Action.DUMP_DIAGNOSTICS, Action.RESTART_FROM_CHECKPOINT, Action.RECOMMEND),
            triage=_TRIAGE + "nccl_timeout:NcclTimeoutDetector",
            diagnose=_DIAGNOSE + "hang:analyse",
        ),
        _failure(
            Failure.NCCL_ERROR,
            "NCCL reported an error (NcclErrorKind), or fell back to TCP sockets.",
            alerts=(Alert.NCCL_SOCKET_TRANSPORT_FALLBACK,),
            signals=(NCCL_LOG_ERRORS, NCCL_INFO),
            actions=(Action.RECOMMEND,),
            triage=_TRIAGE + "nccl_error:NcclErrorDetector",
            diagnose=None,
        ),
        _failure(
            Failure.RANK_FAILURE,
            "A rank's process died or stopped answering (torchrun reports it as failed).",
            alerts=(Alert.TRAINING_RANK_DOWN, Alert.TRAINING_RANK_RESTARTED),
            signals=(RANK_INFO, ELASTIC_RESTARTS),
            actions=(Action.RESTART_FROM_CHECKPOINT, Action.RECOMMEND),
            triage=_TRIAGE + "elastic:ElasticFailureDetector",
            diagnose=_DIAGNOSE + "rank_failure:analyse",
        ),
        _failure(
            Failure.GPU_FAULT,
            "The GPU or its driver failed: an Xid, ECC errors, or NVML stopped answering.",
            alerts=(Alert.GPU_XID_ERROR, Alert.GPU_NVML_DOWN),
            signals=(
                GPU_XID_ERRORS,
                GPU_ECC_ERRORS,
                GPU_REMAPPED_ROWS,
                GPU_ROW_REMAP_FAILURE,
                NVML_UP,
            ),
            actions=(Action.DRAIN_NODE, Action.RECOMMEND),
            triage=_TRIAGE + "xid:XidDetector",
            diagnose=_DIAGNOSE + "gpu:analyse_faults",
        ),
        _failure(
            Failure.GPU_THROTTLING,
            "A GPU's clocks are held down (thermal, power brake, hardware slowdown).",
            alerts=(Alert.GPU_THERMAL_THROTTLING,),
            signals=(GPU_CLOCK_THROTTLED, GPU_TEMPERATURE),
            actions=(Action.RECOMMEND,),
            triage=None,
            diagnose=_DIAGNOSE + "gpu:analyse_throttling",
        ),
    )
}


def failure_of(alert: Alert) -> Failure:
    """The failure an alert reports (every alert belongs to exactly one)."""
    for spec in FAILURES.values():
        if alert in spec.alerts:
            return spec.failure
    raise KeyError(alert)


# --- spans ----------------------------------------------------------------------------------
INSTRUMENTATION_SCOPE = "trainguard.instrumentation"
SPAN_STEP = "trainguard.step"  # the step's root, emitted by rank 0
SPAN_RANK_STEP = "trainguard.rank_step"  # one per rank per step, child of the root
SPAN_FORWARD = "trainguard.forward"
SPAN_BACKWARD = "trainguard.backward"
SPAN_OPTIMIZER = "trainguard.optimizer"
SPAN_GRAD_SYNC = "trainguard.grad_sync"
SPAN_GRAD_SYNC_BUCKET = "trainguard.grad_sync.bucket"  # a DDP bucket or an FSDP unit
SPAN_PARAM_GATHER = "trainguard.param_gather"  # a step's parameter all-gathers (FSDP)
SPAN_PARAM_GATHER_UNIT = "trainguard.param_gather.unit"  # one all-gather, in bucket mode
# Collectives neither syncing gradients nor gathering parameters (tensor / pipeline parallel,
# the loop's own): one span per process group and operation per step, one per collective in
# bucket mode.
SPAN_COLLECTIVE = "trainguard.collective"

ATTR_JOB_ID = "trainguard.job_id"
ATTR_RANK = "trainguard.rank"
ATTR_LOCAL_RANK = "trainguard.local_rank"
ATTR_WORLD_SIZE = "trainguard.world_size"
ATTR_STEP = "trainguard.step"
ATTR_BUCKET_INDEX = "trainguard.bucket.index"
ATTR_BUCKET_BYTES = "trainguard.bucket.bytes"
ATTR_BACKEND = "trainguard.backend"
ATTR_NODE = "trainguard.node"
ATTR_PROCESS_GROUP = "trainguard.process_group"  # bounded name (see instrumentation.timeline)
ATTR_COLLECTIVE_OP = "trainguard.collective.op"
ATTR_COLLECTIVE_COUNT = "trainguard.collective.count"
ATTR_COLLECTIVE_BYTES = "trainguard.collective.bytes"

EXEMPLAR_TRACE_ID = "trace_id"

# --- event schema (ECS fields; see trainguard.events) --------------------------------------


class EventKind(str, enum.Enum):
    """What happened (``event.action``)."""

    OOM = "oom"
    OOM_RECOVERED = "oom_recovered"
    COLLECTIVE_STALLED = "collective_stalled"
    COLLECTIVE_TIMEOUT = "collective_timeout"
    STRAGGLER = "straggler"
    CHECKPOINT = "checkpoint"
    DIRECTIVE = "directive"
    INSTRUMENTED = "instrumented"
    UNINSTRUMENTED = "uninstrumented"
    INSTRUMENTATION_ERROR = "instrumentation_error"
    ALERT_RECEIVED = "alert_received"
    DECISION = "decision"
    ACTION = "action"


# Events that report a failure name it (``labels.failure``); decisions and actions name the
# failure of the alert they answer.
EVENT_FAILURE: dict[EventKind, Failure] = {
    EventKind.OOM: Failure.OOM,
    EventKind.OOM_RECOVERED: Failure.OOM,
    EventKind.COLLECTIVE_STALLED: Failure.HANG,
    EventKind.COLLECTIVE_TIMEOUT: Failure.NCCL_TIMEOUT,
    EventKind.STRAGGLER: Failure.STRAGGLER,
}


class EventOutcome(str, enum.Enum):
    SUCCESS = "success"
    FAILURE = "failure"
    UNKNOWN = "unknown"


# ECS field names used by events; labels.* carry our identity labels.
FIELD_EVENT_KIND = "event.kind"
FIELD_EVENT_CATEGORY = "event.category"
FIELD_EVENT_ACTION = "event.action"
FIELD_EVENT_OUTCOME = "event.outcome"
FIELD_EVENT_DATASET = "event.dataset"
FIELD_SERVICE_NAME = "service.name"
# service.name of trainguard's own service processes.
SERVICE_EXPORTER = "trainguard-exporter"
SERVICE_REMEDIATION = "trainguard-remediation"
FIELD_TRACE_ID = "trace.id"
FIELD_SPAN_ID = "span.id"
FIELD_LABELS_PREFIX = "labels."
FIELD_JOB_ID = FIELD_LABELS_PREFIX + LABEL_JOB_ID
FIELD_RANK = FIELD_LABELS_PREFIX + LABEL_RANK
FIELD_NODE = FIELD_LABELS_PREFIX + LABEL_NODE
FIELD_STEP = FIELD_LABELS_PREFIX + "step"
FIELD_FAILURE = FIELD_LABELS_PREFIX + "failure"
FIELD_DETAILS = "trainguard"  # event-specific details live under this object

# --- environment variables ------------------------------------------------------------------
ENV_JOB_ID = "TRAINGUARD_JOB_ID"
ENV_METRICS_PORT = "TRAINGUARD_METRICS_PORT"
ENV_METRICS_ADDR = "TRAINGUARD_METRICS_ADDR"
ENV_FILE_SD_DIR = "TRAINGUARD_FILE_SD_DIR"
ENV_DUMP_DIR = "TRAINGUARD_DUMP_DIR"
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


# --- Prometheus scrape jobs, recording rules and alert labels (alerts/, deploy/) -----------
# Scrape job names of deploy/prometheus.yml; rules select on them (``up{job=...}``).
SCRAPE_JOB_RANKS = "trainguard-ranks"
SCRAPE_JOB_EXPORTER = "trainguard-exporter"
SCRAPE_JOB_REMEDIATION = "trainguard-remediation"

# Recording rules, named level:metric:operation (the level is the set of labels kept).
REC_RANK_STEP_DURATION_MEAN = "rank:trainguard_step_duration_seconds:mean5m"
REC_RANK_COMPUTE_MEAN = "rank:trainguard_step_compute_duration_seconds:mean5m"
REC_RANK_SYNC_WAIT_MEAN = "rank:trainguard_sync_wait_duration_seconds:mean5m"
REC_RANK_PHASE_MEAN = "rank_phase:trainguard_step_phase_duration_seconds:mean5m"
REC_RANK_PHASE_COMPUTE_MEAN = "rank_phase:trainguard_step_compute_duration_seconds:mean5m"
REC_JOB_COMPUTE_MEDIAN = "job:trainguard_step_compute_duration_seconds:median5m"
REC_JOB_PHASE_COMPUTE_MEDIAN = "job_phase:trainguard_step_compute_duration_seconds:median5m"
REC_RANK_COMPUTE_RATIO = "rank:trainguard_step_compute_duration_seconds:ratio_to_job_median5m"
# Per rank, its phase with the most compute time over its job's median (the straggler's label).
REC_RANK_SLOWEST_PHASE = "rank:trainguard_step_compute_duration_seconds:slowest_phase5m"
REC_RANK_PHASE_COMPUTE_EXCESS = (
    "rank_phase:trainguard_step_compute_duration_seconds:excess_over_job_median5m"
)
REC_JOB_RANKS_REPORTING = "job:trainguard_step_compute_duration_seconds:ranks_reporting5m"
REC_JOB_GRAD_SYNC_P50 = "job:trainguard_grad_sync_duration_seconds:p50_5m"
REC_JOB_GRAD_SYNC_P99 = "job:trainguard_grad_sync_duration_seconds:p99_5m"
REC_RANK_GRAD_SYNC_MEAN = "rank:trainguard_grad_sync_duration_seconds:mean5m"
REC_JOB_STEP_DURATION_P99_1H = "job:trainguard_step_duration_seconds:p99_1h"
REC_RANK_DATA_WAIT_RATIO = "rank:trainguard_step_phase_duration_seconds:data_ratio5m"
REC_RANK_MEMORY_HEADROOM = "rank:trainguard_memory_reserved_bytes:headroom_ratio"
REC_RANK_STEPS_RATE = "rank:trainguard_steps:rate5m"
REC_JOB_STEPS_RATE = "job:trainguard_steps:rate5m"
REC_JOB_OLDEST_INFLIGHT = "job:trainguard_collective_oldest_inflight_seconds:max"
REC_JOB_STALL_THRESHOLD = "job:trainguard_collective_oldest_inflight_seconds:stall_threshold"
REC_JOB_COLLECTIVE_LAGGARD = "job:trainguard_collectives_launched:laggard_rank"
# The alerts' per-rank inputs over long windows, read from the ranks' raw series once per
# evaluation and kept only where non-zero (a healthy job records none of them): OOMs and their
# recoveries, collective timeouts and allocator retries in the alerts' windows, and the
# allocation a rank's trend reaches within the risk horizon where that is at its capacity.
REC_RANK_OOM_EVENTS = "rank:trainguard_oom_events:increase10m"
REC_RANK_OOM_RECOVERIES = "rank:trainguard_oom_recoveries:increase10m"
REC_RANK_COLLECTIVE_TIMEOUTS = "rank:trainguard_collective_timeouts:increase10m"
REC_RANK_ALLOC_RETRIES = "rank:trainguard_memory_alloc_retries:increase15m"
REC_RANK_MEMORY_AT_CAPACITY = "rank:trainguard_memory_allocated_bytes:predicted_at_capacity"
# Per-job bucket rates (the job's quantiles read these, never the ranks' raw buckets), and the
# job's newest last step with the rank whose last step is oldest (the stall alert reads these).
REC_JOB_STEP_DURATION_BUCKET_RATE = "job_le:trainguard_step_duration_seconds_bucket:rate5m"
REC_JOB_GRAD_SYNC_BUCKET_RATE = "job_le:trainguard_grad_sync_duration_seconds_bucket:rate5m"
REC_JOB_LAST_STEP = "job:trainguard_last_step_timestamp_seconds:max"
REC_JOB_STALEST_RANK = "job:trainguard_last_step_timestamp_seconds:stalest_rank"
# One series per job (per node) carrying the scheduler labels of its ranks' rank_info; both
# read the ranks' rank_info once, folded per job and node (a few series per node, not per rank).
REC_JOB_SCHEDULER = "job:trainguard_rank_info:scheduler_labels"
REC_JOB_NODE_SCHEDULER = "job_node:trainguard_rank_info:scheduler_labels"
# Reliability: success rate and MTTR over each window (the service's incident metrics).
RELIABILITY_WINDOWS: tuple[str, ...] = ("1h", "1d", "7d")
REC_FAILURE_SUCCESS_RATIO = {
    w: f"failure:trainguard_remediation_incidents:success_ratio{w}" for w in RELIABILITY_WINDOWS
}
REC_SUCCESS_RATIO = {
    w: f"remediation:trainguard_remediation_incidents:success_ratio{w}" for w in RELIABILITY_WINDOWS
}
REC_FAILURE_MTTR = {
    w: f"failure:trainguard_remediation_time_to_recover_seconds:mean{w}"
    for w in RELIABILITY_WINDOWS
}
REC_MTTR = {
    w: f"remediation:trainguard_remediation_time_to_recover_seconds:mean{w}"
    for w in RELIABILITY_WINDOWS
}
REC_NODE_SCHEDULER = "node:trainguard_rank_info:scheduler_labels"

# Labels and annotations every alert carries.
LABEL_SEVERITY = "severity"
ANNOTATION_SUMMARY = "summary"
ANNOTATION_DESCRIPTION = "description"
ANNOTATION_RUNBOOK_URL = "runbook_url"


class Severity(str, enum.Enum):
    """``severity`` of an alert: critical pages a human, warning goes to chat and remediation."""

    CRITICAL = "critical"
    WARNING = "warning"


# --- remediation service (emitted by trainguard.remediation) -------------------------------
LABEL_STATE = "state"
LABEL_ACTION = "action"
LABEL_EXECUTOR = "executor"
LABEL_OUTCOME = "outcome"
LABEL_STATUS = "status"

REMEDIATION_ALERTS_RECEIVED = _counter(
    "remediation_alerts_received_total",
    "Alerts received from Alertmanager and committed to the inbox, by status (firing|resolved).",
    (LABEL_STATUS,),
)
REMEDIATION_ALERTS_DEDUPLICATED = _counter(
    "remediation_alerts_deduplicated_total",
    "Alerts received again with a (fingerprint, startsAt) already stored.",
)
REMEDIATION_WEBHOOK_REJECTED = _counter(
    "remediation_webhook_rejected_total",
    "Requests refused before storage (reason: unauthorized|too_large|invalid|unavailable).",
    (LABEL_REASON,),
)
REMEDIATION_WEBHOOK_DURATION = _histogram(
    "remediation_webhook_duration_seconds",
    "Time from receiving a webhook to answering it, its commit to the inbox included.",
)
# The webhook's inbox (trainguard.remediation.inbox): notifications accepted, not yet decided.
REMEDIATION_INBOX_DEPTH = _gauge(
    "remediation_inbox_depth",
    "Notifications committed to the inbox and not yet decided (from the store).",
)
REMEDIATION_INBOX_OLDEST_AGE = _gauge(
    "remediation_inbox_oldest_age_seconds",
    "How long the oldest undecided notification has waited in the inbox; 0 when none does.",
)
REMEDIATION_INBOX_FAILED = _gauge(
    "remediation_inbox_failed",
    "Notifications that could not be decided, kept in the inbox with their error.",
)
REMEDIATION_DECISION_LAG = _histogram(
    "remediation_decision_lag_seconds",
    "Time from a notification's acceptance (the webhook's commit) to its decision.",
)
REMEDIATION_DECISIONS = _counter(
    "remediation_decisions_total",
    "Actions planned by the policy, by the state the guards put them in "
    "(queued, awaiting_approval, dry_run, suppressed, skipped).",
    (LABEL_ACTION, LABEL_STATE),
)
REMEDIATION_ACTIONS_EXECUTED = _counter(
    "remediation_actions_executed_total",
    "Actions carried out by an executor, by outcome (success|failure).",
    (LABEL_ACTION, LABEL_EXECUTOR, LABEL_OUTCOME),
)
REMEDIATION_ACTION_DURATION = _histogram(
    "remediation_action_duration_seconds",
    "Time an executor took to carry out an action.",
    (LABEL_EXECUTOR,),
)
REMEDIATION_ACTIONS = _gauge(
    "remediation_actions",
    "Actions in the store by state; queued + running is the executor queue depth.",
    (LABEL_STATE,),
)
REMEDIATION_CIRCUIT_BREAKERS_OPEN = _gauge(
    "remediation_circuit_breakers_open",
    "Jobs (or nodes) whose action budget tripped a circuit breaker awaiting a manual reset.",
)
REMEDIATION_DIRECTIVE_ACKS = _counter(
    "remediation_directive_acks_total",
    "Directive acknowledgements from ranks, by outcome (success|failure).",
    (LABEL_OUTCOME,),
)
REMEDIATION_DRY_RUN = _gauge(
    "remediation_dry_run", "1 while the service only records decisions (dry-run mode)."
)

# Incidents: what the verifier concluded after each repair (trainguard.remediation.verify).
LABEL_FAILURE = "failure"


class IncidentOutcome(str, enum.Enum):
    """How an incident ended: training recovered, did not, or is worse than when it started
    (more ranks down)."""

    RECOVERED = "recovered"
    NOT_RECOVERED = "not_recovered"
    WORSE = "worse"


class JobOutcome(str, enum.Enum):
    """Whether the job's training passed the step it had reached before the incident."""

    RESUMED = "resumed"
    LOST = "lost"


# The alert the service posts to Alertmanager when the last rung of a ladder did not recover a
# job: a page for a human, through the same routing, grouping and silences as every alert.
REMEDIATION_FAILED_ALERT = "TrainguardRemediationFailed"
LABEL_INCIDENT = "incident"
LABEL_RUNG = "rung"

REMEDIATION_INCIDENTS = _counter(
    "remediation_incidents_total",
    "Incidents closed, by failure and outcome (recovered|not_recovered|worse).",
    (LABEL_FAILURE, LABEL_OUTCOME),
)
REMEDIATION_INCIDENTS_OPEN = _gauge(
    "remediation_incidents_open",
    "Incidents being acted on or verified, by failure (from the store).",
    (LABEL_FAILURE,),
)
REMEDIATION_INCIDENT_JOBS = _counter(
    "remediation_incident_jobs_total",
    "Incidents closed, by whether the job's training passed its pre-incident step (resumed|lost).",
    (LABEL_FAILURE, LABEL_OUTCOME),
)
REMEDIATION_TIME_TO_DETECT = _histogram(
    "remediation_time_to_detect_seconds",
    "From the first evidence of a failure (its alert's pending start) to the service receiving "
    "the firing alert.",
    (LABEL_FAILURE,),
)
REMEDIATION_TIME_TO_ACT = _histogram(
    "remediation_time_to_act_seconds",
    "From the failure's detection (its alert firing) to the first repair carried out.",
    (LABEL_FAILURE, LABEL_ACTION),
)
REMEDIATION_TIME_TO_RECOVER = _histogram(
    "remediation_time_to_recover_seconds",
    "From the failure's detection to verified recovery (alert resolved and training past its "
    "pre-incident step), by the action that recovered it: the MTTR.",
    (LABEL_FAILURE, LABEL_ACTION),
)
REMEDIATION_ESCALATIONS = _counter(
    "remediation_escalations_total",
    "Rungs climbed: a repair that did not recover in time, and the action tried next.",
    (LABEL_FAILURE, LABEL_ACTION),
)

# --- discovery without a shared file system (Prometheus http_sd_configs) ---------------------
# Ranks and node exporters register their /metrics address with the remediation service, which
# serves each kind's live registrations as one HTTP SD target list at DISCOVERY_PATH/<kind>.
DISCOVERY_PATH = "/v1/discovery"


class DiscoveryKind(str, enum.Enum):
    """What registered a target: each kind is one target list and one scrape job."""

    RANKS = "ranks"
    EXPORTERS = "exporters"


DISCOVERY_SCRAPE_JOBS: dict[DiscoveryKind, str] = {
    DiscoveryKind.RANKS: SCRAPE_JOB_RANKS,
    DiscoveryKind.EXPORTERS: SCRAPE_JOB_EXPORTER,
}
# The remediation service's base URL the hook and the exporter register with; unset: they do
# not (file_sd alone). They present the token of TRAINGUARD_REMEDIATION_TOKEN.
ENV_DISCOVERY_URL = "TRAINGUARD_DISCOVERY_URL"
# How long a registration lives unless renewed; it is renewed every third of it.
ENV_DISCOVERY_TTL = "TRAINGUARD_DISCOVERY_TTL_SECONDS"
REMEDIATION_DISCOVERY_TARGETS = _gauge(
    "remediation_discovery_targets",
    "Targets registered for Prometheus' HTTP service discovery and not expired, by kind "
    "(ranks|exporters).",
    (LABEL_KIND,),
)

REMEDIATION_METRICS: tuple[MetricSpec, ...] = (
    REMEDIATION_ALERTS_RECEIVED,
    REMEDIATION_ALERTS_DEDUPLICATED,
    REMEDIATION_WEBHOOK_REJECTED,
    REMEDIATION_WEBHOOK_DURATION,
    REMEDIATION_INBOX_DEPTH,
    REMEDIATION_INBOX_OLDEST_AGE,
    REMEDIATION_INBOX_FAILED,
    REMEDIATION_DECISION_LAG,
    REMEDIATION_DECISIONS,
    REMEDIATION_ACTIONS_EXECUTED,
    REMEDIATION_ACTION_DURATION,
    REMEDIATION_ACTIONS,
    REMEDIATION_CIRCUIT_BREAKERS_OPEN,
    REMEDIATION_DIRECTIVE_ACKS,
    REMEDIATION_DRY_RUN,
    REMEDIATION_INCIDENTS,
    REMEDIATION_INCIDENTS_OPEN,
    REMEDIATION_INCIDENT_JOBS,
    REMEDIATION_TIME_TO_DETECT,
    REMEDIATION_TIME_TO_ACT,
    REMEDIATION_TIME_TO_RECOVER,
    REMEDIATION_ESCALATIONS,
    REMEDIATION_DISCOVERY_TARGETS,
)
# Read by the directive client of the training hook (the service reads the same variable).
ENV_REMEDIATION_TOKEN = "TRAINGUARD_REMEDIATION_TOKEN"

# --- logs (trainguard.logs; Filebeat and the direct Elasticsearch shipper) --------------------
# ECS fields every trainguard log record carries besides the event fields above.
FIELD_HOST_NAME = "host.name"
FIELD_DATA_STREAM_TYPE = "data_stream.type"
FIELD_DATA_STREAM_DATASET = "data_stream.dataset"
FIELD_DATA_STREAM_NAMESPACE = "data_stream.namespace"
# Logs land in the data streams logs-trainguard.<dataset>-<namespace>.
LOG_DATA_STREAM_PREFIX = "logs-trainguard"
# Where configure_logging writes its rotated NDJSON file when no path is given.
ENV_LOG_FILE = "TRAINGUARD_LOG_FILE"
# A folder for per-process ECS NDJSON logs (the demo trainer writes rank<N>.ndjson there).
ENV_LOG_DIR = "TRAINGUARD_LOG_DIR"
