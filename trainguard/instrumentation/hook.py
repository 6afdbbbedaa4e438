"""``trainguard.instrument``: the hook on a training rank.

What runs on the training thread is kept to clock reads and attribute stores: a wrapper around
the model's ``forward`` and the optimizer's ``step`` record when each step's phases begin and
end, the collective timeline (:mod:`.timeline`) records each collective the step issues, and
one tuple per step goes to the worker thread, which does everything else (metrics, DDP's
reducer timers, memory, spans). On DDP the training thread also copies DDP's record of its
timers right after the forwards at which DDP publishes a sampled iteration's (one step in
``runtime_stats_every``, see :class:`.reducer.TimerReads`). The same hook serves DDP, FSDP2,
FSDP1 and plain modules (:mod:`.parallel` tells them apart). A watchdog thread watches for
stalled collectives. Everything is undone by :meth:`Instrumentation.uninstrument`, and nothing
inside may crash or stall training (see :mod:`.errors`).
"""

from __future__ import annotations

import contextlib
import datetime
import logging
import os
import threading
import time
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
from trainguard.instrumentation import flight_recorder, parallel, tracing
from trainguard.instrumentation.comm_hook import BucketTimer, CommHook
from trainguard.instrumentation.config import Identity, InstrumentationConfig
from trainguard.instrumentation.directives import Directive, DirectiveCallback, DirectiveClient
from trainguard.instrumentation.discovery import COMPONENT as DISCOVERY
from trainguard.instrumentation.discovery import register_rank
from trainguard.instrumentation.errors import ErrorBudget
from trainguard.instrumentation.memory import MemorySampler
from trainguard.instrumentation.metrics import CollectiveProgressCollector, RankMetrics
from trainguard.instrumentation.oom import batch_size, memory_summary, split_batch
from trainguard.instrumentation.records import RawStep
from trainguard.instrumentation.reducer import (
    RawLoggingData,
    TimerReads,
    logging_data_reader,
    reducer_stats_supported,
)
from trainguard.instrumentation.server import (
    MetricsEndpoint,
    advertised_host,
    serve_metrics,
    write_file_sd,
)
from trainguard.instrumentation.timeline import INTERCEPTOR, Timeline
from trainguard.instrumentation.watchdog import CollectiveWatchdog, StepClock
from trainguard.instrumentation.worker import StepWorker, log_oom

logger = logging.getLogger("trainguard.instrumentation")

T = TypeVar("T")

# torch's default DDP runtime-stats sample rate, restored on uninstrument.
DDP_DEFAULT_SAMPLE_RATE = 100
_ATTACHED = "_trainguard_instrumentation"
_BUCKET_TIMER = "_trainguard_bucket_timer"


def _default_store() -> Any | None:
    """The job's c10d store, used to tell peers to dump when one rank sees a stall."""
    try:
        from torch.distributed.distributed_c10d import _get_default_store

        return _get_default_store()
    except Exception:
        return None


JOB_ID_STORE_KEY = "trainguard/job_id"
# How long a rank waits for rank 0's job id in the store before going on with its own.
JOB_ID_WAIT_SECONDS = 30.0


def _job_id_from_rank0(store: Any, rank: int) -> Callable[[str], str]:
    """Every rank takes rank 0's proposed job id, so their traces and series are one job."""

    def agree(proposal: str) -> str:
        if rank == 0:
            store.set(JOB_ID_STORE_KEY, proposal)
            return proposal
        try:
            store.wait([JOB_ID_STORE_KEY], datetime.timedelta(seconds=JOB_ID_WAIT_SECONDS))
            return str(store.get(JOB_ID_STORE_KEY).decode())
        except Exception as error:  # rank 0 never instrumented: stay on, under our own id
            logger.warning(
                "trainguard: no job id from rank 0 (%s); set %s to name the job",
                error,
                contract.ENV_JOB_ID,
            )
            return proposal

    return agree


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
        self.device = self._device_of(model)
        store = _default_store() if distributed else None
        self.identity: Identity = config.resolve_identity(
            world_size=dist.get_world_size() if distributed else 1,
            rank=dist.get_rank() if distributed else None,
            agree_job_id=(
                _job_id_from_rank0(store, dist.get_rank()) if store is not None else None
            ),
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
        self._wrapped_forward_ref: Callable[..., Any] | None = None
        self._wrapped_step_ref: Callable[..., Any] | None = None
        self._split = 1
        self._ooms_reported = 0
        self._worker: StepWorker | None = None
        self._timeline: Timeline | None = None
        # When to read DDP's logging data: after the forwards that publish sampled timers
        # (None: not read).
        self._timer_reads: TimerReads | None = None
        self._reducer_data: RawLoggingData = None  # read in this step, for its record
        self._on_directive = on_directive
        self._directives: DirectiveClient | None = None
        self._progress_collector: CollectiveProgressCollector | None = None
        # One bound method object, so that uninstrument withdraws exactly what was published.
        self._log_trace_ids_ref = self.log_trace_ids

        # Training-thread state of the step in progress (perf_counter_ns; 0 = none).
        self.clock = StepClock(step=config.start_step)
        self._forward_start = 0
        self._forward_end = 0
        self._forward_ns = 0
        self._data_ns = 0
        self._previous_end = 0

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
        return self._split

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
        self._hand_over_timers()
        return self._worker.flush(timeout)

    def _hand_over_timers(self) -> None:
        """DDP timers read at the forward of a step that has not ended are the last finished
        step's: the worker needs them now, not when (if ever) that step ends."""
        data, self._reducer_data = self._reducer_data, None
        if data is not None and self._worker is not None:
            self._worker.submit_timers(data)

    def force_flush_spans(self, timeout_millis: int = 10_000) -> bool:
        self.flush()
        if self._tracer_provider is None:
            return True
        return self._tracer_provider.force_flush(timeout_millis)

    def wrap_dataloader(self, loader: Iterable[T]) -> Iterator[T]:
        """Iterate ``loader``, timing each fetch as the step's data wait.

        Without it, the data wait is the gap between one step's end and the next forward.
        """
        iterator = iter(loader)
        while True:
            start = time.perf_counter_ns()
            try:
                item = next(iterator)
            except StopIteration:
                return
            self._data_ns += time.perf_counter_ns() - start
            yield item

    def uninstrument(self) -> None:
        """Undo every wrap, stop the threads and the server; safe to call more than once."""
        with self._lock:
            if not self._active:
                return
            self._active = False
        model_state = self.model.__dict__
        if model_state.get("forward") is self._wrapped_forward_ref:
            del model_state["forward"]
        if self.optimizer is not None and (
            self.optimizer.__dict__.get("step") is self._wrapped_step_ref
        ):
            del self.optimizer.__dict__["step"]
        if self._timeline is not None:
            INTERCEPTOR.detach(self._timeline)
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
            self._hand_over_timers()
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
        total = batch_size(batch)
        if total == 0:
            raise ValueError("guarded_step needs a batch with a tensor that has a batch dim")
        retried = False
        while True:
            micro_batches = split_batch(batch, self._split)
            failed: BaseException | None = None
            loss_sum = torch.zeros((), device=self.device)
            ready: torch.Tensor | None = None
            for index, micro in enumerate(micro_batches):
                last = index == len(micro_batches) - 1
                sync = (
                    contextlib.nullcontext()
                    if last
                    else parallel.gradient_sync_off(self.model, self.parallelism)
                )
                with sync:
                    try:
                        weight = batch_size(micro) / total if loss_is_mean else 1.0
                        loss = loss_fn(micro) * weight
                        if not last:
                            loss.backward()
                            loss_sum += loss.detach()
                            del loss
                        else:
                            ready = loss
                    except torch.OutOfMemoryError as error:
                        failed = error
                        break
            if not self.config.oom_recovery:
                if failed is not None:
                    raise failed
                assert ready is not None
                ready.backward()
                return loss_sum + ready.detach()
            if self._any_rank_failed(failed is not None):
                ready = None
                self._abandon_attempt()
                if self._split >= self.config.oom_split_max:
                    raise failed or torch.OutOfMemoryError(
                        f"a peer ran out of memory with {self._split} micro-batches"
                    )
                self._split = min(self.config.oom_split_max, self._split * 2)
                logger.warning("trainguard: retrying the step in %d micro-batches", self._split)
                retried = True
                continue
            assert ready is not None
            ready.backward()
            if retried:
                self.metrics.oom_recoveries.inc()
                log_event(
                    f"step {self.clock.step} recovered from an out-of-memory error in "
                    f"{self._split} micro-batches (later steps keep that split)",
                    contract.EventKind.OOM_RECOVERED,
                    level=logging.INFO,
                    **self.identity.event_fields(),
                    step=self.clock.step,
                    trace_id=self.trace_id(self.clock.step),
                    outcome=contract.EventOutcome.SUCCESS,
                    details={"micro_batches": self._split},
                )
            return loss_sum + ready.detach()

    # -- installation -------------------------------------------------------------------------
    @staticmethod
    def _device_of(model: torch.nn.Module) -> torch.device:
        for parameter in model.parameters():
            return parameter.device
        return torch.device("cpu")

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
                self._timeline = candidate
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
            self._timer_reads = TimerReads(self.ddp, logging_data_reader(self.ddp), every)
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
            ddp_timers=self._timer_reads is not None,
            tracer_provider=self._tracer_provider,
            ids=ids,
            backend=self.backend,
            on_allocator_oom=self._on_allocator_oom,
            roles=roles,
            per_bucket=per_bucket,
            on_timers_lost=self._on_timers_lost,
        )
        self._worker.start()
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
                store=_default_store(),
            )
            self._watchdog.start()
        self._wrap_forward()
        if self.optimizer is not None:
            self._wrap_step(self.optimizer)
        correlation.publish(self._log_trace_ids_ref)
        self._active = True
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

    def _on_timers_lost(self) -> None:
        """DDP's timers were given up on (worker thread): stop reading them, say so in
        ``rank_info``."""
        self._timer_reads = None
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
        host = advertised_host(addr)
        target = (
            f"[{host}]:{self._endpoint.port}" if ":" in host else f"{host}:{self._endpoint.port}"
        )
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

    # -- training-thread wrappers -------------------------------------------------------------
    def _wrap_forward(self) -> None:
        original = self.model.forward

        def forward(*args: Any, **kwargs: Any) -> Any:
            if not self._active or not torch.is_grad_enabled():
                return original(*args, **kwargs)
            start = time.perf_counter_ns()
            if self._forward_start == 0 or self.optimizer is None:
                self._begin_step(start)
            reads = self._timer_reads
            # Asked before DDP's forward, which counts its iteration as it starts.
            publishes = reads is not None and reads.before_forward()
            try:
                output = original(*args, **kwargs)
            except torch.OutOfMemoryError as error:
                self._on_oom("forward", error)
                raise
            end = time.perf_counter_ns()
            self._forward_ns += end - start
            self._forward_end = end
            if publishes:
                self._read_timers()
            return output

        self._wrapped_forward_ref = forward
        self.model.__dict__["forward"] = forward

    def _wrap_step(self, optimizer: torch.optim.Optimizer) -> None:
        original = optimizer.step

        def step(*args: Any, **kwargs: Any) -> Any:
            if not self._active or self._forward_start == 0:
                return original(*args, **kwargs)
            start = time.perf_counter_ns()
            try:
                result = original(*args, **kwargs)
            except torch.OutOfMemoryError as error:
                self._on_oom("optimizer", error)
                raise
            self._end_step(start, time.perf_counter_ns())
            return result

        self._wrapped_step_ref = step
        optimizer.__dict__["step"] = step

    def _read_timers(self) -> None:
        """DDP has just published a sampled iteration's timers (at this forward's start, see
        :class:`.reducer.TimerReads`): take them for the worker, in this step's record. A copy
        of the C++ logger's record, cheaper than waking the worker to read them in time."""
        reads = self._timer_reads
        if reads is None:
            return
        try:
            data = reads.read()
        except Exception as error:
            self.errors.record("reducer_stats", error)
            return
        if self._reducer_data is not None:  # a second read in one step: keep both
            self._hand_over_timers()
        self._reducer_data = data

    def _begin_step(self, now: int) -> None:
        if self.optimizer is None and self._forward_end:
            # Without an optimizer to mark the end, a step ends where the next one begins.
            self._end_step(now, now)
        self._forward_start = now
        if self._timeline is not None:
            INTERCEPTOR.current = self._timeline
        if not self._previous_end:
            self._previous_end = now - self._data_ns
        self.clock.started_ns = self._previous_end

    def _end_step(self, optimizer_start: int, end: int) -> None:
        previous_end, forward_start = self._previous_end, self._forward_start
        data_wait = self._data_ns or max(0, forward_start - previous_end)
        collectives, overflow = self._timeline.take() if self._timeline is not None else ([], 0)
        # A tuple of StepRecord's fields, not a StepRecord: the worker builds that (a tenth of
        # the cost here, see .records).
        record: RawStep = (
            self.clock.step,
            previous_end,
            forward_start,
            self._forward_end,
            self._forward_ns,
            optimizer_start,
            end,
            data_wait,
            self._bucket_timer.take() if self._bucket_timer is not None else [],
            collectives,
            overflow,
            self._reducer_data,
        )
        self._reducer_data = None
        self.clock.recent.append((end - previous_end) / 1e9)
        # The watchdog keeps watching between steps: a collective outside the step (a metric
        # all-reduce, a checkpoint barrier) can hang as well.
        self.clock.started_ns = end
        self.clock.step += 1
        self._previous_end = end
        self._forward_start = self._forward_end = self._forward_ns = self._data_ns = 0
        if self._worker is not None:
            try:
                self._worker.submit(record)
            except Exception as error:
                self.errors.record("worker", error)

    # -- directives from the remediation service (on the directive client's thread) ----------
    def _handle_directive(self, directive: Directive) -> None:
        """Carry out what the hook can do itself; hand the rest to ``on_directive``.

        Raising marks the directive failed in the service's audit trail, with the reason.
        """
        kind = directive.kind
        log_event(
            f"directive {kind.value} #{directive.id} received",
            contract.EventKind.DIRECTIVE,
            level=logging.INFO,
            **self.identity.event_fields(),
            step=self.clock.step,
            details={"directive": kind.value, "params": dict(directive.params)},
        )
        if kind is contract.Action.DUMP_DIAGNOSTICS:
            folder = self.config.resolved_dump_dir() / self.identity.job_id
            folder = folder / f"directive-{directive.id}"
            if self.backend != "none" and flight_recorder.flight_recorder_available():
                flight_recorder.write_dump(folder, self.identity.rank)
            flight_recorder.write_stacks(folder, self.identity.rank)
        elif kind is contract.Action.SPLIT_MICRO_BATCHES:
            factor = int(directive.params.get("factor", 2))
            # Applies to guarded_step; every rank gets the same directive, and guarded_step's
            # agreement keeps them in lockstep if one applies it a step later.
            self._split = max(1, min(self.config.oom_split_max, self._split * factor))
        elif kind is contract.Action.SET_COLLECTIVE_TIMEOUT and self._on_directive is None:
            seconds = float(directive.params["seconds"])
            from torch.distributed.distributed_c10d import _set_pg_timeout

            _set_pg_timeout(datetime.timedelta(seconds=seconds))
        elif self._on_directive is not None:
            self._on_directive(directive)
        else:
            raise RuntimeError(
                f"no handler for directive {kind.value!r} on this rank: pass "
                "on_directive= to trainguard.instrument() to act on it"
            )

    # -- OOM ------------------------------------------------------------------------------------
    def _on_oom(self, where: str, error: BaseException | None) -> None:
        with self.errors.guard("oom_guard"):
            self._ooms_reported += 1
            self.metrics.oom_events.inc()
            log_oom(self.identity, self.clock.step, where, memory_summary(self.device), error)

    def _on_allocator_oom(self, count: int) -> None:
        """The CUDA allocator saw ``count`` new OOMs; report those no wrapper reported."""
        unreported = count - self._ooms_reported
        self._ooms_reported = max(0, self._ooms_reported - count)
        for _ in range(max(0, unreported)):
            self._on_oom("backward", None)

    def _abandon_attempt(self) -> None:
        """Forget a failed attempt on every rank: its gradients and what the wrapper expected
        of the backward that never ran (see :func:`parallel.reset_after_failed_attempt`)."""
        self.model.zero_grad(set_to_none=True)
        parallel.reset_after_failed_attempt(self.model, self.parallelism)

    def _any_rank_failed(self, failed: bool) -> bool:
        if self.backend == "none" or self.identity.world_size <= 1:
            return failed
        # Through torch.distributed, so the timeline counts waiting here for a slower peer
        # as sync wait, not as this rank's compute.
        flag = torch.tensor([1.0 if failed else 0.0], device=self.device)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        return bool(flag.item() > 0)


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
