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
