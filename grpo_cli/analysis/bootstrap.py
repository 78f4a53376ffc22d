"""Hierarchical bootstrap intervals for the judged numbers (pure numpy, deterministic).

A judged number is a mean over seeds of each run's mean over probe steps of a value that is
itself, for per-group matrices, a mean over the step's groups. The bootstrap mirrors that
nesting: resample seeds, then probe steps within each drawn seed, then groups within each drawn
step (where per-group values exist; the step's official value is shifted by the resampled
groups' deviation from their mean, so the estimate is the summary's own number).

With n = 2-4 seeds the percentile interval is too narrow (a mean of two values can only resample
to the two values and their midpoint), so every replicate's deviation from the estimate is
scaled by sqrt(n / (n - 1)) t_{n-1} / z at the interval's level: for normal data this turns the
percentile interval into the Student-t interval. One seed gives no interval (the spread between
seeds is unknown).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from statistics import NormalDist

import numpy as np

from grpo_cli.analysis.rules import MAX_SEEDS_ADVICE

Step = tuple[float, np.ndarray]  # a probe step: its value, and its per-group values (may be empty)
RunSteps = Sequence[Step]  # one run (seed): its probe steps
CHUNK = 1_000_000  # group draws per batch (memory bound)


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


@lru_cache(maxsize=4096)
def widening(n: int, confidence: float) -> float:
    """sqrt(n/(n-1)) t_{n-1}/z at two-sided `confidence`; inf for n < 2."""
    if n < 2:
        return math.inf
    p = 0.5 + confidence / 2
    return math.sqrt(n / (n - 1)) * t_quantile(p, n - 1) / NormalDist().inv_cdf(p)


@dataclass
class Interval:
    """An estimate with its widened bootstrap interval; `replicates` are the widened ones."""

    estimate: float
    low: float
    high: float
    n: int  # top-level sample size (seeds) that set the widening
    replicates: np.ndarray = field(repr=False, default_factory=lambda: np.empty(0))

    @property
    def finite(self) -> bool:
        return math.isfinite(self.low) and math.isfinite(self.high)

    def text(self, digits: int = 2, sign: bool = False) -> str:
        form = f"{{:{'+' if sign else ''}.{digits}f}}"
        if not self.finite:
            return f"{form.format(self.estimate)} [no interval: {self.n} seed]"
        return f"{form.format(self.estimate)} [{form.format(self.low)}, {form.format(self.high)}]"


def interval(estimate: float, replicates: np.ndarray, n: int, confidence: float) -> Interval:
    """Percentile interval of `replicates` after widening their deviations from `estimate`."""
    k = widening(n, confidence)
    if not math.isfinite(k) or replicates.size == 0 or not math.isfinite(estimate):
        return Interval(estimate, -math.inf, math.inf, n, np.empty(0))
    widened = estimate + k * (replicates - estimate)
    alpha = (1 - confidence) / 2
    low, high = np.quantile(widened, [alpha, 1 - alpha])
    return Interval(estimate, float(low), float(high), n, widened)


def run_replicates(steps: RunSteps, rng: np.random.Generator, size: int) -> np.ndarray:
    """`size` bootstrap replicates of one run's mean over its steps [size]: steps resampled,
    then groups within each drawn step."""
    values = np.array([v for v, _ in steps], dtype=float)  # [k]
    k = len(values)
    pick = rng.integers(0, k, (size, k))  # [size, k]
    drawn = values[pick]
    counts = np.array([len(g) for _, g in steps])  # [k]
    width = int(counts.max()) if k else 0
    if width > 1:
        padded = np.zeros((k, width))  # [k, width]: the step's group values, zero-padded
        for i, (_, groups) in enumerate(steps):
            padded[i, : len(groups)] = groups
        means = np.array([g.mean() if len(g) else 0.0 for _, g in steps])  # [k]
        chunk = max(1, CHUNK // (k * width))
        for start in range(0, size, chunk):
            rows = slice(start, start + chunk)
            n = counts[pick[rows]]  # [chunk, k]
            idx = (rng.random((*n.shape, width)) * np.maximum(n, 1)[..., None]).astype(int)
            mask = np.arange(width) < n[..., None]  # [chunk, k, width]
            resampled = (padded[pick[rows][..., None], idx] * mask).sum(-1) / np.maximum(n, 1)
            drawn[rows] += np.where(n > 0, resampled - means[pick[rows]], 0.0)
    return drawn.mean(axis=1)


def nested_mean(runs: Sequence[RunSteps]) -> float:
    """The estimate: mean over runs of each run's mean step value."""
    return float(np.mean([np.mean([v for v, _ in steps]) for steps in runs]))


def mean_replicates(runs: Sequence[RunSteps], rng: np.random.Generator, resamples: int) -> np.ndarray:
    """Replicates [resamples] of `nested_mean`: seeds resampled, then steps, then groups."""
    n = len(runs)
    per_run = np.stack([run_replicates(steps, rng, resamples * n) for steps in runs])
    per_run = per_run.reshape(n, resamples, n)  # [run, replicate, slot]
    seeds = rng.integers(0, n, (resamples, n))  # [replicate, slot]
    return per_run[seeds, np.arange(resamples)[:, None], np.arange(n)].mean(axis=1)


def mean_interval(
    runs: Sequence[RunSteps], confidence: float, resamples: int, rng: np.random.Generator
) -> Interval:
    """The nested mean of `runs` with its interval (no interval for one run)."""
    runs = [steps for steps in runs if len(steps)]
    if not runs:
        return Interval(math.nan, -math.inf, math.inf, 0)
    estimate = nested_mean(runs)
    if len(runs) < 2:
        return Interval(estimate, -math.inf, math.inf, len(runs))
    return interval(estimate, mean_replicates(runs, rng, resamples), len(runs), confidence)


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
    interval: each side's half-width scales as widening(n)/sqrt(n). None when the estimate sits
    on a boundary, or beyond MAX_SEEDS_ADVICE."""
    inside = [b for b in boundaries if iv.low <= b <= iv.high]
    if not inside or not iv.finite or iv.n < 2:
        return None
    base = widening(iv.n, confidence) / math.sqrt(iv.n)
    need = iv.n
    for b in inside:
        half = iv.high - iv.estimate if b >= iv.estimate else iv.estimate - iv.low
        distance = abs(b - iv.estimate)
        if distance == 0:
            return None
        n = iv.n + 1
        while half * (widening(n, confidence) / math.sqrt(n)) / base >= distance:
            n += 1
            if n > MAX_SEEDS_ADVICE:
                return None
        need = max(need, n)
    return need
