"""``/metrics``, ``/healthz`` and ``/readyz``: the service's own health, for Prometheus and the
orchestrator."""

from __future__ import annotations

import asyncio

from fastapi import APIRouter, status
from fastapi.responses import PlainTextResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from trainguard.remediation.deps import MetricsDep, RuntimeDep, StoreDep, WorkerDep
from trainguard.remediation.store import StoreError

router = APIRouter(tags=["operations"])


@router.get("/metrics", response_class=PlainTextResponse)
def metrics_endpoint(metrics: MetricsDep) -> Response:
    return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)


@router.get("/healthz")
def healthz() -> dict[str, str]:
    """The process answers."""
    return {"status": "ok"}


@router.get("/readyz")
async def readyz(
    store: StoreDep, worker: WorkerDep, runtime: RuntimeDep, response: Response
) -> dict[str, str]:
    """The store commits (its savepoint reaches the database server), the worker, the verifier
    and the inbox's decider run."""
    problems = []
    if not worker.alive:
        problems.append("worker not running")
    if not runtime.decider.alive:
        problems.append("decider not running")
    if not runtime.verifier.alive:
        problems.append("verifier not running")
    try:
        await asyncio.wait_for(store.write(lambda conn: None), timeout=2.0)
    except (StoreError, TimeoutError) as exc:
        problems.append(f"store: {exc!r}")
    if problems:
        response.status_code = status.HTTP_503_SERVICE_UNAVAILABLE
        return {"status": "; ".join(problems)}
    return {"status": "ready"}
