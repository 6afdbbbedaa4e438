"""``trainguard.instrument``: the hook on a training rank, and its installation.

:class:`Instrumentation` puts the parts together and takes them apart again: the wrappers on the
training thread that time each step (:mod:`.steps`), the worker thread that turns each step into
metrics and spans (:mod:`.worker`), the OOM guard (:mod:`.oom`), the collective watchdog
(:mod:`.watchdog`), the ``/metrics`` endpoint and its announcement, and the directive client
with the table of what the hook does with each directive (:mod:`.handlers`). The same hook
serves DDP, FSDP2, FSDP1 and plain modules (:mod:`.parallel` tells them apart). Everything is
undone by :meth:`Instrumentation.uninstrument`, and nothing inside may crash or stall training
(see :mod:`.errors`).
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import threading
from collections.abc import Callable, Iterable, Iterator
from dataclasses import replace
from typing import Any, TypeVar

import torch
import torch.distributed as dist
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SpanExporter
from prometheus_client import CollectorRegistry
from torch.nn.parallel import DistributedDataParallel

from trainguard import contract, correlation
from trainguard.discovery import Registration
from trainguard.events import log_event
from trainguard.instrumentation import flight_recorder, handlers, parallel, tracing
from trainguard.instrumentation.comm_hook import BucketTimer, CommHook
from trainguard.instrumentation.config import (
    Identity,
    InstrumentationConfig,
    default_store,
    job_id_from_rank0,
)
from trainguard.instrumentation.directives import Directive, DirectiveCallback, DirectiveClient
from trainguard.instrumentation.discovery import COMPONENT as DISCOVERY
from trainguard.instrumentation.discovery import register_rank
from trainguard.instrumentation.errors import ErrorBudget
from trainguard.instrumentation.memory import MemorySampler
from trainguard.instrumentation.metrics import CollectiveProgressCollector, RankMetrics
from trainguard.instrumentation.oom import OomGuard
from trainguard.instrumentation.reducer import (
    TimerReads,
    logging_data_reader,
    reducer_stats_supported,
)
from trainguard.instrumentation.server import (
    MetricsEndpoint,
    scrape_target,
    serve_metrics,
    write_file_sd,
)
from trainguard.instrumentation.steps import StepRecorder
from trainguard.instrumentation.timeline import INTERCEPTOR, Timeline
from trainguard.instrumentation.watchdog import CollectiveWatchdog, StallReport, StepClock
from trainguard.instrumentation.worker import StepWorker

logger = logging.getLogger("trainguard.instrumentation")

T = TypeVar("T")

# torch's default DDP runtime-stats sample rate, restored on uninstrument.
DDP_DEFAULT_SAMPLE_RATE = 100
_ATTACHED = "_trainguard_instrumentation"
_BUCKET_TIMER = "_trainguard_bucket_timer"
# How long a stall's spans, and the last steps' at exit, may take to leave.
STALL_EXPORT_SECONDS = 2.0
EXIT_EXPORT_SECONDS = 5.0


class Instrumentation:
    """The handle :func:`instrument` returns; :meth:`uninstrument` undoes everything."""

    def __init__(
        self,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer | None,
        config: InstrumentationConfig,
        *,
        registry: CollectorRegistry | None,
        span_exporter: SpanExporter | None,
        comm_hook: CommHook | None,
        comm_hook_state: Any,
        on_directive: DirectiveCallback | None = None,
    ) -> None:
        self.model = model
        self.optimizer = optimizer
        self.config = config
        distributed = dist.is_available() and dist.is_initialized()
        self.backend = str(dist.get_backend()) if distributed else "none"
        self.device = parallel.device_of(model)
        store = default_store() if distributed else None
        self.identity: Identity = config.resolve_identity(
            world_size=dist.get_world_size() if distributed else 1,
            rank=dist.get_rank() if distributed else None,
            agree_job_id=(job_id_from_rank0(store, dist.get_rank()) if store is not None else None),
            device_index=self.device.index if self.device.type == "cuda" else None,
        )
        self.placement = config.resolve_placement()
        if self.placement.scheduler == contract.SCHEDULER_KUBERNETES and not config.node_is_set():
            # A pod's host name is the pod's name: exclude_node would cordon a node that does
            # not exist, and the rank's series would not meet its GPU's on the node label.
            logger.warning(
                "on Kubernetes the node label defaults to the pod's host name %r; set %s from "
                "spec.nodeName (the downward API) so that node alerts and exclude_node find "
                "the node",
                self.identity.node,
                contract.ENV_NODE,
            )
        labels = self.identity.labels()
        self.registry = registry if registry is not None else CollectorRegistry()
        self.metrics = RankMetrics(self.registry, labels, detail=config.resolved_metrics_detail())
        self.errors = ErrorBudget(self.metrics.instrumentation_errors, labels)
        self.ddp = model if isinstance(model, DistributedDataParallel) else None
        self.parallelism = parallel.detect(model)
        self.timing_source = contract.TimingSource.WALL_CLOCK

        self._active = False
        self._lock = threading.Lock()
        self._comm_hook = comm_hook
        self._comm_hook_state = comm_hook_state
        self._span_exporter = span_exporter
        self._bucket_timer: BucketTimer | None = None
        self._tracer_provider: TracerProvider | None = None
        self._exporter_logs: tracing.ExporterLogLimiter | None = None
        self._endpoint: MetricsEndpoint | None = None
        self._registration: Registration | None = None
        self._watchdog: CollectiveWatchdog | None = None
        self._worker: StepWorker | None = None
        self._on_directive = on_directive
        self._directives: DirectiveClient | None = None
        self._progress_collector: CollectiveProgressCollector | None = None
        # One bound method object, so that uninstrument withdraws exactly what was published.
        self._log_trace_ids_ref = self.log_trace_ids

        self.clock = StepClock(step=config.start_step)
        self.oom_guard = OomGuard(
            model,
            self.parallelism,
            self.device,
            recover=config.oom_recovery,
            split_max=config.oom_split_max,
            distributed=self.backend != "none",
            identity=self.identity,
            metrics=self.metrics,
            errors=self.errors,
            clock=self.clock,
        )
        self.steps = StepRecorder(
            self.clock, self.errors, self.oom_guard.on_oom, config.work_from_inputs
        )

    # -- public -------------------------------------------------------------------------------
    @property
    def active(self) -> bool:
        return self._active

    @property
    def step(self) -> int:
        """The number of the step in progress (or the next one)."""
        return self.clock.step

    def set_step(self, step: int) -> None:
        """Continue numbering from ``step`` (after resuming from a checkpoint), so trace ids
        stay consistent across ranks and restarts."""
        self.clock.step = step
        # Once, not per step: the job's step is the checkpoint's until a step ends here.
        self.metrics.training_step.set(step)

    @property
    def micro_batches(self) -> int:
        """How many micro-batches :meth:`guarded_step` splits a batch into now."""
        return self.oom_guard.split

    @property
    def metrics_port(self) -> int | None:
        return self._endpoint.port if self._endpoint is not None else None

    @property
    def watchdog(self) -> CollectiveWatchdog | None:
        return self._watchdog

    def trace_id(self, step: int) -> str:
        """The trace id (hex) of ``step``: the same on every rank."""
        return tracing.format_trace_id(tracing.trace_id_for(self.identity.job_id, step))

    def record_checkpoint(self, path: str | os.PathLike[str], *, step: int | None = None) -> None:
        """Log a ``checkpoint`` event: the training loop saved a checkpoint of ``step`` (by
        default the last finished one) to ``path``, so restarts and their MTTR can be read
        against the checkpoints in the logs."""
        saved = self.clock.step - 1 if step is None else step
        with self.errors.guard("events"):
            log_event(
                f"checkpoint of step {saved} saved to {path}",
                contract.EventKind.CHECKPOINT,
                level=logging.INFO,
                **self.identity.event_fields(),
                step=saved,
                trace_id=self.trace_id(saved),
                outcome=contract.EventOutcome.SUCCESS,
                details={"path": os.fspath(path)},
            )

    def log_trace_ids(self) -> tuple[str, str]:
        """The trace and span ids that records logged now carry: this rank's span of the step
        in progress (``trainguard.correlation``; the ECS logging filter reads them)."""
        job_id, step = self.identity.job_id, self.clock.step
        return (
            tracing.format_trace_id(tracing.trace_id_for(job_id, step)),
            tracing.format_span_id(tracing.rank_span_id_for(job_id, step, self.identity.rank)),
        )

    def flush(self, timeout: float = 10.0) -> bool:
        """Wait until every finished step is in the metrics (and its spans queued)."""
        if self._worker is None:
            return True
        self.steps.hand_over_timers()
        return self._worker.flush(timeout)

    def force_flush_spans(self, timeout_millis: int = 10_000) -> bool:
        self.flush()
        if self._tracer_provider is None:
            return True
        return self._tracer_provider.force_flush(timeout_millis)

    def wrap_dataloader(self, loader: Iterable[T]) -> Iterator[T]:
        """Iterate ``loader``, timing each fetch as the step's data wait.

        Without it, the data wait is the gap between one step's end and the next forward.
        """
        return self.steps.wrap_dataloader(loader)

    def uninstrument(self) -> None:
        """Undo every wrap, stop the threads and the server; safe to call more than once."""
        with self._lock:
            if not self._active:
                return
            self._active = False
        self.steps.active = False
        atexit.unregister(self._export_at_exit)
        self.steps.unwrap(self.model, self.optimizer)
        if self.steps.timeline is not None:
            INTERCEPTOR.detach(self.steps.timeline)
        if self._bucket_timer is not None:
            self._bucket_timer.active = False
        if self.ddp is not None and reducer_stats_supported(self.ddp):
            with self.errors.guard("reducer_stats"):
                self.ddp._set_ddp_runtime_logging_sample_rate(DDP_DEFAULT_SAMPLE_RATE)
        if self._directives is not None:
            self._directives.stop(timeout=1.0)
            self._directives = None
        if self._watchdog is not None:
            self._watchdog.stop()
        if self._worker is not None:
            self.steps.hand_over_timers()
            self._worker.stop()
        if self._tracer_provider is not None:
            with self.errors.guard("tracing"):
                self._tracer_provider.shutdown()
        if self._exporter_logs is not None:
            self._exporter_logs.detach()
            self._exporter_logs = None
        if self._registration is not None:
            # Withdrawn before the endpoint closes: Prometheus drops the target at its next
            # refresh instead of seeing it down.
            with self.errors.guard(DISCOVERY):
                self._registration.stop()
            self._registration = None
        if self._endpoint is not None:
            with self.errors.guard("metrics_server"):
                self._endpoint.close()
            self._endpoint = None
        if self.model.__dict__.get(_ATTACHED) is self:
            del self.model.__dict__[_ATTACHED]
        correlation.withdraw(self._log_trace_ids_ref)
        # The registry may be shared (prometheus' global one): instrumenting it again works.
        if self._progress_collector is not None:
            with contextlib.suppress(KeyError):
                self.registry.unregister(self._progress_collector)
        self.metrics.release()
        log_event(
            "trainguard instrumentation removed",
            contract.EventKind.UNINSTRUMENTED,
            level=logging.INFO,
            **self.identity.event_fields(),
            outcome=contract.EventOutcome.SUCCESS,
        )

    def guarded_step(
        self,
        batch: Any,
        loss_fn: Callable[[Any], torch.Tensor],
        *,
        loss_is_mean: bool = True,
    ) -> torch.Tensor:
        """Forward and backward of one step, recovering from OOM by splitting (see :mod:`.oom`).

        ``loss_fn(micro_batch)`` runs the model and returns the loss. Gradients must be zero
        (or ``None``) on entry; the caller still calls ``optimizer.step()``. Without
        ``oom_recovery`` in the config an OOM is reported and re-raised. Returns the step's
        loss (detached).
        """
        return self.oom_guard.run_step(batch, loss_fn, loss_is_mean=loss_is_mean)

    # -- installation -------------------------------------------------------------------------
    def _install(self) -> None:
        cfg = self.config
        per_bucket = cfg.resolved_per_bucket()
        if self.ddp is not None and per_bucket:
            self._install_bucket_timer(self.ddp)
        elif self._comm_hook is not None:
            raise ValueError("comm_hook is only composed in per_bucket mode on a DDP model")
        roles = None
        if self.backend != "none":
            candidate = Timeline(self.errors)
            if INTERCEPTOR.attach(candidate):
                self.steps.timeline = candidate
                INTERCEPTOR.current = candidate
                roles = parallel.roles(self.model, self.parallelism)
                self.timing_source = contract.TimingSource.COLLECTIVE_TIMELINE
            else:
                logger.warning(
                    "trainguard: this torch.distributed has none of the collective functions "
                    "the timeline wraps; compute time falls back to wall-clock phases, which "
                    "include waiting on peers"
                )
        if self.ddp is not None and reducer_stats_supported(self.ddp):
            every = max(1, cfg.runtime_stats_every)
            self.ddp._set_ddp_runtime_logging_sample_rate(every)
            self.steps.timer_reads = TimerReads(self.ddp, logging_data_reader(self.ddp), every)
            self.timing_source = contract.TimingSource.DDP_REDUCER
        elif self.ddp is not None:
            self.timing_source = contract.TimingSource.WALL_CLOCK
            logger.warning(
                "trainguard: this torch's DDP has no runtime timers; compute time falls back "
                "to wall-clock phases, which include waiting on peers"
            )
        self._publish_rank_info()
        self._publish_membership()
        ids = None
        if self._span_exporter is not None or cfg.resolved_tracing():
            with self.errors.guard("tracing"):
                exporter = self._span_exporter or tracing.default_exporter()
                self._tracer_provider, ids = tracing.build_provider(
                    {
                        contract.ATTR_JOB_ID: self.identity.job_id,
                        contract.ATTR_RANK: self.identity.rank,
                        contract.ATTR_NODE: self.identity.node,
                    },
                    exporter,
                    self.metrics.spans_dropped,
                    lambda error: self.errors.record("tracing", error),
                )
                self._exporter_logs = tracing.ExporterLogLimiter()
                self._exporter_logs.attach()
        memory = None
        with self.errors.guard("memory"):
            memory = MemorySampler(self.device, self.config.resolved_memory_capacity())
        self._worker = StepWorker(
            identity=self.identity,
            metrics=self.metrics,
            errors=self.errors,
            memory=memory,
            ddp_timers=self.steps.timer_reads is not None,
            tracer_provider=self._tracer_provider,
            ids=ids,
            backend=self.backend,
            on_allocator_oom=self.oom_guard.on_allocator_oom,
            roles=roles,
            per_bucket=per_bucket,
            on_timers_lost=self._on_timers_lost,
            recent_seconds=cfg.recent_compute_seconds,
        )
        self._worker.start()
        self.steps.worker = self._worker
        self.steps.bucket_timer = self._bucket_timer
        self._progress_collector = CollectiveProgressCollector(
            self.identity.labels(),
            self._collective_progress,
            lambda error: self.errors.record("collective_progress", error),
        )
        self.registry.register(self._progress_collector)
        distributed = self.backend != "none"
        if cfg.watchdog and distributed and flight_recorder.flight_recorder_available():
            self._watchdog = CollectiveWatchdog(
                identity=self.identity,
                metrics=self.metrics,
                errors=self.errors,
                clock=self.clock,
                dump_dir=cfg.resolved_dump_dir(),
                stall_floor_seconds=cfg.resolved_stall_floor(),
                stall_factor=cfg.stall_factor,
                interval_seconds=cfg.watchdog_interval_seconds,
                store=default_store(),
                on_stall=self._export_stall,
            )
            self._watchdog.start()
        self.steps.wrap(self.model, self.optimizer)
        # After the tracer provider is built: exit handlers run last-registered first, so this
        # one hands the spans over before the provider's own shuts it down.
        atexit.register(self._export_at_exit)
        correlation.publish(self._log_trace_ids_ref)
        self._active = self.steps.active = True
        self._serve()
        url = cfg.resolved_remediation_url()
        if url is not None:
            self._directives = DirectiveClient(
                url,
                self.identity.job_id,
                self.identity.rank,
                self._handle_directive,
                token=os.environ.get(contract.ENV_REMEDIATION_TOKEN) or None,
            )
            self._directives.start()
        log_event(
            f"trainguard instrumentation active (job {self.identity.job_id}, rank "
            f"{self.identity.rank}/{self.identity.world_size}, /metrics port {self.metrics_port})",
            contract.EventKind.INSTRUMENTED,
            level=logging.INFO,
            **self.identity.event_fields(),
            outcome=contract.EventOutcome.SUCCESS,
            details={"per_bucket": per_bucket, "tracing": self._tracer_provider is not None},
        )

    def _publish_rank_info(self) -> None:
        self.metrics.rank_info.info(
            {
                contract.LABEL_BACKEND: self.backend,
                "world_size": str(self.identity.world_size),
                "device": str(self.device),
                contract.LABEL_PARALLELISM: self.parallelism.value,
                contract.LABEL_TIMING_SOURCE: self.timing_source.value,
                **self.placement.labels(),
            }
        )

    def _publish_membership(self) -> None:
        """Where this rank stands in its job, as values: the rules tell a rank removed on
        purpose (its index at or above the world size the job re-formed with) from a member
        that died. The step starts at ``start_step``, so a job restarted from a checkpoint
        reports the checkpoint's step until its first step here ends."""
        self.metrics.world_size.set(self.identity.world_size)
        self.metrics.rank_index.set(self.identity.rank)
        self.metrics.elastic_restarts.set(int(os.environ.get("TORCHELASTIC_RESTART_COUNT") or 0))
        self.metrics.training_step.set(self.clock.step)

    def _export_stall(self, report: StallReport) -> None:
        """The watchdog dumped a stalled step (its thread): its spans and its forerunners'
        leave now, not at a flush that may never come (a hung job is killed)."""
        worker, provider = self._worker, self._tracer_provider
        if worker is None or provider is None:
            return
        worker.submit_stall(report)
        worker.flush(STALL_EXPORT_SECONDS)
        provider.force_flush(int(STALL_EXPORT_SECONDS * 1000))

    def _export_at_exit(self) -> None:
        """The interpreter exits without ``uninstrument()``: every step that ran leaves (its
        metrics, its spans), within :data:`EXIT_EXPORT_SECONDS`. The targets stay registered:
        a process that exits this way may have crashed, and Prometheus must see it down. The
        watchdog, which polls the job's store, stops first: not while the interpreter ends."""
        with self.errors.guard("exit"):
            if self._watchdog is not None:
                self._watchdog.stop(timeout=1.0)
            if self._worker is not None:
                self._worker.stop(timeout=EXIT_EXPORT_SECONDS)
            if self._tracer_provider is not None:
                self._tracer_provider.force_flush(int(EXIT_EXPORT_SECONDS * 1000))

    def _on_timers_lost(self) -> None:
        """DDP's timers were given up on (worker thread): stop reading them, say so in
        ``rank_info``."""
        self.steps.timer_reads = None
        self.timing_source = contract.TimingSource.WALL_CLOCK
        with self.errors.guard("rank_info"):
            self._publish_rank_info()

    def _install_bucket_timer(self, ddp: DistributedDataParallel) -> None:
        existing = ddp.__dict__.get(_BUCKET_TIMER)
        if isinstance(existing, BucketTimer):
            # DDP cannot unregister a comm hook: a previous instrumentation's timer is reused.
            existing.active = True
            self._bucket_timer = existing
            return
        if getattr(ddp, "_comm_hooks", None):
            raise ValueError(
                "this DDP model already has a comm hook and DDP accepts only one; pass it to "
                "instrument(..., comm_hook=...) instead of registering it, and trainguard "
                "composes it with the per-bucket timer"
            )
        timer = BucketTimer(self.errors, self._comm_hook, self._comm_hook_state, ddp.process_group)
        ddp.register_comm_hook(None, timer.hook)
        ddp.__dict__[_BUCKET_TIMER] = timer
        self._bucket_timer = timer

    def _serve(self) -> None:
        port = self.config.resolved_metrics_port()
        if port < 0:
            return
        addr = self.config.resolved_metrics_addr()
        with self.errors.guard("metrics_server"):
            base = port + self.identity.local_rank if port else 0
            self._endpoint = serve_metrics(self.registry, addr, base)
        if self._endpoint is None:
            return
        # One target and one set of labels for every way of announcing it.
        target = scrape_target(addr, self._endpoint.port)
        labels = self.identity.labels()
        sd_dir = self.config.resolved_file_sd_dir()
        if sd_dir is not None:
            with self.errors.guard("file_sd"):
                self._endpoint.file_sd_path = write_file_sd(
                    sd_dir, f"{self.identity.job_id}-rank{self.identity.rank}", target, labels
                )
        url = self.config.resolved_discovery_url()
        if url is not None:
            with self.errors.guard(DISCOVERY):
                self._registration = register_rank(
                    url,
                    target,
                    labels,
                    self.config.resolved_discovery_ttl(),
                    self.errors,
                    self.metrics.instrumentation_errors,
                )

    def _collective_progress(self) -> tuple[int, int] | None:
        if self.backend != "none" and flight_recorder.flight_recorder_available():
            progress = flight_recorder.collective_progress(
                flight_recorder.read_state(only_active=True, include_collectives=False)
            )
            if progress is not None:
                return progress
        if self._worker is None or self.ddp is None:
            return None
        synced = self._worker.buckets_synced
        return synced, synced

    # -- directives from the remediation service (on the directive client's thread) ----------
    def _handle_directive(self, directive: Directive) -> None:
        handlers.handle(self, directive, self._on_directive)


def instrument(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer | None = None,
    *,
    job_id: str | None = None,
    config: InstrumentationConfig | None = None,
    registry: CollectorRegistry | None = None,
    span_exporter: SpanExporter | None = None,
    comm_hook: CommHook | None = None,
    comm_hook_state: Any = None,
    on_directive: DirectiveCallback | None = None,
    **settings: Any,
) -> Instrumentation:
    """Instrument ``model`` and ``optimizer``: a ``DistributedDataParallel`` model, an FSDP2
    (``fully_shard``) or FSDP1 (``FullyShardedDataParallel``) model, or a plain module.

    Returns the handle; calling it again on an instrumented model returns the same handle.
    ``settings`` are fields of :class:`InstrumentationConfig` (``per_bucket=True``, ...).
    ``registry`` receives the metrics (a fresh one by default, served on ``/metrics``);
    ``span_exporter`` receives the spans (OTLP from ``OTEL_EXPORTER_OTLP_*`` by default).
    ``on_directive`` receives the remediation service's directives the hook cannot carry out
    itself (``checkpoint_now``, ``set_grad_compression``, ...), on the directive thread: set a
    flag there and act on it in the training loop.
    """
    existing = model.__dict__.get(_ATTACHED)
    if isinstance(existing, Instrumentation) and existing.active:
        return existing
    base = config or InstrumentationConfig()
    if job_id is not None:
        settings["job_id"] = job_id
    try:
        resolved = replace(base, **settings)
    except TypeError as error:
        raise TypeError(f"instrument(): unknown setting ({error})") from None
    handle = Instrumentation(
        model,
        optimizer,
        resolved,
        registry=registry,
        span_exporter=span_exporter,
        comm_hook=comm_hook,
        comm_hook_state=comm_hook_state,
        on_directive=on_directive,
    )
    handle._install()
    model.__dict__[_ATTACHED] = handle
    return handle
