"""Claim 2's reading over R, computed once: given one rank per group size R, the R values it is
judged on (the uncapped ones, rules.judged_group_sizes), the least-squares slope of the rank
against log2(R) per doubling of R, and the largest deviation from the target over them.

Every table that reads "does the rank stay at 2 as R grows?" on point estimates calls
`reading_over_r`: claim 2's verdict rows (rank_verdict.py, whose intervals come from the same
point values), the stages (collapse.py), matched progress (rank_verdict.point_reading,
matching.py), the same checkpoint (same_checkpoint.py) and claim 4's outcome slope
(credit_compare.py).

Its interval form is one kernel too: `per_r_intervals` (each R's seed-level t-interval and the
units behind it) and `slope_interval` (the slope per doubling with the t-interval of per-seed
slopes, or Welch's where the seeds differ between R): claim 2's verdict (rank_verdict.py), the
readings beside it (diversity.py, layer_gradient.py, falsifier.py) and the same checkpoint."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import pandas as pd

from grpo_cli.analysis import bootstrap as bs
from grpo_cli.analysis.bootstrap import slope_per_doubling
from grpo_cli.analysis.rules import Rules, judged_group_sizes

EMPTY = np.empty(0)


@dataclass(frozen=True)
class OverR:
    """Point reading of one rank per R (NaN where it cannot be made)."""

    judged: tuple[int, ...]  # uncapped R values with a finite rank, ascending
    slope: float  # rank units per doubling of R over `judged` (NaN with fewer than two)
    max_deviation: float  # max |rank - target| over `judged` (NaN with none)

    @property
    def judged_text(self) -> str:  # "4,8,16"
        return ",".join(map(str, self.judged))


def reading_over_r(means: Mapping[int, float], target: float) -> OverR:
    """Claim 2's numbers over R from `means` {R: rank}; R values whose rank is not finite, and
    the capped ones (R <= target), do not count."""
    finite = {int(r): float(m) for r, m in means.items() if math.isfinite(float(m))}
    judged = tuple(judged_group_sizes(finite, target))
    values = [finite[r] for r in judged]
    return OverR(
        judged=judged,
        slope=slope_per_doubling(judged, values),
        max_deviation=max((abs(v - target) for v in values), default=math.nan),
    )


# ---- the same reading with intervals: one kernel for claim 2 and every reading beside it ----
@dataclass
class PerR:
    """One R of one variant x matrix x measure: its interval and the independent units behind
    it (one window mean per seed, or a `grpo probe` run's prompt groups)."""

    interval: bs.Interval
    units: np.ndarray  # [n] the values whose mean is the estimate
    seeds: tuple | None  # the seed of each unit (None: groups of one run)


def per_r_intervals(part: pd.DataFrame, groups: dict, use_groups: bool, rules: Rules, rng,
                    bounds, same_weights: frozenset[str] = frozenset()) -> dict[int, PerR]:
    """R -> PerR for one variant x matrix x measure (`part`: rows of group_size, run_id, seed,
    step, value). Each run keeps its mean over its rows (its probe steps and groups are not
    independent); seeds are the units. A single `grpo probe` run (`same_weights`: one set of
    weights, no seed-to-seed training variation) uses its prompt groups (`groups`: (run_id,
    step) -> per-group values) as the units instead, about the run's value. `bounds(R)`: the
    range a reading can take."""
    out = {}
    for size, rows in part.groupby("group_size"):
        per_run = rows.groupby("run_id", sort=True).agg(value=("value", "mean"),
                                                        seed=("seed", "first"))
        values = per_run["value"].to_numpy(float)
        if not np.isfinite(values).any():
            continue
        size = int(size)
        run_id = per_run.index[0]
        if len(per_run) == 1 and use_groups and run_id in same_weights:
            steps = rows.loc[rows["run_id"] == run_id, "step"].astype(int).unique()
            found = [groups.get((run_id, int(s)), EMPTY) for s in steps]
            pooled = np.concatenate(found) if found else EMPTY
            if pooled.size >= 2:
                units = pooled + (values[0] - pooled.mean())  # [groups], mean = the run's value
                iv = bs.mean_interval(units, rules.confidence, rng, rules.resamples,
                                      bounds(size))
                out[size] = PerR(iv, units, None)
                continue
        iv = bs.mean_interval(values, rules.confidence, rng, rules.resamples, bounds(size))
        seeds = tuple(per_run["seed"])
        out[size] = PerR(iv, values, seeds if len(set(seeds)) == len(seeds) else None)
    return out


def slope_interval(per_r: dict[int, PerR], judged: list[int], rules: Rules, rng) -> bs.Interval:
    """The least-squares slope per doubling over `judged` with its interval: the t-interval of
    per-seed slopes when every judged R has one run per seed of the same seeds (the pairing by
    seed is kept), else Welch's interval of the slope as a linear combination of the per-R
    means (runs at different R independent)."""
    x = np.log2(np.array(judged, dtype=float))
    estimates = np.array([per_r[r].interval.estimate for r in judged])
    estimate = float(bs.slope(x, estimates))
    keys = [per_r[r].seeds for r in judged]
    if all(k is not None for k in keys) and len({frozenset(k) for k in keys}) == 1:
        seeds = sorted(keys[0])
        table = np.array([[dict(zip(per_r[r].seeds, per_r[r].units, strict=True))[s]
                           for r in judged] for s in seeds])  # [seed, judged R]
        iv = bs.mean_interval(bs.slope(x, table), rules.confidence, rng, rules.resamples)
    else:
        weights = (x - x.mean()) / ((x - x.mean()) @ (x - x.mean()))
        iv = bs.welch_interval([per_r[r].units for r in judged], weights, rules.confidence, rng,
                               rules.resamples)
    iv.estimate = estimate  # the slope of the means: the same number up to round-off
    return iv
