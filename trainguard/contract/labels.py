"""Label names and the vocabularies of their values: identity, scheduler, phase, parallelism."""

from __future__ import annotations

import enum

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
LABEL_RESTARTS = "restarts"  # TrainingRankRestarted: the job's restart count it fired for
# TrainingStraggler: which of its two rules fired (the recent median's, or the 5-minute mean's
# which carries no such label), so that the two are two alerts, not one series twice.
LABEL_DETECTOR = "detector"
DETECTOR_RECENT = "recent"

# Labels every training-rank series carries; they identify the process.
RANK_IDENTITY_LABELS: tuple[str, ...] = (LABEL_JOB_ID, LABEL_RANK, LABEL_LOCAL_RANK, LABEL_NODE)

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

# GPU -> pod (the kubelet's pod-resources API) and GPU -> Slurm job (slurmd's cgroups).
LABEL_POD = "pod"
LABEL_CONTAINER = "container"
LABEL_RESOURCE = "resource"  # a device plugin's resource name, e.g. nvidia.com/gpu
LABEL_DEVICE_ID = "device_id"  # the device plugin's id: a GPU or MIG UUID, or an index
LABEL_SLURM_STEP_ID = "slurm_step_id"  # 0, 1, ..., batch, extern, interactive


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
