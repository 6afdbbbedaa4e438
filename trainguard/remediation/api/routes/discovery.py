"""``/v1/discovery/<kind>``: Prometheus' HTTP service discovery of ranks and node exporters.

``GET`` is what ``http_sd_configs`` reads; ``POST`` registers or renews a target, ``DELETE``
withdraws it (see :mod:`trainguard.remediation.discovery`). The webhook token authenticates
all three: the ranks already hold it, and Prometheus presents it from a file
(``authorization: {credentials_file: ...}``).
"""

from __future__ import annotations

from functools import partial
from typing import Annotated

from fastapi import APIRouter, HTTPException, Query, status
from fastapi.responses import Response

from trainguard import contract
from trainguard.remediation import discovery
from trainguard.remediation.api.common import UNAVAILABLE
from trainguard.remediation.deps import Authenticated, MetricsDep, SettingsDep, StoreDep
from trainguard.remediation.discovery import Registered, Registration, TargetGroup
from trainguard.remediation.store import StoreError, UnstorableError

router = APIRouter(prefix=contract.DISCOVERY_PATH, dependencies=[Authenticated], tags=["discovery"])


@router.get(
    "/{kind}",
    response_model=list[TargetGroup],
    responses={status.HTTP_503_SERVICE_UNAVAILABLE: {"description": "the store cannot be read"}},
)
def targets(kind: contract.DiscoveryKind, store: StoreDep) -> Response:
    """The kind's live targets in Prometheus' HTTP SD format (``http_sd_configs``)."""
    try:
        body = store.read(partial(discovery.target_list, kind=kind))
    except StoreError as exc:
        raise HTTPException(status.HTTP_503_SERVICE_UNAVAILABLE, str(exc)) from exc
    return Response(body, media_type="application/json")


@router.post(
    "/{kind}",
    response_model=Registered,
    responses={status.HTTP_429_TOO_MANY_REQUESTS: {"description": "a registration bound"}},
)
async def register(
    kind: contract.DiscoveryKind,
    registration: Registration,
    store: StoreDep,
    settings: SettingsDep,
    metrics: MetricsDep,
) -> Registered:
    """Register a target, or renew it: it is served until ``expires_at`` (now + its TTL)."""
    limits = discovery.Limits.from_settings(settings)
    try:
        discovery.check_registration(kind, registration, limits)
        return await store.write(
            partial(discovery.register, kind=kind, registration=registration, limits=limits)
        )
    except discovery.LimitError as exc:
        raise HTTPException(status.HTTP_429_TOO_MANY_REQUESTS, str(exc)) from exc
    except (ValueError, UnstorableError) as exc:
        metrics.webhook_rejected.labels("invalid").inc()
        raise HTTPException(status.HTTP_422_UNPROCESSABLE_CONTENT, str(exc)) from exc
    except StoreError as exc:
        raise HTTPException(status.HTTP_503_SERVICE_UNAVAILABLE, UNAVAILABLE) from exc


@router.delete("/{kind}", status_code=status.HTTP_204_NO_CONTENT)
async def deregister(
    kind: contract.DiscoveryKind,
    target: Annotated[str, Query(min_length=1, max_length=262)],
    store: StoreDep,
) -> None:
    """Withdraw a target at once (a clean exit); 204 whether or not it was registered."""
    try:
        await store.write(partial(discovery.deregister, kind=kind, target=target))
    except StoreError as exc:
        raise HTTPException(status.HTTP_503_SERVICE_UNAVAILABLE, UNAVAILABLE) from exc
