"""The FastAPI application: wiring of settings, store, policy, executors and worker.

``create_app(settings)`` builds an app whose lifespan opens the store, starts the worker, the
verifier and the inbox's decider and closes them again; everything a request needs hangs off
``app.state.runtime`` and reaches the routes through the dependencies in
:mod:`trainguard.remediation.deps`.
"""

from __future__ import annotations

import asyncio
import gc
import json
import logging
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request
from fastapi.exception_handlers import request_validation_exception_handler
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from trainguard.remediation import api, discovery, reports
from trainguard.remediation.deps import Runtime
from trainguard.remediation.engine import Engine, Guards
from trainguard.remediation.executors import Executor, RecommendExecutor
from trainguard.remediation.executors.directive import DirectiveExecutor
from trainguard.remediation.executors.kubernetes import KubernetesExecutor, api_client_factory
from trainguard.remediation.executors.local import LocalExecutor
from trainguard.remediation.executors.page import PageExecutor
from trainguard.remediation.executors.slurm import SlurmExecutor
from trainguard.remediation.hub import DirectiveHub
from trainguard.remediation.inbox import Decider
from trainguard.remediation.metrics import Metrics
from trainguard.remediation.policy import load_policy
from trainguard.remediation.prometheus import PrometheusQuery, QueryFactory, prometheus_query
from trainguard.remediation.settings import Settings
from trainguard.remediation.store import Store, probe
from trainguard.remediation.verify import Deadlines, Verifier
from trainguard.remediation.worker import Worker
from trainguard.version import VERSION

log = logging.getLogger(__name__)

# Beyond one long-poll, the time a rank may take to poll again (network, a busy event loop)
# before its job's directives stop waiting for its acknowledgement.
LISTENING_GRACE_SECONDS = 5.0

ExecutorFactory = Callable[[Settings, Store, DirectiveHub], Mapping[str, Executor]]


def default_executors(
    settings: Settings, store: Store, hub: DirectiveHub
) -> Mapping[str, Executor]:
    """The executor registry: one executor per scheduler, plus directives, advice and pages."""
    kube_config = None if settings.kube_config is None else str(settings.kube_config)
    executors: list[Executor] = [
        LocalExecutor(),
        KubernetesExecutor(
            api_client_factory(kube_config, settings.kube_context),
            namespace=settings.kube_namespace,
            job_label=settings.kube_job_label,
            timeout=settings.executor_timeout_seconds,
        ),
        SlurmExecutor(settings.scontrol, settings.executor_timeout_seconds),
        DirectiveExecutor(
            store,
            hub.notify,
            hub.listening,
            ack_timeout=settings.directive_ack_timeout_seconds,
            settle=settings.directive_ack_settle_seconds,
        ),
        RecommendExecutor(),
        PageExecutor(
            store,
            settings.alertmanager_url,
            settings.incident_base_url(),
            settings.executor_timeout_seconds,
            settings.thresholds.runbook_base_url,
        ),
    ]
    return {executor.name: executor for executor in executors}


class BodyLimit:
    """Answers 413 to request bodies over the limit before any route reads them."""

    def __init__(self, app: ASGIApp, max_bytes: int, on_reject: Callable[[], None]) -> None:
        self.app = app
        self.max_bytes = max_bytes
        self.on_reject = on_reject

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        length = dict(scope["headers"]).get(b"content-length")
        if length is not None:
            if not length.isdigit() or int(length) > self.max_bytes:
                await self._reject(scope, receive, send)
                return
            await self.app(scope, receive, send)
            return
        # No declared length (chunked): read up to the limit, then replay what was read.
        chunks: list[bytes] = []
        size = 0
        more = True
        while more:
            message = await receive()
            if message["type"] != "http.request":
                break
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_bytes:
                await self._reject(scope, receive, send)
                return
            chunks.append(chunk)
            more = message.get("more_body", False)
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if replayed:
                return await receive()
            replayed = True
            return {"type": "http.request", "body": b"".join(chunks), "more_body": False}

        await self.app(scope, replay, send)

    async def _reject(self, scope: Scope, receive: Receive, send: Send) -> None:
        self.on_reject()
        body = json.dumps({"detail": f"request body larger than {self.max_bytes} bytes"})
        response = Response(body, status_code=413, media_type="application/json")
        await response(scope, receive, send)


def create_app(
    settings: Settings | None = None,
    executors: ExecutorFactory = default_executors,
    prometheus: QueryFactory = prometheus_query,
) -> FastAPI:
    """The service. Raises ConfigurationError / PolicyError when it could not run safely, and
    StoreError when its Postgres database cannot be reached. ``prometheus`` gives the
    verifier's queries (None: verified by alert resolution alone)."""
    settings = settings or Settings()
    token = settings.bearer_token()
    operator_token = settings.operator_bearer_token()
    policy = load_policy(settings.policy_file)
    thresholds = settings.thresholds
    database = settings.database()
    if isinstance(database, str):
        # Before serving: an unreachable server is a one-line error, not a lifespan traceback.
        probe(database)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        store = Store(database, synchronous=settings.sqlite_synchronous)
        metrics = Metrics(store, settings.dry_run)
        metrics.prime(policy)
        metrics.registry.register(discovery.TargetsCollector(store))
        hub = DirectiveHub(
            asyncio.get_running_loop(),
            listening_seconds=settings.long_poll_max_seconds + LISTENING_GRACE_SECONDS,
        )
        engine = Engine(
            policy,
            Guards(
                dry_run=settings.dry_run,
                require_approval=settings.require_approval,
                cooldown_seconds=settings.cooldown_seconds,
                budget_per_hour=settings.budget_per_hour,
                default_scheduler=settings.default_scheduler,
            ),
        )
        attacher = (
            reports.ReportAttacher(
                store,
                settings.diagnose_prometheus_url,
                thresholds,
                window_seconds=settings.diagnose_window_seconds,
                timeout_seconds=settings.diagnose_timeout_seconds,
                dumps_dir=settings.diagnose_dumps_dir,
            )
            if settings.diagnose_prometheus_url
            else None
        )
        worker = Worker(
            store,
            engine,
            executors(settings, store, hub),
            metrics,
            sweep_interval=settings.sweep_interval_seconds,
            takeover_grace=settings.takeover_grace_seconds if store.shared else 0.0,
            on_finished=attacher.submit if attacher is not None else None,
        )
        query = prometheus(settings)
        verifier = Verifier(
            store,
            engine,
            metrics,
            Deadlines.from_settings(settings),
            query,
            interval=settings.verify_interval_seconds,
            wake_worker=worker.wake,
        )
        decider = Decider(
            store,
            engine,
            metrics,
            wake_worker=worker.wake,
            decide_within=settings.decide_within_seconds,
        )
        app.state.runtime = Runtime(
            settings,
            token,
            operator_token,
            policy,
            store,
            engine,
            metrics,
            hub,
            worker,
            verifier,
            decider,
        )
        # What start-up built (the app, its models and routes, the policy, the tables) lives as
        # long as the service: out of the collector's sight, a full collection during an alert
        # storm no longer walks it, with the event loop held (50-70 ms, every few seconds).
        gc.freeze()
        worker.start()
        verifier.start()
        # Notifications a previous process accepted and did not decide come first.
        decider.start()
        if query is None:
            log.warning("no prometheus_url: repairs are verified by their alerts resolving alone")
        if token is None:
            log.warning("authentication is disabled (insecure_no_auth): development use only")
        if operator_token is None and not settings.insecure_no_auth:
            log.warning(
                "no operator token: approve, reject and breaker reset answer 403 until one is "
                "configured"
            )
        if settings.dry_run:
            log.warning("dry-run mode: decisions are recorded, no action is executed")
        try:
            yield
        finally:
            decider.stop()
            verifier.stop()
            worker.stop()
            if isinstance(query, PrometheusQuery):
                query.close()
            if attacher is not None:
                attacher.close()
            store.close()
            gc.unfreeze()

    app = FastAPI(
        title="trainguard remediation",
        version=VERSION,
        description="Alertmanager webhook -> policy -> guarded actions, with an audit trail.",
        lifespan=lifespan,
    )
    app.include_router(api.webhook)
    app.include_router(api.router)

    async def invalid(request: Request, exc: Exception) -> Response:
        runtime: Runtime | None = getattr(request.app.state, "runtime", None)
        if runtime is not None:
            runtime.metrics.webhook_rejected.labels("invalid").inc()
        if not isinstance(exc, RequestValidationError):
            raise exc
        return await request_validation_exception_handler(request, exc)

    app.add_exception_handler(RequestValidationError, invalid)

    def too_large() -> None:
        runtime: Runtime | None = getattr(app.state, "runtime", None)
        if runtime is not None:
            runtime.metrics.webhook_rejected.labels("too_large").inc()

    app.add_middleware(BodyLimit, max_bytes=settings.max_body_bytes, on_reject=too_large)
    return app
