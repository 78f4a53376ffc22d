"""The `layer` gradient beside claim 2's `rollout_group`: which matrix the paper most likely measured.

"An SVD of GRPO gradients" on a 4B model most plausibly means weight-shaped per-layer gradients
(`layer`: each probed weight's batch gradient, d_out x d_in): that is the matrix a gradient SVD
of a model that size is taken of (a per-rollout R x P matrix over ~4e9 parameters needs R
per-rollout gradients of the whole model, which no training loop forms), and the one the
low-rank-gradient literature reads. Claim 2's verdict reads `rollout_group`, the R x P matrix of
the paper's zero-sum argument; this module reads claim 2's rule (2b, 2c) on `layer`, per weight
and pooled (the mean over layers, the verdict table's row), for stable rank and entropy rank,
with the same code and intervals (over_r.per_r_intervals, slope_parts, level_part).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import pandas as pd

from grpo_cli.analysis import bootstrap as bs
from grpo_cli.analysis.over_r import per_r_intervals
from grpo_cli.analysis.rank_verdict import level_part, rank_bounds, rng_for, slope_parts
from grpo_cli.analysis.rules import Rules, capped_group_sizes, judged_group_sizes
from grpo_cli.analysis.summary import last_part
from grpo_cli.analysis.tables import LAYER_MEAN

MATRIX = "layer"
MEASURES = ("stable_rank", "erank_entropy")  # the layer's stable rank reads ~2; entropy rank beside


@dataclass(frozen=True)
class LayerReading:
    """Claim 2's rule on one weight's gradient (or the mean over layers) for one measure."""

    variant: str
    layer: str  # a parameter name, or tables.LAYER_MEAN (pooled)
    measure: str
    per_r: tuple[tuple[int, bs.Interval], ...]  # (R, seed-level interval), ascending R
    slope: bs.Interval | None  # per doubling over the judged R (None with fewer than two)
    growth: str  # 2b's verdict on this matrix
    level: str  # 2c's verdict on this matrix

    @property
    def pooled(self) -> bool:
        return self.layer == LAYER_MEAN


def layer_readings(ranks: pd.DataFrame, variants: list[str], rules: Rules) -> list[LayerReading]:
    """Per variant in `variants` x layer x measure of MEASURES (pooled first, then each weight):
    the reading in claim 2's window. `ranks`: tables.rank_table. The pooled reading draws from
    the same generator as the verdict table's row, so its numbers are that row's."""
    if ranks.empty:
        return []
    picked = ranks[(ranks["matrix"] == MATRIX) & ranks["measure"].isin(MEASURES)
                   & ranks["variant"].isin(variants)]
    window = last_part(ranks[ranks["run_id"].isin(set(picked["run_id"]))], rules.last_fraction)
    window = window[window.index.isin(picked.index)]
    out = []
    for (variant, layer, measure), part in window.groupby(["variant", "layer", "measure"]):
        rng = rng_for(rules, variant, MATRIX, layer, "all", measure)
        per_r = per_r_intervals(part, {}, False, rules, rng, lambda r: rank_bounds(MATRIX, "all", r))
        sizes = sorted(per_r)
        judged = judged_group_sizes(sizes, rules.target)
        (_, growth), slope = slope_parts(per_r, judged, capped_group_sizes(sizes, rules.target),
                                         rules, rng)
        level = level_part(per_r, judged, rules, lambda r: rank_bounds(MATRIX, "all", r))
        out.append(LayerReading(variant, layer, measure,
                                tuple((r, per_r[r].interval) for r in sizes), slope,
                                growth.verdict, level.verdict))
    return sorted(out, key=lambda x: (x.variant, MEASURES.index(x.measure), not x.pooled, x.layer))


def spread(readings: list[LayerReading], measure: str, size: int) -> tuple[float, float]:
    """(lowest, highest) per-weight estimate of `measure` at R=`size` (NaN with no weight)."""
    values = [iv.estimate for x in readings if not x.pooled and x.measure == measure
              for r, iv in x.per_r if r == size]
    return (min(values), max(values)) if values else (math.nan, math.nan)
