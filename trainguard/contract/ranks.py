"""The training ranks' metrics (emitted by ``trainguard.instrumentation``) and one rank's
series budget."""

from __future__ import annotations

from trainguard.contract.labels import (
    LABEL_BACKEND,
    LABEL_COMPONENT,
    LABEL_PARALLELISM,
    LABEL_PHASE,
    LABEL_TIMING_SOURCE,
    SCHEDULER_LABELS,
)
from trainguard.contract.metric import MetricSpec, counter, gauge, histogram, info

# --- training ranks (emitted by trainguard.instrumentation) --------------------------------
STEPS = counter("steps_total", "Training steps completed by this rank.")
STEP_DURATION = histogram(
    "step_duration_seconds",
    "Wall time of a whole training step (equal on every rank of a synchronous job).",
)
STEP_PHASE_DURATION = histogram(
    "step_phase_duration_seconds",
    "Wall time of one phase of a training step: data wait, forward, backward "
    "(including gradient sync) and optimizer.",
    (LABEL_PHASE,),
)
STEP_COMPUTE_DURATION = histogram(
    "step_compute_duration_seconds",
    "Local work of a step with no waiting on peers: data wait + forward compute + backward "
    "compute. The straggler signal. On DDP, the steps DDP's runtime statistics time "
    "(runtime_stats_every).",
)
# The timed steps a rank's recent compute share is taken over (as medians): those that ended in
# its last RECENT_COMPUTE_SECONDS, at least RECENT_COMPUTE_MIN_OBSERVATIONS of them however old,
# at most RECENT_COMPUTE_MAX_OBSERVATIONS however recent. More than twice the noise model's
# longest neighbour burst (20 s), so a burst only nudges the median; a lasting change moves it once
# it fills about half the window (docs/alerts.md#straggler-detection-fast-and-quiet).
RECENT_COMPUTE_SECONDS = 50.0
RECENT_COMPUTE_MIN_OBSERVATIONS = 16
RECENT_COMPUTE_MAX_OBSERVATIONS = 2048
# A rank's usual batch and usual step: the means of its input size and of its compute + sync
# wait over its last USUAL_OBSERVATIONS timed steps. Its recent compute is taken at the usual
# batch (compute per input element times it) and divided by the usual step. Many more steps than
# the recent window's, so that every rank of a job reads nearly the same of both: a median of 50
# sizes that vary by 8% varies by 1.5% itself, and the median of 50 steps of a large job, each
# as long as its slowest rank, jumps by a fifth when one more outlier step comes in; either would
# move one rank's share against its job's for as long as the ranks are read at different moments.
USUAL_OBSERVATIONS = 2048
STEP_COMPUTE_SHARE = gauge(
    "step_compute_share_ratio",
    f"The share of its step this rank spends on its own work over the timed steps of its last "
    f"{RECENT_COMPUTE_SECONDS:g} s (at least {RECENT_COMPUTE_MIN_OBSERVATIONS}): their median "
    "compute at the rank's usual batch (median compute per input element times mean input "
    f"elements) over its usual step (mean compute + sync wait of its last {USUAL_OBSERVATIONS} "
    "timed steps), as step_compute_duration_seconds and sync_wait_duration_seconds observe "
    f"them (0 until the rank has {RECENT_COMPUTE_SECONDS:g} s of such steps). The slowest rank "
    "waits least, so its share is the job's highest; a whole job slowing moves every rank's "
    "alike. The fast straggler signal.",
)
SYNC_WAIT_DURATION = histogram(
    "sync_wait_duration_seconds",
    "Time a step spent blocked on peers: the part of the gradient sync not overlapped with "
    "backward compute. On DDP, the steps DDP's runtime statistics time (runtime_stats_every).",
)
COLLECTIVES_LAUNCHED = counter(
    "collectives_launched_total",
    "Collectives this rank has launched (its collective sequence number).",
)
COLLECTIVES_COMPLETED = counter(
    "collectives_completed_total", "Collectives this rank has seen complete."
)
LAST_STEP_TIMESTAMP = gauge(
    "last_step_timestamp_seconds", "Unix time at which this rank last completed a step."
)
GRAD_SYNC_DURATION = histogram(
    "grad_sync_duration_seconds",
    "Duration of a gradient synchronisation (whole step by default, per bucket in bucket mode; "
    "on DDP by default, the steps DDP's runtime statistics time).",
)
GRAD_SYNC_BYTES = counter("grad_sync_bytes_total", "Gradient bytes synchronised by this rank.")
PARAM_GATHER_DURATION = histogram(
    "param_gather_duration_seconds",
    "Time spent all-gathering sharded parameters (FSDP): a whole step's all-gathers by "
    "default, one observation per FSDP unit in bucket mode.",
)
COLLECTIVE_INFLIGHT = gauge(
    "collective_inflight", "Collectives of this rank launched and not yet completed."
)
COLLECTIVE_OLDEST_INFLIGHT = gauge(
    "collective_oldest_inflight_seconds",
    "Age of this rank's oldest collective that has not completed (0 when none).",
)
COLLECTIVE_TIMEOUTS = counter(
    "collective_timeouts_total",
    "Collectives of this rank that ran past their process group's timeout.",
)
COLLECTIVE_STALLS = counter(
    "collective_stalls_total",
    "Stalls detected by the collective watchdog (oldest in-flight collective past the stall "
    "threshold); one per stall.",
)
MEMORY_ALLOCATED = gauge("memory_allocated_bytes", "Memory held by live tensors (CUDA) or RSS.")
MEMORY_RESERVED = gauge(
    "memory_reserved_bytes", "Memory reserved by the caching allocator (CUDA) or RSS."
)
MEMORY_CAPACITY = gauge(
    "memory_capacity_bytes", "Total device memory (CUDA) or the cgroup/host memory limit."
)
MEMORY_FRAGMENTATION = gauge(
    "memory_fragmentation_ratio",
    "Share of reserved memory not held by tensors: (reserved - allocated) / reserved.",
)
MEMORY_ALLOC_RETRIES = counter(
    "memory_alloc_retries_total",
    "cudaMalloc retries after the allocator freed its cache (a sign of memory pressure).",
)
OOM_EVENTS = counter("oom_events_total", "Out-of-memory errors seen inside a training step.")
OOM_RECOVERIES = counter(
    "oom_recoveries_total", "Steps that succeeded after an OOM by splitting into micro-batches."
)
INSTRUMENTATION_ERRORS = counter(
    "instrumentation_errors_total",
    "Failures inside trainguard's own instrumentation (caught; training went on).",
    (LABEL_COMPONENT,),
)
SPANS_DROPPED = counter(
    "spans_dropped_total", "Spans that could not be exported (endpoint down, queue full)."
)

RANK_INFO = info(
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
TRAINING_STEP = gauge(
    "step",
    "The training step this rank last completed, the job's own numbering (it continues from "
    "instrument(start_step=...) after a restart from a checkpoint).",
)
WORLD_SIZE = gauge("world_size", "Ranks in this rank's job as it last formed.")
RANK_INDEX = gauge(
    "rank_index", "This process's rank, as a value (the rules compare it with world_size)."
)
ELASTIC_RESTARTS = gauge(
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
    STEP_COMPUTE_SHARE,
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
RANK_SERIES_BUDGET = 82
# With the detail on: the bound the same test holds the detailed exposition to.
RANK_DETAIL_SERIES_BUDGET = 132
