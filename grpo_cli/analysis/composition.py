"""Per-group `rollout_group` ranks against the closed-form group-composition prediction.

ranks.csv per-group rows (`group == "g<b>"`) carry `minority` (m) and `pred_<measure>`; where a
prediction is missing it is recomputed here from m and R (see `measures.composition_sigma`).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from grpo_cli.analysis.load import Run
from grpo_cli.analysis.measures import predicted_measure
from grpo_cli.analysis.summary import sort_rows
from grpo_cli.analysis.tables import run_meta

MATRIX = "rollout_group"


def composition_table(runs: list[Run], measures: list[str]) -> pd.DataFrame:
    """One row per (run, step, group, measure): minority, group_size, measured, predicted."""
    columns = [
        "run_id",
        "variant",
        "group_size",
        "step",
        "group",
        "minority",
        "minority_frac",
        "measure",
        "measured",
        "predicted",
    ]
    parts = []
    for run in runs:
        ranks = run.ranks
        if ranks.empty or "minority" not in ranks or "matrix" not in ranks:
            continue
        rows = ranks[(ranks["matrix"] == MATRIX) & ranks["group"].str.match(r"g\d")]
        rows = rows[pd.to_numeric(rows["minority"], errors="coerce") >= 1]
        if rows.empty:
            continue
        minority = rows["minority"].astype(int).to_numpy()
        size = run.group_size
        if size is None and "majority" in rows:
            size = int(minority[0] + rows["majority"].iloc[0])
        # runs written before the config rename kept it under analysis.rank_rtol
        rtol = float(run.config.get("probes.rank_rtol", run.config.get("analysis.rank_rtol", 1e-6)))
        for measure in measures:
            if measure not in rows:
                continue
            measured = pd.to_numeric(rows[measure], errors="coerce").to_numpy(float)
            pred_col = f"pred_{measure}"
            pred = (
                pd.to_numeric(rows[pred_col], errors="coerce").to_numpy(float, copy=True)
                if pred_col in rows
                else np.full(len(rows), np.nan)
            )
            missing = np.isnan(pred)
            pred[missing] = [predicted_measure(measure, m, size, rtol) for m in minority[missing]]
            meta = run_meta(run)
            parts.append(
                pd.DataFrame(
                    {
                        "run_id": meta["run_id"],
                        "variant": run.variant,
                        "group_size": size,
                        "step": rows["step"].to_numpy(),
                        "group": rows["group"].to_numpy(),
                        "minority": minority,
                        "minority_frac": minority / size,
                        "measure": measure,
                        "measured": measured,
                        "predicted": pred,
                    }
                )
            )
    if not parts:
        return pd.DataFrame(columns=columns)
    return pd.concat(parts, ignore_index=True).dropna(subset=["measured"])[columns]


def departure(table: pd.DataFrame) -> pd.DataFrame:
    """Mean |measured - predicted| per variant x R x measure, over every per-group row."""
    columns = [
        "variant",
        "measure",
        "group_size",
        "mean_abs_departure",
        "mean_measured",
        "mean_predicted",
        "n_groups",
    ]
    if table.empty:
        return pd.DataFrame(columns=columns)
    table = table.assign(abs_dev=(table["measured"] - table["predicted"]).abs())
    grouped = table.groupby(["variant", "measure", "group_size"])
    out = pd.DataFrame(
        {
            "mean_abs_departure": grouped["abs_dev"].mean(),
            "mean_measured": grouped["measured"].mean(),
            "mean_predicted": grouped["predicted"].mean(),
            "n_groups": grouped["abs_dev"].count(),
        }
    )
    return sort_rows(out.reset_index()[columns])


def prediction_curve(measure: str, group_size: int, rank_rtol: float = 1e-6) -> tuple[list, list]:
    """(m/R, predicted measure) for m = 1 .. R/2."""
    minorities = range(1, group_size // 2 + 1)
    return (
        [m / group_size for m in minorities],
        [predicted_measure(measure, m, group_size, rank_rtol) for m in minorities],
    )
