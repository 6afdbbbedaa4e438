"""The job as it was: which points of a rank's series read the job it was a member of, and
when a change first showed in its own steps.

A rank is judged only over the time it was a member. A rate over a window keeps reading a
departed rank's last steps for a window after it left, against a median of the ranks left, and
a window that spans a restart mixes the processes (and, once the job re-formed, the ranks)
before and after it. So a rank's windowed points end once it stopped reporting steps, and every
rank's are left out from just before a membership change (the restart count rose or dropped,
the world size changed) until a window after it.

A symptom's onset is its first evidence. A condition judged on a window's mean crosses its
threshold only once enough of the window holds the change: a scrape interval after it began,
or many. :func:`first_evidence` dates it from the raw counters instead, by the first grid
interval whose own steps show it; :func:`steady_ratio` measures it over the intervals that hold
nothing else.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable

from trainguard.diagnose.context import Context, runs
from trainguard.diagnose.prometheus import Series
from trainguard.diagnose.signals import Signals


def _change_times(series: Iterable[Series]) -> set[float]:
    times = set()
    for s in series:
        previous: float | None = None
        for t, v in s.points:
            if math.isnan(v):
                continue
            if previous is not None and v != previous:
                times.add(t)
            previous = v
    return times


def changes(sig: Signals) -> list[float]:
    """When the job's membership changed: a rank's restart count rose (seen once the restarted
    workers report) or dropped (a relaunch), or the world size changed."""
    return sorted(_change_times(sig.elastic_restarts.values()) | _change_times(sig.world_size))


def member_points(ctx: Context, rank: int, series: Series, window: float) -> Series:
    """``series`` (a rank's mean over ``window``) without the points that read anything but
    the job as it was: after the rank stopped, or within a window of a membership change (from
    two grid steps before it: the change happened before the restarted workers reported)."""
    sig = ctx.sig
    stopped = ctx.stopped(rank)
    cuts = [(c - 2 * sig.step, c + window) for c in changes(sig)]
    points = [
        (t, v)
        for t, v in series.points
        if (stopped is None or t <= stopped) and not any(a <= t <= b for a, b in cuts)
    ]
    return Series(series.labels, points)


def interval_means(total: Series | None, count: Series | None) -> dict[float, float]:
    """A histogram's mean observation within each grid interval, keyed by the interval's end:
    the rise of its sum over the rise of its count, where the count rose (a reset, a restart
    or a departed rank gives none)."""
    if total is None or count is None:
        return {}
    counts = dict(count.points)
    out: dict[float, float] = {}
    previous: tuple[float, float] | None = None
    for t, value in total.points:
        n = counts.get(t)
        if n is None or math.isnan(value) or math.isnan(n):
            previous = None
            continue
        if previous is not None:
            rose, more = value - previous[0], n - previous[1]
            if more > 0 and rose >= 0:
                out[t] = rose / more
        previous = (value, n)
    return out


def _interval_ratios(ctx: Context, rank: int) -> dict[float, float]:
    """The rank's compute per interval over the job's median of the same interval (at least
    ``straggler_min_ranks`` ranks reporting it)."""
    sig = ctx.sig
    means = {
        r: interval_means(sig.compute_sum.get(r), sig.compute_count.get(r)) for r in sig.compute
    }
    own = means.get(rank, {})
    out = {}
    for t, value in own.items():
        peers = [m[t] for m in means.values() if t in m]
        if len(peers) >= ctx.thresholds.straggler_min_ranks:
            median = statistics.median(peers)
            if median > 0:
                out[t] = value / median
    return out


def interval_run(ctx: Context, rank: int, threshold: float) -> tuple[float, float] | None:
    """The longest run of the rank's own intervals at ``threshold`` times the job's median or
    more, held for ``sustain_seconds``: a change the window's mean has not caught up with yet
    (a straggler excluded before its mean crossed for long), seen as it happened."""
    ratios = sorted(_interval_ratios(ctx, rank).items())
    points = max(3, math.ceil(ctx.sig.sustain_seconds / ctx.sig.raw_step))
    return runs([(t, r >= threshold) for t, r in ratios], points)


def first_evidence(
    ctx: Context, rank: int, since: float, window: float, threshold: float
) -> float | None:
    """When the rank's compute began to run slow, the run that made its mean over ``window``
    cross ``threshold`` times the job's median at ``since``: the earliest interval, walking
    back from ``since``, whose own steps ran past halfway to the threshold (one quiet interval
    in the run is sampling's: DDP times one step in several). It began after the last scrape
    before that interval (its sample's timestamp, else the interval's start). None without the
    raw counters."""
    ratios = _interval_ratios(ctx, rank)
    sig = ctx.sig
    step = sig.raw_step
    flag = 1 + (threshold - 1) / 2
    span = sorted(t for t in ratios if since - window - 2 * step <= t <= since)
    first: float | None = None
    quiet = 0
    for t in reversed(span):
        if ratios[t] >= flag:
            first, quiet = t, 0
        else:
            quiet += 1
            if quiet > 1:
                break
    if first is None:
        return None
    scraped = sig.compute_scraped.get(rank)
    prior = [v for t, v in scraped.points if t < first] if scraped is not None else []
    return prior[-1] if prior else first - step


def steady_ratio(ctx: Context, rank: int, onset: float, until: float) -> float | None:
    """The rank's compute over the job's median in the intervals wholly after ``onset`` up to
    ``until`` (the injected factor, not a window's ramp towards it); None with fewer than two."""
    ratios = _interval_ratios(ctx, rank)
    step = ctx.sig.raw_step
    within = [r for t, r in ratios.items() if onset + 2 * step <= t <= until]
    return statistics.median(within) if len(within) >= 2 else None
