"""The load generator's statistics (``benchmarks/load/run.py``): percentiles that are only
reported with enough samples, and least-squares slopes. Pure.

**The percentile rule.** A quantile q is reported only when at least ``TAIL_SAMPLES`` (10)
samples lie beyond it, that is n ≥ 10 / (1 − q): p50 needs 20 samples, p95 200, p99
1000. Below that the value is ``null`` and ``n`` says why: a p99 of 150 samples is the
second-largest sample, not a tail estimate.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Sequence
from typing import Any

TAIL_SAMPLES = 10
QUANTILES = {"p50": 0.5, "p95": 0.95, "p99": 0.99}


def min_samples(q: float, tail: int = TAIL_SAMPLES) -> int:
    """The fewest samples for which quantile ``q`` is reported: n ≥ tail / (1 − q)."""
    return math.ceil(round(tail / (1.0 - q), 9))


def quantile(values: Sequence[float], q: float) -> float:
    """The q-quantile of ``values`` (linear interpolation between order statistics)."""
    ordered = sorted(values)
    pos = q * (len(ordered) - 1)
    low = math.floor(pos)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (pos - low)


def percentiles(values: Iterable[float], digits: int = 1) -> dict[str, Any]:
    """``{n, mean, max, p50, p95, p99}``: each pXX null unless n ≥ :func:`min_samples`;
    mean and max null when there is no sample."""
    data = list(values)
    n = len(data)
    out: dict[str, Any] = {
        "n": n,
        "mean": round(statistics.fmean(data), digits) if data else None,
        "max": round(max(data), digits) if data else None,
    }
    for name, q in QUANTILES.items():
        out[name] = round(quantile(data, q), digits) if n >= min_samples(q) else None
    return out


def slope(points: Sequence[tuple[float, float]]) -> float | None:
    """Least-squares slope of y over x; None with fewer than 3 points or one x."""
    if len(points) < 3:
        return None
    mx = statistics.fmean(x for x, _ in points)
    my = statistics.fmean(y for _, y in points)
    sxx = sum((x - mx) ** 2 for x, _ in points)
    if sxx == 0:
        return None
    return sum((x - mx) * (y - my) for x, y in points) / sxx


def slope_per_minute(
    points: Sequence[tuple[float, float]], warmup: float = 0.0, digits: int = 3
) -> float | None:
    """The slope of y per minute for ``(seconds, y)`` points, leaving out the first
    ``warmup`` fraction of their time span."""
    if not points:
        return None
    start, end = points[0][0], points[-1][0]
    cut = start + warmup * (end - start)
    fitted = slope([p for p in points if p[0] >= cut])
    return None if fitted is None else round(fitted * 60.0, digits)
