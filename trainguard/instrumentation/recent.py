"""The median of a rank's latest observations within a time window: the robust statistic behind
its recent compute share (``trainguard_step_compute_share_ratio``), the fast straggler signal.

A window in time, not in steps, because what a straggler must be told apart from is a transient
of a known length: a noisy neighbour slows a node for up to 20 s (docs/alerts.md). A median over
:data:`~trainguard.contract.RECENT_COMPUTE_SECONDS` (more than twice that) is only nudged by such
a burst (to a higher percentile of the normal steps), at any step length, and follows a lasting
change once it fills half the window; a window of a fixed number of steps spans a few seconds
at short steps, and a burst carries it.
Bounded both ways: at least ``min_count`` observations however old (long steps, DDP timing one
step in eight), at most ``max_count`` however recent (very short steps). Not :attr:`ready` until
the window has filled once: in a rank's first seconds it holds only those, and a burst then
is most of them (a healthy job's first run at the shipped defaults fired for a node whose
neighbour's burst began 3 s into the job). Beside it,
:class:`RecentMean`, for the rank's usual batch size and usual step that the share is taken at.
"""

from __future__ import annotations

import bisect
import collections


class RecentMedian:
    """Observations of the last ``seconds`` (by the caller's clock), kept sorted for the median."""

    def __init__(self, seconds: float, min_count: int, max_count: int) -> None:
        if not 0 < min_count <= max_count or seconds <= 0:
            raise ValueError(f"bad window: {seconds} s, {min_count}..{max_count} observations")
        self._seconds = seconds
        self._min_count = min_count
        self._max_count = max_count
        self._arrivals: collections.deque[tuple[float, float]] = collections.deque()
        self._sorted: list[float] = []
        self._first_at: float | None = None

    def __len__(self) -> int:
        return len(self._arrivals)

    def add(self, at: float, value: float) -> None:
        """One observation made at ``at`` seconds; drops those the window no longer holds."""
        if self._first_at is None:
            self._first_at = at
        self._arrivals.append((at, value))
        bisect.insort(self._sorted, value)
        while len(self._arrivals) > self._max_count or (
            len(self._arrivals) > self._min_count and self._arrivals[0][0] < at - self._seconds
        ):
            _, old = self._arrivals.popleft()
            del self._sorted[bisect.bisect_left(self._sorted, old)]

    @property
    def ready(self) -> bool:
        """Whether the window has filled once: ``seconds`` since the first observation (or
        ``max_count`` observations, at very short steps)."""
        if self._first_at is None:
            return False
        span = self._arrivals[-1][0] - self._first_at
        return span >= self._seconds or len(self._arrivals) == self._max_count

    def median(self) -> float | None:
        """The median of the observations held (None before the first)."""
        n = len(self._sorted)
        if n == 0:
            return None
        middle = n // 2
        if n % 2:
            return self._sorted[middle]
        return (self._sorted[middle - 1] + self._sorted[middle]) / 2


class RecentMean:
    """The mean of the latest ``max_count`` observations: a rank's usual batch size and usual
    step. A mean, not a median: input counts are exact, with no outlier to be robust to (and
    their mean spreads a quarter less than their median); a step's length includes the outlier
    steps of every rank it waits for, and a median of them jumps as they come and go, where a
    mean moves by one step's share of the window."""

    def __init__(self, max_count: int) -> None:
        if max_count <= 0:
            raise ValueError(f"bad window: {max_count} observations")
        self._values: collections.deque[float] = collections.deque(maxlen=max_count)
        self._total = 0.0

    def __len__(self) -> int:
        return len(self._values)

    def add(self, value: float) -> None:
        if len(self._values) == self._values.maxlen:
            self._total -= self._values[0]
        self._values.append(value)
        self._total += value

    def mean(self) -> float | None:
        """The mean of the observations held (None before the first)."""
        return self._total / len(self._values) if self._values else None
