"""The robust statistics the benchmarks print their ratios with: quartiles, a distribution-free
interval of the median, percentiles, per-round ratios."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence


def quartiles(values: Sequence[float]) -> tuple[float, float]:
    if len(values) < 2:
        return values[0], values[0]
    q = statistics.quantiles(values, n=4)
    return q[0], q[2]


def per_round_ratios(values: dict[str, list[float]], variant: str) -> list[float]:
    return [a / b for a, b in zip(values[variant], values["plain"], strict=True)]


def summed(per_rank: Sequence[Sequence[float]]) -> list[float]:
    """Element-wise sum over ranks."""
    return [sum(values) for values in zip(*per_rank, strict=True)]


def median_interval(values: Sequence[float], z: float = 1.96) -> tuple[float, float]:
    """A 95% confidence interval of the median, free of any assumption on the distribution:
    the order statistics n/2 -+ z*sqrt(n)/2 (the binomial's normal approximation)."""
    ordered = sorted(values)
    n = len(ordered)
    half = z * math.sqrt(n) / 2
    low = max(0, math.floor(n / 2 - half))
    high = min(n - 1, math.ceil(n / 2 + half))
    return ordered[low], ordered[high]


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]
