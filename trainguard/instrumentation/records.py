"""What the training thread hands to the worker: raw timestamps, nothing computed.

The training thread only reads clocks and appends: at the end of a step it hands over a plain
tuple (:data:`RawStep`), which the worker turns into a :class:`StepRecord` (building one there
cost ten times the tuple). Turning timestamps into histograms, spans and events happens on the
worker thread too (see :mod:`.worker`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from trainguard.instrumentation.reducer import RawLoggingData
from trainguard.instrumentation.timeline import Collective, Entry, resolve


@dataclass(slots=True)
class BucketTiming:
    """One gradient bucket's sync, measured by the per-bucket comm hook."""

    index: int
    nbytes: int
    start_ns: int  # perf_counter_ns on CPU; 0 when timed with CUDA events
    end_ns: int
    cuda_events: tuple[object, object] | None = None  # (start, end) torch.cuda.Event
    # The CUDA-event duration, read once by the worker (reading it synchronises the event).
    cuda_seconds: float | None = None


# A step as the training thread hands it over: StepRecord's fields in order, the collectives
# still the timeline's entries.
RawStep = tuple[
    int,
    int,
    int,
    int,
    int,
    int,
    int,
    int,
    list[BucketTiming],
    list[Entry],
    int,
    RawLoggingData,
    int,
]


@dataclass(slots=True)
class StepRecord:
    """Timestamps (``time.perf_counter_ns``) of one training step on one rank."""

    step: int
    start_ns: int  # end of the previous step (or start of the data wait)
    forward_start_ns: int
    forward_end_ns: int
    forward_ns: int  # sum over the step's forward calls (gradient accumulation)
    optimizer_start_ns: int
    end_ns: int
    data_wait_ns: int
    buckets: list[BucketTiming] = field(default_factory=list)
    # The collectives issued through torch.distributed in this step's window (from the end of
    # the previous step), and how many more did not fit (see .timeline).
    collectives: list[Collective] = field(default_factory=list)
    collectives_overflow: int = 0
    # DDP's logging data as read right after this step's forward that published a sampled
    # iteration's timers (the previous step's, usually), or None (see .reducer.TimerReads).
    reducer_data: RawLoggingData = None
    # Elements of the tensors the step's forwards were given (0: none, or not counted): how
    # much work its batch asked for, where the batch's size varies (see .steps).
    input_elements: int = 0
    # On DDP, the step's spans leave before its timers are read: whether they have, and
    # whether its gradient sync's span has too (the worker's own bookkeeping).
    spans_sent: bool = False
    sync_sent: bool = False

    @classmethod
    def from_raw(cls, raw: RawStep) -> StepRecord:
        """The record of what the training thread handed over (on the worker thread)."""
        (step, start, forward_start, forward_end, forward, optimizer, end, data_wait) = raw[:8]
        buckets, entries, overflow, reducer_data, input_elements = raw[8:]
        return cls(
            step=step,
            start_ns=start,
            forward_start_ns=forward_start,
            forward_end_ns=forward_end,
            forward_ns=forward,
            optimizer_start_ns=optimizer,
            end_ns=end,
            data_wait_ns=data_wait,
            buckets=buckets,
            collectives=resolve(entries),
            collectives_overflow=overflow,
            reducer_data=reducer_data,
            input_elements=input_elements,
        )

    @property
    def duration_ns(self) -> int:
        return self.end_ns - self.start_ns

    @property
    def backward_ns(self) -> int:
        """Everything between the first forward and the optimizer that is not forward: the
        backward passes (and the loss) of every micro-batch, including the gradient sync."""
        return max(0, self.optimizer_start_ns - self.forward_start_ns - self.forward_ns)

    @property
    def optimizer_ns(self) -> int:
        return max(0, self.end_ns - self.optimizer_start_ns)
