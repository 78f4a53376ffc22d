"""Claim 2's reading over R, computed once: given one rank per group size R, the R values it is
judged on (the uncapped ones, rules.judged_group_sizes), the least-squares slope of the rank
against log2(R) per doubling of R, and the largest deviation from the target over them.

Every table that reads "does the rank stay at 2 as R grows?" on point estimates calls
`reading_over_r`: claim 2's verdict rows (rank_verdict.py, whose intervals come from the same
point values), the stages (collapse.py), matched progress (rank_verdict.point_reading,
matching.py), the same checkpoint (same_checkpoint.py) and claim 4's outcome slope
(credit_compare.py)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from grpo_cli.analysis.bootstrap import slope_per_doubling
from grpo_cli.analysis.rules import judged_group_sizes


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
