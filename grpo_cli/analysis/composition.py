"""Per-group `rollout_group` ranks against the closed-form group-composition prediction.

ranks.csv per-group rows (`group == "g<b>"`) carry `minority` (m), `distinct` (distinct
completions), `pred_<measure>` (R orthonormal rows weighted by the composition) and
`pred_distinct_<measure>` (the same over distinct completions, with their multiplicities). The
probe leaves both empty where the closed form's assumptions fail (grpo_cli/probes/composition.py);
only results written before the columns existed get `pred_<measure>` recomputed here from m and R
(closed forms in grpo_cli/measures.py), and only for grpo, dr_grpo and rloo.

The gap between prediction and measurement splits in two: predicted - predicted over distinct
completions is what duplicate completions (entropy collapse) take away; predicted over distinct -
measured is what the distinct completions' non-orthogonal score vectors take away.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from grpo_cli.analysis.load import Run
from grpo_cli.analysis.summary import sort_rows
from grpo_cli.analysis.tables import run_meta
from grpo_cli.measures import predicted_rank_measures

MATRIX = "rollout_group"


def _column(rows: pd.DataFrame, name: str) -> np.ndarray:
    """A numeric column as floats, NaN where empty or absent."""
    if name not in rows:
        return np.full(len(rows), np.nan)
    return pd.to_numeric(rows[name], errors="coerce").to_numpy(float, copy=True)


COLUMNS = ["run_id", "variant", "group_size", "step", "group", "minority", "minority_frac",
           "measure", "measured", "predicted", "predicted_distinct", "distinct"]


def composition_table(runs: list[Run], measures: list[str]) -> pd.DataFrame:
    """One row per (run, step, group, measure): minority, group_size, measured, predicted."""
    parts = [part for run in runs for part in _run_rows(run, measures)]
    if not parts:
        return pd.DataFrame(columns=COLUMNS)
    return pd.concat(parts, ignore_index=True).dropna(subset=["measured"])[COLUMNS]


def _run_rows(run: Run, measures: list[str]) -> list[pd.DataFrame]:
    """One run's informative per-group rows of MATRIX, one frame per measure."""
    ranks = run.ranks
    if ranks.empty or "minority" not in ranks or "matrix" not in ranks:
        return []
    rows = ranks[(ranks["matrix"] == MATRIX) & ranks["group"].str.match(r"g\d")]
    rows = rows[pd.to_numeric(rows["minority"], errors="coerce") >= 1]
    if rows.empty:
        return []
    minority = rows["minority"].astype(int).to_numpy()
    size = run.group_size
    if size is None and "majority" in rows:
        size = int(minority[0] + rows["majority"].iloc[0])
    # runs written before the config rename kept it under analysis.rank_rtol
    rtol = float(run.config.get("probes.rank_rtol", run.config.get("analysis.rank_rtol", 1e-6)))
    zero_sum = run.estimator_facts["zero_sum_group"]
    out = []
    for measure in measures:
        if measure not in rows:
            continue
        pred = _column(rows, f"pred_{measure}")
        if f"pred_{measure}" not in rows and zero_sum:  # results older than the column
            pred = np.array([predicted_rank_measures(m, size - m, rtol)[measure] for m in minority])
        out.append(pd.DataFrame({
            "run_id": run_meta(run)["run_id"], "variant": run.variant, "group_size": size,
            "step": rows["step"].to_numpy(), "group": rows["group"].to_numpy(),
            "minority": minority, "minority_frac": minority / size, "measure": measure,
            "measured": _column(rows, measure), "predicted": pred,
            "predicted_distinct": _column(rows, f"pred_distinct_{measure}"),
            "distinct": _column(rows, "distinct"),
        }))
    return out


def departure(table: pd.DataFrame) -> pd.DataFrame:
    """Per variant x R x measure, over per-group rows that have a prediction: mean |measured -
    predicted|, the means, and the gap split into duplicates and the rest (module docstring)."""
    columns = [
        "variant",
        "measure",
        "group_size",
        "mean_abs_departure",
        "mean_measured",
        "mean_predicted",
        "mean_predicted_distinct",
        "gap_duplicates",
        "gap_rest",
        "mean_distinct",
        "n_groups",
    ]
    table = table.dropna(subset=["predicted"]) if not table.empty else table
    if table.empty:
        return pd.DataFrame(columns=columns)
    table = table.assign(abs_dev=(table["measured"] - table["predicted"]).abs())
    grouped = table.groupby(["variant", "measure", "group_size"])
    out = pd.DataFrame(
        {
            "mean_abs_departure": grouped["abs_dev"].mean(),
            "mean_measured": grouped["measured"].mean(),
            "mean_predicted": grouped["predicted"].mean(),
            "mean_predicted_distinct": grouped["predicted_distinct"].mean(),
            "mean_distinct": grouped["distinct"].mean(),
            "n_groups": grouped["abs_dev"].count(),
        }
    )
    out["gap_duplicates"] = out["mean_predicted"] - out["mean_predicted_distinct"]
    out["gap_rest"] = out["mean_predicted_distinct"] - out["mean_measured"]
    return sort_rows(out.reset_index()[columns])


def prediction_curve(measure: str, group_size: int, rank_rtol: float = 1e-6) -> tuple[list, list]:
    """(m/R, predicted measure) for m = 1 .. R/2."""
    minorities = range(1, group_size // 2 + 1)
    return (
        [m / group_size for m in minorities],
        [predicted_rank_measures(m, group_size - m, rank_rtol)[measure] for m in minorities],
    )
