"""Summary tables: per-run last-part means, per-R means over seeds, held-out accuracy.

Per run, a rank measure is summarised by its mean over the last `last_fraction` of that run's
probe steps (steps >= (1 - last_fraction) * last probe step). Those per-run values are then
averaged over seeds per R (and per variant); analysis/rank_verdict.py judges them.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from grpo_cli.analysis.tables import (
    LAYER_MEAN,
    META,
    accuracy_curve,
    ordered_matrices,
    reward_curve,
)
from grpo_cli.measures import RANK_MEASURES

SUMMARY_KEYS = ["variant", "matrix", "layer", "stat", "measure"]


def verdict_rows(table: pd.DataFrame) -> pd.DataFrame:
    """The rows a verdict is made on: per-group `mean`, whole matrices, and the layer mean."""
    return table[table["layer"].isin(["", LAYER_MEAN]) & table["stat"].isin(["mean", "all"])]


def last_part(table: pd.DataFrame, last_fraction: float) -> pd.DataFrame:
    """The rows of each run's last `last_fraction` of probe steps (step >= (1 - f) * last)."""
    if table.empty:
        return table
    last = table.groupby("run_id")["step"].transform("max")
    return table[table["step"] >= (1 - last_fraction) * last]


def last_part_means(ranks: pd.DataFrame, last_fraction: float) -> pd.DataFrame:
    """Per run x matrix x layer x stat x measure: mean value over the run's last probe steps."""
    if ranks.empty:
        return pd.DataFrame(columns=[*META, *SUMMARY_KEYS, "value"])
    return last_part(ranks, last_fraction).groupby([*META, *SUMMARY_KEYS], as_index=False)["value"].mean()


def rank_summary(per_run: pd.DataFrame) -> pd.DataFrame:
    """Mean, spread and number of seeds per variant x matrix x layer x stat x measure x R."""
    columns = [*SUMMARY_KEYS, "group_size", "mean", "std", "min", "max", "n_seeds", "n_incomplete"]
    if per_run.empty:
        return pd.DataFrame(columns=columns)
    grouped = per_run.groupby([*SUMMARY_KEYS, "group_size"])
    out = grouped["value"].agg(["mean", "std", "min", "max"])
    out["n_seeds"] = grouped["value"].count()
    out["n_incomplete"] = grouped["status"].apply(lambda s: int((s == "incomplete").sum()))
    return sort_rows(out.reset_index())[columns]


def sort_rows(table: pd.DataFrame) -> pd.DataFrame:
    """Matrices in data-flow order, measures in RANK_MEASURES order, then layer, stat, R."""
    matrices = ordered_matrices(table["matrix"].unique()) if "matrix" in table else []
    orders = {
        "matrix": {m: i for i, m in enumerate(matrices)},
        "measure": {m: i for i, m in enumerate(RANK_MEASURES)},
    }
    by = [c for c in ["variant", "matrix", "measure", "layer", "stat", "group_size"] if c in table]
    return table.sort_values(
        by, key=lambda col: col.map(orders[col.name]).fillna(99) if col.name in orders else col
    ).reset_index(drop=True)


def accuracy_summary(runs) -> pd.DataFrame:
    """Per variant x R: held-out accuracy at the first and last eval, and final training reward."""
    rows = []
    for run in runs:
        acc, reward = accuracy_curve(run), reward_curve(run)
        rows.append(
            {
                "variant": run.variant,
                "group_size": run.group_size or -1,
                "status": run.status,
                "start": acc["accuracy"].iloc[0] if len(acc) else np.nan,
                "final": acc["accuracy"].iloc[-1] if len(acc) else np.nan,
                "final_step": acc["step"].iloc[-1] if len(acc) else np.nan,
                "reward": reward["reward"].iloc[-1] if len(reward) else np.nan,
            }
        )
    columns = [
        "variant",
        "group_size",
        "start_mean",
        "final_mean",
        "final_std",
        "n_seeds",
        "final_reward_mean",
        "n_incomplete",
    ]
    if not rows:
        return pd.DataFrame(columns=columns)
    table = pd.DataFrame(rows)
    grouped = table.groupby(["variant", "group_size"])
    out = pd.DataFrame(
        {
            "start_mean": grouped["start"].mean(),
            "final_mean": grouped["final"].mean(),
            "final_std": grouped["final"].std(),
            "n_seeds": grouped["final"].count(),
            "final_reward_mean": grouped["reward"].mean(),
            "n_incomplete": grouped["status"].apply(lambda s: int((s == "incomplete").sum())),
        }
    )
    return out.reset_index()[columns]
