"""Claims 2 and 4 at matched diversity: is a rank's growth the gradient's geometry, or only the
number of distinct completions each R samples?

A group's R x P matrix has at most as many independent rows as the group has distinct
completions (identical completions give identical rows under any credit), so a rank that grows
with R can grow only because a larger group samples more distinct completions from the same
policy: a property of the policy's entropy, not of GRPO's geometry (issue 61). Read on claim 2's
matrix and rows (`rules.rank_matrix`, informative per-group rows; claim 4: its deciding rows,
credit_compare.deciding_stat), in claim 2's window (each run's last `last_fraction` of probe
steps):

- `slope_readings`: the per-seed least-squares slope of a group's rank on log2 R, without
  control (`raw`) and with distinct completions as categories (`matched`: fixed effects, the
  slope within groups of equal distinct count; `within_slope`), each a seed-level t-interval;
  on one set of weights (`grpo probe`) the groups are the units (the regression's own se);
- `closed_form_share`: the rank as a share of the orthogonal closed form at the group's
  composition and distinct completions (ranks.csv pred_distinct_<measure>, outcome estimators
  only), per R and its slope per doubling, with claim 2's intervals (over_r.per_r_intervals);
- `growth_source`: which of the two moves with R;
- `per_distinct_difference`: claim 4's per-token minus outcome rank per distinct completion,
  paired by seed where both sides ran the same seeds;
- `bar_reachable`: whether a group's distinct completions leave room for claim 4's absolute bar.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd

from grpo_cli.analysis import bootstrap as bs
from grpo_cli.analysis import credit_compare as cc
from grpo_cli.analysis.load import Run
from grpo_cli.analysis.over_r import per_r_intervals, slope_interval
from grpo_cli.analysis.rules import Rules, judged_group_sizes
from grpo_cli.analysis.summary import last_part
from grpo_cli.analysis.tables import META, run_meta

COLUMNS = [*META, "step", "group", "stat", "value", "distinct", "predicted_distinct"]
DIVERSITY, GEOMETRY, NO_GROWTH, UNDECIDED = "diversity", "geometry", "no growth", "undecided"


def _numeric(rows: pd.DataFrame, name: str) -> pd.Series:
    return pd.to_numeric(rows[name], errors="coerce") if name in rows else pd.Series(
        np.nan, index=rows.index)


def group_frame(runs: list[Run], rules: Rules) -> pd.DataFrame:
    """One row per run x probe step x informative group of `rules.rank_matrix` and selection
    (`stat`: credit_compare.group_selections): the group's rank (`rules.rank_measure`), its
    distinct completions and the closed form over them (NaN where it does not apply)."""
    measure, parts = rules.rank_measure, []
    for run in runs:
        ranks = run.ranks
        if ranks.empty or measure not in ranks or "distinct" not in ranks or "group" not in ranks:
            continue
        rows = ranks[(ranks["matrix"] == rules.rank_matrix)
                     & ranks["group"].astype(str).str.match(r"g\d")]
        rows = rows.assign(value=_numeric(rows, measure), distinct=_numeric(rows, "distinct"),
                           predicted_distinct=_numeric(rows, f"pred_distinct_{measure}"))
        for stat, picked in cc.group_selections(rows, rules).items():
            parts.append(picked[["step", "group", "value", "distinct", "predicted_distinct"]]
                         .assign(stat=stat, **run_meta(run)))
    frame = pd.concat(parts, ignore_index=True) if parts else pd.DataFrame(columns=COLUMNS)
    keep = np.isfinite(frame["value"].astype(float)) & (frame["value"] != 0) & (frame["distinct"] >= 1)
    return frame[keep][COLUMNS].reset_index(drop=True)


def window(frame: pd.DataFrame, rules: Rules) -> pd.DataFrame:
    """Claim 2's window: each run's last `rules.last_fraction` of probe steps."""
    return last_part(frame, rules.last_fraction)


def early(frame: pd.DataFrame) -> pd.DataFrame:
    """Each run's first half of its probe steps (collapse.py's early stage: the middle step of
    an odd count is late)."""
    if frame.empty:
        return frame
    steps = frame[["run_id", "step"]].drop_duplicates().sort_values(["run_id", "step"])
    order = steps.groupby("run_id").cumcount()
    count = steps.groupby("run_id")["step"].transform("size")
    first = steps[order < count // 2]
    return frame.merge(first, on=["run_id", "step"])


def within_slope(y, x, category) -> tuple[float, float, int]:
    """(coefficient, se, df) of `x` in the least-squares fit y ~ x + C(category): by Frisch-Waugh-
    Lovell, the slope of y on x after both are centred within each category. NaN coefficient
    where x does not vary within any category; NaN se where no df is left (n - categories - 1)."""
    y, x = np.asarray(y, float), np.asarray(x, float)
    codes = pd.factorize(pd.Series(np.asarray(category)))[0]
    counts = np.bincount(codes)

    def centred(v: np.ndarray) -> np.ndarray:
        return v - (np.bincount(codes, weights=v) / counts)[codes]

    xc, yc = centred(x), centred(y)
    sxx = float(xc @ xc)
    if not sxx > 1e-12 * max(float(x @ x), 1e-300):  # x constant within every category
        return math.nan, math.nan, 0
    coefficient = float(xc @ yc) / sxx
    df = len(y) - len(counts) - 1
    residual = yc - coefficient * xc
    se = math.sqrt(float(residual @ residual) / df / sxx) if df > 0 else math.nan
    return coefficient, se, df


@dataclass(frozen=True)
class SlopeAtMatchedDiversity:
    """A group's rank against log2 R over the judged R, per doubling."""

    raw: bs.Interval  # without control
    matched: bs.Interval  # with distinct completions as categories (fixed effects)
    units: str  # "seeds" (per-seed slopes' t-interval) or "groups" (one set of weights)
    judged: tuple[int, ...]


def _unit_slope(rows: pd.DataFrame, controlled: bool) -> tuple[float, float, int]:
    category = rows["distinct"].round().to_numpy() if controlled else np.zeros(len(rows))
    return within_slope(rows["value"], np.log2(rows["group_size"].astype(float)), category)


def slope_readings(rows: pd.DataFrame, rules: Rules, rng: np.random.Generator,
                   groups_are_units: bool = False) -> SlopeAtMatchedDiversity | None:
    """`rows` (one variant's `group_frame` rows in the window, one selection): the per-seed
    slopes' t-intervals; with one seed and `groups_are_units` (a `grpo probe` run: one set of
    weights), the regression's own se over the groups. None with fewer than two judged R."""
    judged = tuple(judged_group_sizes({int(r) for r in rows["group_size"]}, rules.target))
    if len(judged) < 2:
        return None
    rows = rows[rows["group_size"].isin(judged)]
    seeds = rows["seed"].unique()
    readings = []
    for controlled in (False, True):
        if len(seeds) >= 2 or not groups_are_units:
            per_seed = [_unit_slope(part, controlled)[0] for _, part in rows.groupby("seed")]
            readings.append(bs.mean_interval(per_seed, rules.confidence, rng, rules.resamples))
        else:
            estimate, se, df = _unit_slope(rows, controlled)
            readings.append(bs.t_interval(estimate, se, df, len(rows), rules.confidence, rng,
                                          rules.resamples))
    units = "seeds" if len(seeds) >= 2 or not groups_are_units else "groups"
    return SlopeAtMatchedDiversity(readings[0], readings[1], units, judged)


@dataclass(frozen=True)
class ClosedFormShare:
    """The rank as a share of the orthogonal closed form at (composition, distinct completions):
    per run the mean over its window's groups of rank / pred_distinct, per R the seed-level
    interval, and the slope of the share per doubling over the judged R."""

    per_r: tuple[tuple[int, bs.Interval], ...]  # (R, share), ascending R
    slope: bs.Interval | None  # None with fewer than two judged R


def closed_form_share(rows: pd.DataFrame, rules: Rules, rng: np.random.Generator,
                      groups_are_units: bool = False) -> ClosedFormShare | None:
    """`rows` as for `slope_readings`; None where no group has the closed form (per-token
    estimators, or results older than pred_distinct_<measure>). `groups_are_units` (one set of
    weights, one run per R): each R's groups are its units, the slope the regression's own."""
    rows = rows[rows["predicted_distinct"] > 0]
    if rows.empty:
        return None
    part = rows.assign(value=rows["value"] / rows["predicted_distinct"])
    if groups_are_units and part["seed"].nunique() == 1:
        per_size = {int(r): bs.mean_interval(g["value"], rules.confidence, rng, rules.resamples)
                    for r, g in part.groupby("group_size")}
        judged = judged_group_sizes(per_size, rules.target)
        at = part[part["group_size"].isin(judged)]
        estimate, se, df = within_slope(at["value"], np.log2(at["group_size"].astype(float)),
                                        np.zeros(len(at)))
        slope = (bs.t_interval(estimate, se, df, len(at), rules.confidence, rng, rules.resamples)
                 if len(judged) >= 2 else None)
        return ClosedFormShare(tuple(sorted(per_size.items())), slope)
    per_r = per_r_intervals(part, {}, False, rules, rng, lambda r: (0.0, math.inf))
    judged = judged_group_sizes(per_r, rules.target)
    slope = slope_interval(per_r, judged, rules, rng) if len(judged) >= 2 else None
    return ClosedFormShare(tuple((r, per_r[r].interval) for r in sorted(per_r)), slope)


def growth_source(raw: bs.Interval, matched: bs.Interval, rules: Rules) -> str:
    """Which of the two moves with R, one-sided at the intervals' level against claim 2b's
    tolerance: NO_GROWTH (the raw slope lies below +tolerance), DIVERSITY (the raw slope lies
    above it and the slope at matched diversity below it: the growth is the distinct
    completions'), GEOMETRY (both lie above it: the rank grows at equal distinct completions),
    UNDECIDED otherwise (an interval straddles it, or there is none)."""
    tol = rules.growth_tolerance
    if not (raw.finite and matched.finite):
        return UNDECIDED
    if raw.high < tol:
        return NO_GROWTH
    if raw.low > tol and matched.high < tol:
        return DIVERSITY
    if raw.low > tol and matched.low > tol:
        return GEOMETRY
    return UNDECIDED


@dataclass(frozen=True)
class PerDistinct:
    """Claim 4 at one R: per-token minus outcome rank per distinct completion (per group rank /
    distinct completions, per run its window mean), and each side's distinct completions."""

    difference: bs.Interval
    paired: bool  # True: the t-interval of per-seed differences (both sides ran the same seeds)
    distinct_outcome: float  # mean over runs of the window's mean distinct completions
    distinct_per_token: float


def _per_run(rows: pd.DataFrame, column: pd.Series) -> pd.Series:
    """seed -> the run's window mean of `column` (one run per seed and R)."""
    return column.groupby(rows["seed"]).mean()


def per_distinct_difference(outcome: pd.DataFrame, per_token: pd.DataFrame, rules: Rules,
                            rng: np.random.Generator) -> PerDistinct:
    """`outcome`, `per_token`: each side's `group_frame` rows at one R, one selection, in the
    window. Paired by seed where both sides ran the same >= 2 seeds, else Welch's interval."""
    a = _per_run(outcome, outcome["value"] / outcome["distinct"])
    b = _per_run(per_token, per_token["value"] / per_token["distinct"])
    paired = set(a.index) == set(b.index) and len(a) >= 2
    if paired:
        diff = bs.mean_interval((b - a.reindex(b.index)).to_numpy(float), rules.confidence, rng,
                                rules.resamples)
    else:
        diff = bs.welch_interval([b.to_numpy(float), a.to_numpy(float)], [1.0, -1.0],
                                 rules.confidence, rng, rules.resamples)
    return PerDistinct(diff, paired, float(_per_run(outcome, outcome["distinct"]).mean()),
                       float(_per_run(per_token, per_token["distinct"]).mean()))


def bar_reachable(mean_distinct: float, rules: Rules) -> bool:
    """Claim 4's absolute bar (a per-token rank >= target + margin) can be read where the groups'
    distinct completions leave room above it: a group's rank is at most its number of distinct
    completions, so the bar is judged only where their mean is at least the bar plus the margin
    ("well above" by the rule book's own margin; 3 at the defaults). Below that, an estimator
    that added every direction it could would still read at or under the bar."""
    return mean_distinct >= rules.target + 2 * rules.margin
