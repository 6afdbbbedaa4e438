"""Span names and attribute keys of the hook's OpenTelemetry spans."""

from __future__ import annotations

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
