"""``/v1/breakers``: the circuit breakers a budget tripped, and an operator's reset of one."""

from __future__ import annotations

import logging
from typing import Annotated

from fastapi import Path, status

from trainguard.remediation import operators, queries
from trainguard.remediation.api.common import audit_router, commit_decision, operator_router
from trainguard.remediation.deps import StoreDep
from trainguard.remediation.models import BreakerList

log = logging.getLogger(__name__)

audit = audit_router(tags=["guards"])
operator = operator_router(tags=["guards"])


@audit.get("/breakers", response_model=BreakerList)
def list_breakers(store: StoreDep) -> BreakerList:
    """Jobs (or ``node:<name>``) whose action budget tripped their circuit breaker."""
    return BreakerList(breakers=store.read(queries.breakers))


@operator.post("/breakers/{subject}/reset", status_code=status.HTTP_204_NO_CONTENT)
async def reset_breaker(subject: Annotated[str, Path(max_length=256)], store: StoreDep) -> None:
    """Close a tripped circuit breaker (the manual reset it waits for)."""
    await commit_decision(store, operators.reset_breaker(subject))
    log.warning("circuit breaker for %s reset", subject)
