"""Span names and attribute keys of the hook's OpenTelemetry spans."""

from __future__ import annotations

import enum

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
# A step the watchdog found stalled: from the step's start to the stall's report, exported when
# the watchdog dumps (the step may never end), status ERROR, in the step's trace under the
# rank's span id for it.
SPAN_STALL = "trainguard.stall"

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
ATTR_GRAD_SYNC_TIMING = "trainguard.grad_sync.timing"  # a SyncTiming: where its bounds come from
ATTR_COLLECTIVE_SEQ = "trainguard.collective.seq"  # the stalled collective's sequence number
ATTR_STALL_AGE = "trainguard.stall.age_seconds"
ATTR_DUMP_DIR = "trainguard.dump_dir"


class SyncTiming(str, enum.Enum):
    """Where a ``trainguard.grad_sync`` span's start and end come from."""

    DDP_REDUCER = "ddp_reducer"  # DDP's reducer timers: the sync itself
    COMM_HOOK = "comm_hook"  # the per-bucket comm hook (per_bucket mode)
    TIMELINE = "timeline"  # the collective timeline (FSDP's reduce-scatters)
    # DDP synced, untimed: an iteration its sampling skipped (runtime_stats_every), or timers
    # this torch lacks. The span covers the backward pass, which the sync overlaps.
    UNTIMED = "untimed"
    # DDP's timers for the step were not yet read when its spans had to leave (flush,
    # uninstrument, exit, a stall): the backward pass's bounds too.
    UNREAD = "unread"


EXEMPLAR_TRACE_ID = "trace_id"
