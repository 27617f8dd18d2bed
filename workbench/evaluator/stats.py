"""How precisely a timing is known: distribution-free confidence intervals of medians, speedups and their geomean.

Pure functions over per-rep times (no torch), used by the trusted process to decide when to stop timing and by
the result to say how precise a speedup is. Intervals are 95% ones built from order statistics, so they hold for
any distribution of rep times (GPU timings are skewed: a long tail of interrupted reps).
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass

Z95 = 1.959964
"""The normal quantile of a two-sided 95% interval."""


def summarize(ms: list[float]) -> dict[str, float]:
    """Median, IQR and extremes of per-rep times (NaN for an empty list)."""
    if not ms:
        return {"median": math.nan, "iqr": math.nan, "min": math.nan, "max": math.nan}
    if len(ms) >= 4:
        q1, _, q3 = statistics.quantiles(ms, n=4)
    else:
        q1 = q3 = statistics.median(ms)
    return {"median": statistics.median(ms), "iqr": q3 - q1, "min": min(ms), "max": max(ms)}


def median_ci(values: list[float]) -> tuple[float, float]:
    """A 95% confidence interval of the population median from order statistics.

    The interval is [x_(j), x_(k)] with j, k = n/2 -+ z*sqrt(n)/2 (1-based, rounded outwards), the normal
    approximation to the binomial count of values below the median. With fewer than 6 values no interval narrower
    than the whole sample exists, so the extremes are returned.
    """
    if not values:
        return (math.nan, math.nan)
    xs = sorted(values)
    n = len(xs)
    half = Z95 * math.sqrt(n) / 2
    lo = max(1, math.floor(n / 2 - half))
    hi = min(n, math.ceil(n / 2 + half + 1))
    return (xs[lo - 1], xs[hi - 1])


@dataclass(frozen=True)
class RatioCI:
    """A speedup (baseline median / candidate median) and a conservative 95% interval around it."""

    speedup: float
    low: float
    high: float

    @property
    def rel_halfwidth(self) -> float:
        """Half the interval's width over the speedup: 0.01 means "known to about +-1%"."""
        if not (self.speedup > 0 and math.isfinite(self.low) and math.isfinite(self.high)):
            return math.inf
        return (self.high - self.low) / 2 / self.speedup


def ratio_ci(baseline: list[float], candidate: list[float]) -> RatioCI:
    """The speedup of candidate over baseline with an interval from both medians' intervals.

    The bounds pair each side's extreme ([b_lo / c_hi, b_hi / c_lo]): if each median interval covers with 95%,
    this one covers with at least 90% and usually far more, which errs on the side of timing longer.
    """
    if not baseline or not candidate:
        return RatioCI(math.nan, math.nan, math.nan)
    b, c = statistics.median(baseline), statistics.median(candidate)
    (b_lo, b_hi), (c_lo, c_hi) = median_ci(baseline), median_ci(candidate)
    if not (c > 0 and c_lo > 0):
        return RatioCI(math.nan, math.nan, math.nan)
    return RatioCI(b / c, b_lo / c_hi, b_hi / c_lo)


def geomean_ci(cis: list[RatioCI]) -> RatioCI | None:
    """The geometric mean of several speedups with an interval: half-widths in log space added in quadrature.

    Shapes are timed independently, so their errors add like independent ones; None when any speedup is missing.
    """
    if not cis or any(not (ci.speedup > 0 and ci.low > 0 and ci.high > 0) for ci in cis):
        return None
    n = len(cis)
    center = sum(math.log(ci.speedup) for ci in cis) / n
    half = math.sqrt(sum(((math.log(ci.high) - math.log(ci.low)) / 2) ** 2 for ci in cis)) / n
    return RatioCI(math.exp(center), math.exp(center - half), math.exp(center + half))


@dataclass(frozen=True)
class StopRule:
    """When interleaved timing of one shape may stop: precise enough, or out of reps or time.

    Measured on the H200 (2026-12-01): a launch-bound baseline's event times spread so widely (MLA M1, M2) that
    600 reps still leave the speedup at +-1-4%, and every rep costs its refill, flush and gate beyond the kernel;
    so the wall time a shape may take is bounded too, and the result says how precise it got.
    """

    target: float = 0.01
    """Stop once the speedup's interval is within +-target (relative)."""
    min_reps: int = 10
    """Never fewer reps per side: fewer order statistics leave no interval narrower than the sample."""
    min_blocks: int = 3
    """Never fewer interleaved blocks per side, so a drifting clock is seen by both sides."""
    max_reps: int = 600
    """Never more reps per side (a noisy GPU still ends)."""
    max_side_ms: float = 20_000.0
    """Never more measured time per side than this (a very slow candidate has lost anyway)."""
    max_wall_s: float = 1.0
    """Never more wall time on one shape's interleaved blocks once min_reps and min_blocks are in."""

    def done(self, baseline: list[float], candidate: list[float], blocks: int, wall_s: float = 0.0) -> bool:
        """True when timing may stop after `blocks` blocks per side and wall_s seconds on this shape."""
        reps = min(len(baseline), len(candidate))
        if reps >= self.max_reps or max(sum(baseline), sum(candidate)) >= self.max_side_ms:
            return True
        if reps < self.min_reps or blocks < self.min_blocks:
            return False
        return wall_s >= self.max_wall_s or ratio_ci(baseline, candidate).rel_halfwidth <= self.target
