"""Beside claim 3 (the gradient grows sparser over training): how dense each step's update is and
how much of the gradient the output head and embedding hold, early and late in training.

Claim 3 reads the gradient's sparsity (`grad_sparsity`, `grad_hoyer`); an optimizer step can
still change nearly every weight (Adam's per-coordinate steps), and bf16 weights keep only the
changes above half their spacing. metrics.csv's step readings (docs/results.md "Readings of every
step's update"): `step_changed_frac` (entries one step changed, verl's changed_ratio, slime's
update density), `step_changed_frac_bf16` (in a bf16 copy) and `grad_share_head_embedding`
(DGG's lm_head share of ||g||^2). Descriptive only, never in the verdict: per variant and R,
each run's mean over the first and the second half of its steps, then the mean over its runs
(seeds), and the change late - early.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from grpo_cli.analysis.load import Run
from grpo_cli.analysis.tables import metric_table

SPARSITY = "grad_sparsity"
STEP_READINGS = ("step_changed_frac", "step_changed_frac_bf16", "grad_share_head_embedding")
LABELS = {
    SPARSITY: "gradient sparsity",
    "step_changed_frac": "weights changed per step",
    "step_changed_frac_bf16": "... in bf16",
    "grad_share_head_embedding": "head + embedding share of ||g||^2",
}
COLUMNS = ("variant", "group_size", "measure", "runs", "early", "late", "change")


def density_table(runs: list[Run]) -> pd.DataFrame:
    """COLUMNS, one row per variant, R and measure (sparsity first, for comparison); empty when no
    run recorded a step reading (results written before them)."""
    long = metric_table(runs, [SPARSITY, *STEP_READINGS])
    if long.empty or not long["metric"].isin(STEP_READINGS).any():
        return pd.DataFrame(columns=list(COLUMNS))
    middle = long.groupby("run_id")["step"].transform(lambda steps: (steps.min() + steps.max()) / 2)
    long = long.assign(half=np.where(long["step"] <= middle, "early", "late"))
    per_run = (long.groupby(["variant", "group_size", "metric", "run_id", "half"])["value"].mean()
               .unstack("half"))
    per_run = per_run.reindex(columns=["early", "late"])
    table = per_run.groupby(["variant", "group_size", "metric"]).agg(
        runs=("early", "size"), early=("early", "mean"), late=("late", "mean")).reset_index()
    order = {name: k for k, name in enumerate((SPARSITY, *STEP_READINGS))}
    table = table.assign(change=table["late"] - table["early"], order=table["metric"].map(order))
    table = table.sort_values(["variant", "group_size", "order"]).rename(columns={"metric": "measure"})
    return table[list(COLUMNS)].reset_index(drop=True)
