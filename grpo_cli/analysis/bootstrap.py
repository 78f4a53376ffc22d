"""Seed-level intervals for the judged numbers (pure numpy, deterministic).

The independent unit of a sweep is the seed (one training run): probe steps of one run are
autocorrelated and its prompt groups share its weights, so within-run noise is not resampled.
Each run keeps its window mean as it is, and a judged number gets a Student-t interval from the
spread of those run values (issue 42: the former seeds -> steps -> groups bootstrap, widened by
sqrt(n/(n-1)) t/z, counted within-run noise two or three times and covered 99.5-100% at a
nominal 90%):
- a per-R mean over n seeds: mean +- t_{n-1} s / sqrt(n);
- a linear combination of independent per-R means (the slope over R, a difference of two
  variants): Welch's se and Welch-Satterthwaite df (floored to an integer, conservative), or,
  where every seed has a run at every R, the t-interval of the per-seed values (`paired`),
  which respects the pairing by seed;
- a `grpo probe` run (one set of weights): its prompt groups are the units instead.
One unit gives no interval (the spread between units is unknown). An interval is clipped to the
range the measure can take (`bounds`: a rank is >= 0, a per-group rank <= R), which can only
raise its coverage. `replicates` are draws of estimate + se T_df (clipped the same way): the
sampling distribution the interval is read from; the flip probability of every claim is the
share of them whose reading differs from the estimate's.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from functools import lru_cache
from statistics import NormalDist

import numpy as np

from grpo_cli.analysis.rules import MAX_SEEDS_ADVICE

UNBOUNDED = (-math.inf, math.inf)
DRAWS = 1000  # draws of the sampling distribution per judged number (flip probabilities)


def _t_central_mass(t: float, df: int) -> float:
    """P(|T| < t) for Student's t with integer df (Abramowitz & Stegun 26.7.3-4, exact)."""
    theta = math.atan(t / math.sqrt(df))
    c2, s = math.cos(theta) ** 2, math.sin(theta)
    if df % 2:
        if df == 1:
            return 2 * theta / math.pi
        term = total = math.cos(theta)
        for k in range(1, (df - 3) // 2 + 1):
            term *= c2 * (2 * k) / (2 * k + 1)
            total += term
        return 2 / math.pi * (theta + s * total)
    term = total = 1.0
    for k in range(1, (df - 2) // 2 + 1):
        term *= c2 * (2 * k - 1) / (2 * k)
        total += term
    return s * total


@lru_cache(maxsize=4096)
def t_quantile(p: float, df: int) -> float:
    """The p-quantile (p > 0.5) of Student's t with integer df >= 1: bisection on the exact
    CDF up to df = 30, the Cornish-Fisher expansion in 1/df beyond (error < 1e-4)."""
    if df > 30:
        z = NormalDist().inv_cdf(p)
        return z + (z**3 + z) / (4 * df) + (5 * z**5 + 16 * z**3 + 3 * z) / (96 * df**2)
    target = 2 * p - 1  # central mass
    low, high = 0.0, 1.0
    while _t_central_mass(high, df) < target:
        high *= 2
    for _ in range(60):
        mid = (low + high) / 2
        low, high = (mid, high) if _t_central_mass(mid, df) < target else (low, mid)
    return (low + high) / 2


def t_upper_tail(t: float, df: int) -> float:
    """P(T > t) for Student's t with integer df >= 1 (exact)."""
    if math.isnan(t):
        return math.nan
    if math.isinf(t):
        return 0.0 if t > 0 else 1.0
    mass = _t_central_mass(abs(t), df)
    return (1 - mass) / 2 if t >= 0 else (1 + mass) / 2


@dataclass
class Interval:
    """An estimate with its interval; `replicates` are draws of its sampling distribution."""

    estimate: float
    low: float
    high: float
    n: int  # independent units (seeds, or a probe run's groups) behind the interval
    replicates: np.ndarray = field(repr=False, default_factory=lambda: np.empty(0))
    se: float = math.nan  # standard error of the estimate
    df: int = 0  # degrees of freedom of its t distribution

    @property
    def finite(self) -> bool:
        return math.isfinite(self.low) and math.isfinite(self.high)

    def text(self, digits: int = 2, sign: bool = False) -> str:
        form = f"{{:{'+' if sign else ''}.{digits}f}}"
        if not self.finite:
            return f"{form.format(self.estimate)} [no interval: {self.n} seed]"
        return f"{form.format(self.estimate)} [{form.format(self.low)}, {form.format(self.high)}]"


def no_interval(estimate: float, n: int) -> Interval:
    return Interval(estimate, -math.inf, math.inf, n)


def t_interval(estimate: float, se: float, df: int, n: int, confidence: float,
               rng: np.random.Generator, draws: int = DRAWS,
               bounds: tuple[float, float] = UNBOUNDED) -> Interval:
    """estimate +- t_df se at two-sided `confidence`, clipped to `bounds`, with `draws`
    draws of estimate + se T_df (clipped too); no interval for df < 1 or a non-finite se."""
    if df < 1 or not (math.isfinite(se) and math.isfinite(estimate)):
        return no_interval(estimate, n)
    half = t_quantile(0.5 + confidence / 2, df) * se
    lo, hi = bounds
    replicates = np.clip(estimate + se * rng.standard_t(df, draws), lo, hi)
    return Interval(estimate, max(estimate - half, lo), min(estimate + half, hi), n,
                    replicates, se, df)


def at_confidence(interval: Interval, confidence: float,
                  bounds: tuple[float, float] = UNBOUNDED) -> Interval:
    """`interval`'s t-interval at another two-sided `confidence` (the same estimate, se, df
    and units; no draws), clipped to `bounds`; no interval where it has none."""
    if interval.df < 1 or not (interval.finite and math.isfinite(interval.se)):
        return no_interval(interval.estimate, interval.n)
    half = t_quantile(0.5 + confidence / 2, interval.df) * interval.se
    return Interval(interval.estimate, max(interval.estimate - half, bounds[0]),
                    min(interval.estimate + half, bounds[1]), interval.n, se=interval.se,
                    df=interval.df)


def _p_below(estimate: float, se: float, df: int, bound: float) -> float:
    if se == 0:
        return 0.0 if estimate < bound else 1.0
    return t_upper_tail((bound - estimate) / se, df)


def p_below(interval: Interval, bound: float) -> float:
    """The one-sided p-value of "the estimate lies below `bound`" from the interval's t
    distribution: its two-sided interval at confidence c lies wholly below `bound` exactly when
    this is < (1 - c) / 2 (clipping aside). A zero se gives 0 or 1; NaN with no interval."""
    if interval.df < 1 or not (interval.finite and math.isfinite(interval.se)):
        return math.nan
    return _p_below(interval.estimate, interval.se, interval.df, bound)


def p_above(interval: Interval, bound: float) -> float:
    """`p_below`'s mirror: the one-sided p-value of "the estimate lies above `bound`"."""
    if interval.df < 1 or not (interval.finite and math.isfinite(interval.se)):
        return math.nan
    return _p_below(-interval.estimate, interval.se, interval.df, -bound)


def _with_more_seeds(interval: Interval, more: int) -> Interval:
    """`interval` as `more` more units with the same spread would give it: se x sqrt(n / (n +
    more)), `more` more df (its bounds are not recomputed: only estimate, se and df are read)."""
    if more == 0:
        return interval
    n = max(interval.n, 1)
    return replace(interval, n=n + more, se=interval.se * math.sqrt(n / (n + more)),
                   df=interval.df + more)


@dataclass(frozen=True)
class Contradiction:
    """The tests behind a part's contradicted reading: the part reads contradicted when one of
    `tests` (an interval, a bound, and "below" or "above": where the interval must lie) holds at
    the Bonferroni level over `factor` of them (2c: the k judged R, whose two sides exclude each
    other; claim 4: its two intervals)."""

    tests: tuple[tuple[Interval, float, str], ...]
    factor: int = 1

    def p(self, more_seeds: int = 0) -> float:
        """The reading's one-sided p-value, Bonferroni factor included (NaN if a test has no
        interval): it reads contradicted at confidence c iff this is < (1 - c) / 2. With
        `more_seeds` more units behind every interval, the spread between them held fixed (se
        scaled by sqrt(n / (n + more)), one more df a unit), as `seeds_to_settle` assumes."""
        ps = [(p_below if side == "below" else p_above)(_with_more_seeds(iv, more_seeds), bound)
              for iv, bound, side in self.tests]
        return float(np.minimum(1.0, self.factor * np.min(ps))) if ps else math.nan  # NaN stays

    def seeds_to_reach(self, level: float) -> int | None:
        """The fewest more seeds (on every side) at which `p` is <= `level`; None when no
        number up to MAX_SEEDS_ADVICE does (an estimate on or inside its bound)."""
        if not math.isfinite(self.p()):
            return None
        for more in range(0, MAX_SEEDS_ADVICE + 1):
            if self.p(more) <= level:
                return more
        return None


def mean_interval(values, confidence: float, rng: np.random.Generator, draws: int = DRAWS,
                  bounds: tuple[float, float] = UNBOUNDED) -> Interval:
    """The mean of independent `values` (one per seed) with its t-interval (n - 1 df)."""
    values = np.asarray(values, float)
    values = values[np.isfinite(values)]
    n = len(values)
    if n == 0:
        return no_interval(math.nan, 0)
    if n < 2:
        return no_interval(float(values.mean()), n)
    se = float(values.std(ddof=1)) / math.sqrt(n)
    return t_interval(float(values.mean()), se, n - 1, n, confidence, rng, draws, bounds)


def welch_interval(groups: Sequence[np.ndarray], weights: Sequence[float], confidence: float,
                   rng: np.random.Generator, draws: int = DRAWS) -> Interval:
    """sum_g w_g mean_g over independent `groups` (each a sample of independent units) with
    Welch's se and the Welch-Satterthwaite df (floored); no interval when a group has < 2."""
    groups = [np.asarray(g, float) for g in groups]
    if any(len(g) == 0 for g in groups):
        return no_interval(math.nan, 0)
    estimate = float(sum(w * g.mean() for g, w in zip(groups, weights, strict=True)))
    n = min(len(g) for g in groups)
    if n < 2:
        return no_interval(estimate, n)
    parts = np.array([w * w * g.var(ddof=1) / len(g)
                      for g, w in zip(groups, weights, strict=True)])
    var = float(parts.sum())
    if var == 0:
        return Interval(estimate, estimate, estimate, n, np.full(draws, estimate), 0.0, n - 1)
    dof = var**2 / sum(p * p / (len(g) - 1) for p, g in zip(parts, groups, strict=True)
                       if p > 0)
    return t_interval(estimate, math.sqrt(var), max(1, math.floor(dof + 1e-9)), n, confidence,
                      rng, draws)


def slope(log2_sizes: np.ndarray, means: np.ndarray) -> np.ndarray:
    """Least-squares slope of `means` [..., nR] against `log2_sizes` [nR] (per doubling)."""
    x = log2_sizes - log2_sizes.mean()
    return (means - means.mean(axis=-1, keepdims=True)) @ x / (x @ x)


def slope_per_doubling(sizes, values) -> float:
    """`slope` of one reading per R against log2(R), leaving out non-finite values (NaN with
    fewer than two R values left)."""
    sizes, values = np.asarray(sizes, float), np.asarray(values, float)
    keep = np.isfinite(values)
    if keep.sum() < 2:
        return float("nan")
    return float(slope(np.log2(sizes[keep]), values[keep]))


def flip_probability(estimate: float, replicates: np.ndarray,
                     reading: Callable[[np.ndarray], np.ndarray]) -> float:
    """Share of replicates whose reading (a boolean of the value) differs from the estimate's."""
    if replicates.size == 0:
        return math.nan
    return float(np.mean(reading(replicates) != reading(np.array([estimate]))[0]))


def seeds_to_settle(iv: Interval, boundaries: Sequence[float], confidence: float) -> int | None:
    """Roughly how many seeds in all would move every boundary in `boundaries` out of the
    interval: each side's half-width scales as t_{n-1}/sqrt(n) (the spread between seeds held
    fixed). None when the estimate sits on a boundary, or beyond MAX_SEEDS_ADVICE."""
    inside = [b for b in boundaries if iv.low <= b <= iv.high]
    if not inside or not iv.finite or iv.n < 2:
        return None
    base = _half_scale(iv.n, confidence)
    need = iv.n
    for b in inside:
        half = iv.high - iv.estimate if b >= iv.estimate else iv.estimate - iv.low
        distance = abs(b - iv.estimate)
        if distance == 0:
            return None
        n = iv.n + 1
        while half * _half_scale(n, confidence) / base >= distance:
            n += 1
            if n > MAX_SEEDS_ADVICE:
                return None
        need = max(need, n)
    return need


def _half_scale(n: int, confidence: float) -> float:
    """t_{n-1} / sqrt(n): how a t-interval's half-width scales with n units."""
    return t_quantile(0.5 + confidence / 2, n - 1) / math.sqrt(n)
