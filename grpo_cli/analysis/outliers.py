"""An outlying seed (issue 61): a run whose sampling collapses apart from the other seeds'.

Per variant and R, each seed's window mean (the verdict's window: the run's last `last_fraction`
of steps) of metrics.csv `distinct_completions` and `entropy`. A seed is outlying where its
modified z-score 0.6745 (x - median) / MAD (Iglewicz & Hoaglin 1993; the MAD is the median
absolute deviation over the seeds, so one collapsed seed cannot hide itself by inflating the
spread it is judged by) is <= -Rules.outlier_z (a collapse: fewer distinct completions, lower
entropy), and x lies at least Rules.distinct_fall (relative) below the median, so that seeds
all but equal (a MAD near 0) flag nothing. It needs >= 3 seeds: with 2, both sit 0.6745 from
their midpoint.

A collapsed run measures the policy's entropy, not GRPO's geometry, yet it is one of the seeds
claim 2's intervals are read from. The verdict keeps every seed (with a collapsing seed below
the others its t-interval widens, and at the band's edge it reads a false contradiction in at
most its level: tests/test_calibration.py), and the claim says that its intervals rest on the
named seed and what the other seeds read without it.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from grpo_cli.analysis.load import Run
from grpo_cli.analysis.parts import Part
from grpo_cli.analysis.rank_verdict import rank_verdicts
from grpo_cli.analysis.rules import CONTRAST, Rules
from grpo_cli.analysis.summary import last_part
from grpo_cli.analysis.tables import metric_table
from grpo_cli.analysis.words_over_r import Outlier, OutlyingSeeds, Without

COLLAPSE_MEASURES = ("distinct_completions", "entropy")
MAD_TO_SD = 0.6745  # the normal's MAD is 0.6745 sd: the modified z-score's scale


def modified_z(values) -> np.ndarray:
    """0.6745 (x - median) / MAD per value; -inf / +inf / 0 where the MAD is 0 (x below, above,
    at the median)."""
    values = np.asarray(values, float)
    centre = np.median(values)
    mad = np.median(np.abs(values - centre))
    if mad == 0:
        return np.where(values < centre, -math.inf, np.where(values > centre, math.inf, 0.0))
    return MAD_TO_SD * (values - centre) / mad


def collapsed(values, rules: Rules) -> np.ndarray:
    """Which of the seeds' window means `values` are outlying below the others (the rule
    above); none with fewer than 3 finite values."""
    values = np.asarray(values, float)
    out = np.zeros(values.shape, bool)
    keep = np.isfinite(values)
    if keep.sum() < 3:
        return out
    z = modified_z(values[keep])
    centre = np.median(values[keep])
    fell = values[keep] <= (1 - rules.distinct_fall) * centre
    out[keep] = (z <= -rules.outlier_z) & fell
    return out


def outlying_seeds(runs: list[Run], rules: Rules) -> list[Outlier]:
    """Every outlying run of `runs`, per variant x R x measure (COLLAPSE_MEASURES)."""
    table = last_part(metric_table(runs, list(COLLAPSE_MEASURES)), rules.last_fraction)
    if table.empty:
        return []
    means = table.groupby(["variant", "group_size", "metric", "seed", "run_id"], as_index=False)[
        "value"].mean()
    found = []
    for (variant, size, measure), rows in means.groupby(["variant", "group_size", "metric"]):
        values = rows["value"].to_numpy(float)
        flagged, z = collapsed(values, rules), modified_z(values)
        found += [Outlier(variant, int(seed), int(size), measure, float(value),
                          float(np.median(values)), float(score), len(values))
                  for seed, value, score, hit in zip(rows["seed"], values, z, flagged, strict=True)
                  if hit]
    return sorted(found, key=lambda o: (o.variant, o.seed, o.group_size, o.measure))


def _without(ranks: pd.DataFrame, groups: pd.DataFrame, found: list[Outlier], rules: Rules,
             same_weights: frozenset[str]) -> pd.DataFrame:
    """Claim 2's verdict rows (its matrix and measure) of the variants with an outlying seed,
    read without that seed's runs (rank_verdict.rank_verdicts)."""
    drop = {(o.variant, o.seed) for o in found}
    pick = ((ranks["matrix"] == rules.rank_matrix) & (ranks["measure"] == rules.rank_measure)
            & ranks["variant"].isin({v for v, _ in drop}))
    keep = ~pd.Series(list(zip(ranks["variant"], ranks["seed"], strict=True)),
                      index=ranks.index).isin(drop)
    kept = ranks[pick & keep]
    kept_groups = groups[groups["run_id"].isin(set(kept["run_id"]))] if len(groups) else groups
    return rank_verdicts(kept, kept_groups, rules, same_weights)[0]


def claim2_part(runs: list[Run], ranks: pd.DataFrame, groups: pd.DataFrame, rules: Rules,
                variants: list[str], same_weights: frozenset[str] = frozenset()) -> Part | None:
    """Claim 2's part on the outlying seeds of its `variants` (None: none): which seed, on
    what, and claim 2's reading of the other seeds (its words: words_over_r.OutlyingSeeds)."""
    found = [o for o in outlying_seeds(runs, rules) if o.variant in variants]
    if not found or ranks.empty:
        return None
    without = tuple(
        Without(row.variant, tuple(sorted({o.seed for o in found if o.variant == row.variant})),
                row.verdict, tuple(sorted(row.intervals.items())), float(row.slope),
                float(row.slope_low), float(row.slope_high))
        for row in _without(ranks, groups, found, rules, same_weights).itertuples(index=False))
    facts = OutlyingSeeds(tuple(found), rules.outlier_z, rules.distinct_fall, without)
    return Part("2o", "does the reading rest on an outlying seed?", CONTRAST, facts)
