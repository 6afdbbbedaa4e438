"""``/v1/directives``: the ranks' long poll for what the service asks of them, and their
acknowledgements."""

from __future__ import annotations

import time
from functools import partial
from typing import Annotated

from fastapi import Query, status
from fastapi.concurrency import run_in_threadpool

from trainguard.remediation import operators, queries
from trainguard.remediation.api.common import ActionId, commit_decision, v1_router
from trainguard.remediation.deps import HubDep, MetricsDep, SettingsDep, StoreDep, WorkerDep
from trainguard.remediation.models import DirectiveAck, DirectiveList

router = v1_router(tags=["directives"])


@router.get("/directives", response_model=DirectiveList)
async def directives(
    job_id: Annotated[str, Query(min_length=1, max_length=256)],
    rank: Annotated[int, Query(ge=0, le=2**31)],
    store: StoreDep,
    hub: HubDep,
    settings: SettingsDep,
    wait: Annotated[float, Query(ge=0, le=3600, description="Long-poll seconds.")] = 25.0,
) -> DirectiveList:
    """Directives for this rank not yet acknowledged; waits up to ``wait`` s for one."""
    deadline = time.monotonic() + min(wait, settings.long_poll_max_seconds)
    # Seen as the poll starts and as it ends: a rank that keeps polling is never unseen for
    # longer than one long-poll, so directives for every rank wait for its acknowledgement.
    hub.seen(job_id, rank)
    try:
        while True:
            version = hub.version(job_id)
            found = await run_in_threadpool(
                store.read,
                partial(
                    queries.pending_directives,
                    job_id=job_id,
                    rank=rank,
                    since=time.time() - settings.directive_ttl_seconds,
                ),
            )
            remaining = deadline - time.monotonic()
            if found or remaining <= 0:
                return DirectiveList(directives=found)
            await hub.wait(job_id, version, remaining)
    finally:
        hub.seen(job_id, rank)


@router.post("/directives/{directive_id}/ack", status_code=status.HTTP_204_NO_CONTENT)
async def ack_directive(
    directive_id: ActionId,
    ack: DirectiveAck,
    store: StoreDep,
    metrics: MetricsDep,
    worker: WorkerDep,
) -> None:
    """A rank has carried out (or failed to carry out) a directive."""
    action_id = await commit_decision(store, operators.ack(directive_id, ack))
    metrics.directive_acks.labels(ack.outcome.value).inc()
    if action_id is not None:
        # The action waits for acknowledgements: it may be done now, and the next step free.
        worker.acknowledged(action_id)
