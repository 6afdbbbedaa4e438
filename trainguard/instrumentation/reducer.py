"""DDP's own per-iteration timers, read instead of timing anything on the training thread.

``DistributedDataParallel`` times every sampled iteration in C++ (CUDA events on GPU):
forward compute, backward compute, backward communication (the gradient sync) with start and
end timestamps, and their overlap. They are private APIs (``_set_ddp_runtime_logging_sample_rate``
and ``_get_ddp_logging_data``), so :func:`reducer_stats_supported` guards them and the hook
falls back to wall-clock phases when they are missing or change shape.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

# What a reader from logging_data_reader returns: the C++ logger's record (a pybind object with
# ``ints_map`` and ``strs_map``) or, from DDP's own method, one dict of both.
RawLoggingData = Any

_REQUIRED_KEYS = (
    "forward_compute_time",
    "forward_compute_time_start",
    "backward_compute_time",
    "backward_compute_time_start",
    "backward_compute_time_end",
    "backward_comm_time",
    "backward_comm_time_start",
    "backward_comm_time_end",
    "backward_compute_comm_overlap_time",
)


@dataclass(frozen=True, slots=True)
class ReducerStats:
    """One iteration's timings in nanoseconds; ``*_start``/``*_end`` are Unix-epoch ns."""

    iteration: int
    forward_compute_ns: int
    forward_start_ns: int
    backward_compute_ns: int
    backward_compute_start_ns: int
    backward_compute_end_ns: int
    comm_ns: int
    comm_start_ns: int
    comm_end_ns: int
    overlap_ns: int
    bucket_bytes: tuple[int, ...]

    @property
    def sync_wait_ns(self) -> int:
        """The part of the gradient sync not hidden behind backward compute."""
        return max(0, self.comm_ns - max(0, self.overlap_ns))


@functools.lru_cache(maxsize=8)
def _parse_sizes(raw: str) -> tuple[int, ...]:
    return tuple(int(part) for part in raw.split(",") if part.strip())


def _bucket_bytes(data: Mapping[str, Any]) -> tuple[int, ...]:
    # The sizes change only when DDP rebuilds its buckets, so the parse is cached.
    raw = data.get("rebuilt_bucket_sizes") if data.get("has_rebuilt_buckets") else None
    return _parse_sizes(str(raw or data.get("bucket_sizes") or ""))


def as_mapping(raw: RawLoggingData) -> Mapping[str, Any]:
    """One mapping of DDP's logging data, from either reader of :func:`logging_data_reader`."""
    if isinstance(raw, Mapping):
        return raw
    return {**raw.strs_map, **raw.ints_map}


def parse_logging_data(raw: RawLoggingData) -> ReducerStats | None:
    """Reducer stats from what :func:`logging_data_reader`'s reader returned (the C++ logger's
    record or DDP's dict); ``None`` if not sampled yet."""
    data = as_mapping(raw)
    if any(key not in data for key in _REQUIRED_KEYS):
        return None
    if int(data["backward_comm_time_end"]) <= 0 or int(data["forward_compute_time_start"]) <= 0:
        return None
    return ReducerStats(
        iteration=int(data.get("iteration", 0)),
        forward_compute_ns=int(data["forward_compute_time"]),
        forward_start_ns=int(data["forward_compute_time_start"]),
        backward_compute_ns=int(data["backward_compute_time"]),
        backward_compute_start_ns=int(data["backward_compute_time_start"]),
        backward_compute_end_ns=int(data["backward_compute_time_end"]),
        comm_ns=int(data["backward_comm_time"]),
        comm_start_ns=int(data["backward_comm_time_start"]),
        comm_end_ns=int(data["backward_comm_time_end"]),
        overlap_ns=int(data["backward_compute_comm_overlap_time"]),
        bucket_bytes=_bucket_bytes(data),
    )


def logging_data_reader(ddp: Any) -> Callable[[], RawLoggingData]:
    """The cheapest reader of DDP's logging data this torch has, for the training thread.

    The C++ logger's own getter copies the record under the reducer's lock (about 3 us) and
    leaves its two maps unconverted, so the worker thread turns them into Python objects;
    ``ddp._get_ddp_logging_data()`` converts and merges both maps on the calling thread, several
    times the cost in a training loop. It is the fallback where the logger lacks the getter."""
    getter = getattr(getattr(ddp, "logger", None), "_get_ddp_logging_data", None)
    fallback: Callable[[], RawLoggingData] = ddp._get_ddp_logging_data
    return getter if callable(getter) else fallback


def reducer_stats_supported(ddp: Any) -> bool:
    """Whether this torch's DDP exposes the runtime timers we read."""
    return callable(getattr(ddp, "_set_ddp_runtime_logging_sample_rate", None)) and callable(
        getattr(ddp, "_get_ddp_logging_data", None)
    )


# DDP times every iteration up to this one whatever its sample rate (``Reducer::
# should_collect_runtime_stats``: ``num_iterations_ <= 10 || num_iterations_ % rate == 0``).
ALWAYS_SAMPLED_ITERATIONS = 10


def published_iteration(raw: RawLoggingData) -> int | None:
    """The iteration whose timers a record holds (DDP's ``iteration`` key), or ``None``."""
    ints = raw if isinstance(raw, Mapping) else raw.ints_map
    value = ints.get("iteration")
    return int(value) if value is not None else None


class TimerReads:
    """When the training thread reads DDP's timers: only right after a forward at which DDP
    published a sampled iteration's timers, so that no published iteration is missed and no
    read is wasted on an unsampled one.

    DDP times iteration ``k`` (counted by its reducer over the forwards that sync gradients)
    when ``k <= 10`` or ``k % every == 0``, and publishes those timers at the start of forward
    ``k + 1``, where they stay until the next sampled iteration's are published. This class
    counts those forwards itself (:meth:`after_forward`, called after each instrumented
    forward with gradients enabled) and reads after the forward that publishes. DDP's count
    before instrumentation is unknown, so it starts *searching*: it reads after every syncing
    forward until the published iteration changes between two reads (a publish at that
    forward), which gives DDP's count; from then on it reads only after the forwards that
    publish, checking that the record holds the iteration expected. A record that does not
    (a forward that bypassed the wrapper, an iteration that failed before DDP counted it)
    sends it back to searching. Reading and checking cost a few microseconds; ``every`` reads
    in ``every`` steps cost that once.
    """

    __slots__ = ("_ddp", "_every", "_last_seen", "_next", "_read")

    def __init__(self, ddp: Any, read: Callable[[], RawLoggingData], every: int) -> None:
        self._ddp = ddp
        self._read = read
        self._every = max(1, every)
        self._next: int | None = None  # DDP's iteration count before the coming forward
        self._last_seen: int | None = None  # what the last read held (searching)

    @property
    def locked(self) -> bool:
        """Whether DDP's iteration count is known (reads only where DDP publishes)."""
        return self._next is not None

    def before_forward(self) -> bool:
        """Whether the forward about to run publishes timers (or, searching, may): call it
        before DDP's forward, which counts the iteration at its start even if it then fails.
        """
        if not self._ddp.require_backward_grad_sync:
            return False  # no_sync: DDP neither counts nor publishes at this forward
        previous = self._next
        if previous is None:
            return True
        self._next = previous + 1
        return previous <= ALWAYS_SAMPLED_ITERATIONS or previous % self._every == 0

    def read(self) -> RawLoggingData:
        """Read the record after a forward :meth:`before_forward` chose (the worker tells a
        stale one from a fresh one by its iteration)."""
        data = self._read()
        seen = published_iteration(data)
        expected = self._next
        if expected is not None:
            if seen != expected - 1:
                self._next = None  # out of step with DDP's count: search again
                self._last_seen = seen
            return data
        last, self._last_seen = self._last_seen, seen
        if seen is not None and last is not None and seen != last:
            # Published at this forward: DDP's count before the next forward is one past it.
            self._next = seen + 1
        return data
