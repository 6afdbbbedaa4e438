"""The spans of one step, built on the worker thread from its record.

Every rank's spans of a step share one trace, whose id is derived from the job id and the step
(:func:`.tracing.trace_id_for`): rank 0 emits the step's root, each rank its own span under it,
with its phases, its gradient sync (DDP's reducer timers where it has them, else the collective
timeline) and its other collectives beneath. Span ids are derived too, so a span emitted later
finds its parent: on DDP a step's spans leave as soon as the worker has the step, and its
gradient sync follows (:meth:`StepSpans.emit_sync`) once DDP's sampled timers are read or known
not to come; a stalled step's span leaves when the watchdog dumps (:meth:`StepSpans.emit_stall`).
Every ``trainguard.grad_sync`` says where its bounds come from (``contract.SyncTiming``).
"""

from __future__ import annotations

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.trace import Status, StatusCode

from trainguard import contract
from trainguard.instrumentation import timeline, tracing
from trainguard.instrumentation.config import Identity
from trainguard.instrumentation.records import StepRecord
from trainguard.instrumentation.reducer import ReducerStats
from trainguard.instrumentation.watchdog import StallReport

# Reducer timestamps further than this from our own clock are not trusted for span placement
# (e.g. device-relative timestamps); the span is then anchored on the step's own timeline.
CLOCK_TOLERANCE_NS = 2_000_000_000


def by_role(
    record: StepRecord, roles: timeline.Roles, role: timeline.Role
) -> list[timeline.Collective]:
    """The step's collectives of one role (gradient sync, parameter gather, other)."""
    return [c for c in record.collectives if roles.of(c) is role]


class StepSpans:
    """Emits each step's spans through ``provider`` (worker thread)."""

    def __init__(
        self,
        provider: TracerProvider,
        ids: tracing.DerivedIdGenerator,
        identity: Identity,
        backend: str,
        epoch_offset_ns: int,
        roles: timeline.Roles | None,
        per_bucket: bool,
    ) -> None:
        self._tracer = provider.get_tracer(contract.INSTRUMENTATION_SCOPE)
        self._ids = ids
        self._identity = identity
        self._backend = backend
        self._epoch_offset_ns = epoch_offset_ns
        self._roles = roles
        self._per_bucket = per_bucket
        self._group_names = timeline.GroupNames()

    def _epoch(self, perf_ns: int) -> int:
        return perf_ns + self._epoch_offset_ns

    def _common(self, step: int) -> dict[str, str | int]:
        ident = self._identity
        return {
            contract.ATTR_JOB_ID: ident.job_id,
            contract.ATTR_RANK: ident.rank,
            contract.ATTR_WORLD_SIZE: ident.world_size,
            contract.ATTR_STEP: step,
            contract.ATTR_BACKEND: self._backend,
            contract.ATTR_NODE: ident.node,
        }

    def _under_rank_span(self, step: int) -> Context:
        """The context of this rank's span of ``step``, emitted or not (its id is derived)."""
        ident = self._identity
        return tracing.remote_parent(
            tracing.trace_id_for(ident.job_id, step),
            tracing.rank_span_id_for(ident.job_id, step, ident.rank),
        )

    def emit(
        self,
        record: StepRecord,
        stats: ReducerStats | None,
        *,
        ddp_sync: tuple[int, int] | None = None,
        untimed: contract.SyncTiming | None = contract.SyncTiming.UNTIMED,
    ) -> bool:
        """The step's spans: rank 0's root, this rank's, its phases, syncs and collectives;
        whether its gradient sync's span is among them.

        ``ddp_sync``: (bytes, buckets) of DDP's gradient sync, which the timeline cannot see:
        without ``stats`` or buckets its span covers the backward pass, marked ``untimed``;
        ``untimed`` None leaves such a span out, to follow with :meth:`emit_sync`.
        """
        ident = self._identity
        trace_id = tracing.trace_id_for(ident.job_id, record.step)
        root_id = tracing.root_span_id_for(ident.job_id, record.step)
        common = self._common(record.step)
        start, end = self._epoch(record.start_ns), self._epoch(record.end_ns)
        if ident.rank == 0:
            self._ids.pending_trace_id = trace_id
            self._ids.pending_span_id = root_id
            root = self._tracer.start_span(
                contract.SPAN_STEP, context=Context(), start_time=start, attributes=common
            )
            root.end(end_time=end)
        self._ids.pending_span_id = tracing.rank_span_id_for(ident.job_id, record.step, ident.rank)
        rank_span = self._tracer.start_span(
            contract.SPAN_RANK_STEP,
            context=tracing.remote_parent(trace_id, root_id),
            start_time=start,
            attributes=common,
        )
        inside = trace.set_span_in_context(rank_span)

        def child(name: str, begin: int, finish: int, ctx: Context = inside) -> trace.Span:
            span = self._tracer.start_span(name, context=ctx, start_time=begin, attributes=common)
            span.end(end_time=max(begin, finish))
            return span

        child(
            contract.SPAN_FORWARD,
            self._epoch(record.forward_start_ns),
            self._epoch(record.forward_end_ns),
        )
        child(
            contract.SPAN_BACKWARD,
            self._epoch(record.forward_end_ns),
            self._epoch(record.optimizer_start_ns),
        )
        child(contract.SPAN_OPTIMIZER, self._epoch(record.optimizer_start_ns), end)
        sync_span = None
        if untimed is not None or record.buckets:
            timing = untimed or contract.SyncTiming.UNTIMED
            sync_span = self._grad_sync_span(record, stats, inside, ddp_sync, timing)
        if sync_span is not None and record.buckets:
            sync_ctx = trace.set_span_in_context(sync_span)
            for bucket in record.buckets:
                if bucket.cuda_events is None:
                    b_start, b_end = self._epoch(bucket.start_ns), self._epoch(bucket.end_ns)
                else:
                    b_end = self._epoch(record.optimizer_start_ns)
                    b_start = b_end - int((bucket.cuda_seconds or 0.0) * 1e9)
                span = self._tracer.start_span(
                    contract.SPAN_GRAD_SYNC_BUCKET,
                    context=sync_ctx,
                    start_time=b_start,
                    attributes={
                        **common,
                        contract.ATTR_BUCKET_INDEX: bucket.index,
                        contract.ATTR_BUCKET_BYTES: bucket.nbytes,
                    },
                )
                span.end(end_time=max(b_start, b_end))
        if self._roles is not None and record.collectives:
            synced = stats is not None or bool(record.buckets) or ddp_sync is not None
            self._timeline_spans(record, self._roles, synced, inside, common)
        rank_span.end(end_time=end)
        return sync_span is not None

    def emit_sync(
        self,
        record: StepRecord,
        stats: ReducerStats | None,
        ddp_sync: tuple[int, int] | None,
        untimed: contract.SyncTiming,
    ) -> None:
        """DDP's gradient sync of a step whose other spans have left already, under this
        rank's span of the step."""
        self._grad_sync_span(record, stats, self._under_rank_span(record.step), ddp_sync, untimed)

    def emit_stall(self, stall: StallReport) -> None:
        """The stalled step, from its start to the stall's report: status ERROR, with the
        collective that never completed (the step's own span may never come)."""
        attributes: dict[str, str | int | float] = {
            **self._common(stall.step),
            contract.ATTR_COLLECTIVE_OP: stall.collective,
            contract.ATTR_PROCESS_GROUP: stall.process_group,
            contract.ATTR_STALL_AGE: stall.age_seconds,
            contract.ATTR_DUMP_DIR: stall.dump_dir,
        }
        if stall.seq is not None:
            attributes[contract.ATTR_COLLECTIVE_SEQ] = stall.seq
        begin = self._epoch(stall.started_ns)
        span = self._tracer.start_span(
            contract.SPAN_STALL,
            context=self._under_rank_span(stall.step),
            start_time=begin,
            attributes=attributes,
        )
        span.set_status(
            Status(
                StatusCode.ERROR,
                f"{stall.collective} #{stall.seq} on {stall.process_group} in flight for "
                f"{stall.age_seconds:.1f}s",
            )
        )
        span.end(end_time=max(begin, self._epoch(stall.reported_ns)))

    def _timeline_spans(
        self,
        record: StepRecord,
        roles_of: timeline.Roles,
        ddp_synced: bool,
        ctx: Context,
        common: dict[str, str | int],
    ) -> None:
        """Spans of the step's collectives: the gradient sync and the parameter all-gathers
        (one span each, a child per collective in bucket mode), and every other collective
        per process group and operation (a span per collective in bucket mode)."""
        tracer = self._tracer
        names = self._group_names

        def describe(entries: list[timeline.Collective]) -> dict[str, str | int]:
            return {
                **common,
                contract.ATTR_PROCESS_GROUP: names(entries[0].group),
                contract.ATTR_COLLECTIVE_OP: entries[0].op,
                contract.ATTR_COLLECTIVE_COUNT: len(entries),
                contract.ATTR_COLLECTIVE_BYTES: sum(c.nbytes for c in entries),
            }

        def span(
            name: str, entries: list[timeline.Collective], parent: Context, **extra: int | str
        ) -> trace.Span:
            begin = self._epoch(min(c.start_ns for c in entries))
            finish = self._epoch(max(max(c.end_ns, c.start_ns) for c in entries))
            made = tracer.start_span(
                name, context=parent, start_time=begin, attributes={**describe(entries), **extra}
            )
            made.end(end_time=max(begin, finish))
            return made

        roles = {role: by_role(record, roles_of, role) for role in timeline.Role}
        grouped = (
            (timeline.Role.GRAD_SYNC, contract.SPAN_GRAD_SYNC, contract.SPAN_GRAD_SYNC_BUCKET),
            (
                timeline.Role.PARAM_GATHER,
                contract.SPAN_PARAM_GATHER,
                contract.SPAN_PARAM_GATHER_UNIT,
            ),
        )
        for role, name, unit_name in grouped:
            entries = roles[role]
            if not entries or (role is timeline.Role.GRAD_SYNC and ddp_synced):
                continue
            extra = (
                {contract.ATTR_GRAD_SYNC_TIMING: contract.SyncTiming.TIMELINE.value}
                if role is timeline.Role.GRAD_SYNC
                else {}
            )
            whole = span(name, entries, ctx, **extra)
            if self._per_bucket:
                whole_ctx = trace.set_span_in_context(whole)
                for index, entry in enumerate(entries):
                    span(unit_name, [entry], whole_ctx, **{contract.ATTR_BUCKET_INDEX: index})
        others = roles[timeline.Role.OTHER]
        if self._per_bucket:
            for entry in others:
                span(contract.SPAN_COLLECTIVE, [entry], ctx)
            return
        by_kind: dict[tuple[str, str], list[timeline.Collective]] = {}
        for entry in others:
            by_kind.setdefault((names(entry.group), entry.op), []).append(entry)
        for entries in by_kind.values():
            span(contract.SPAN_COLLECTIVE, entries, ctx)

    def _grad_sync_span(
        self,
        record: StepRecord,
        stats: ReducerStats | None,
        ctx: Context,
        ddp_sync: tuple[int, int] | None,
        untimed: contract.SyncTiming,
    ) -> trace.Span | None:
        """The step's gradient sync: DDP's reducer timers when it has them, the comm hook's
        buckets in bucket mode, else (DDP, ``ddp_sync``) the backward pass it overlapped."""
        backward_start = self._epoch(record.forward_end_ns)
        backward_end = self._epoch(record.optimizer_start_ns)
        attributes: dict[str, str | int] = self._common(record.step)
        if stats is not None:
            timing = contract.SyncTiming.DDP_REDUCER
            begin, finish = stats.comm_start_ns, stats.comm_end_ns
            if not (
                backward_start - CLOCK_TOLERANCE_NS <= begin
                and finish <= backward_end + CLOCK_TOLERANCE_NS
            ):
                finish = backward_end
                begin = finish - stats.comm_ns
            ddp_sync = sum(stats.bucket_bytes), len(stats.bucket_bytes)
        elif record.buckets:
            timing = contract.SyncTiming.COMM_HOOK
            timed = [b for b in record.buckets if b.cuda_events is None]
            if timed:
                begin = self._epoch(min(b.start_ns for b in timed))
                finish = self._epoch(max(b.end_ns for b in timed))
            else:
                begin, finish = backward_start, backward_end
            ddp_sync = sum(b.nbytes for b in record.buckets), len(record.buckets)
        elif ddp_sync is not None:
            timing, begin, finish = untimed, backward_start, backward_end
        else:
            return None
        attributes[contract.ATTR_GRAD_SYNC_TIMING] = timing.value
        if ddp_sync[1]:
            attributes[contract.ATTR_COLLECTIVE_BYTES] = ddp_sync[0]
            attributes[contract.ATTR_COLLECTIVE_COUNT] = ddp_sync[1]
        span = self._tracer.start_span(
            contract.SPAN_GRAD_SYNC, context=ctx, start_time=begin, attributes=attributes
        )
        span.end(end_time=max(begin, finish))
        return span
