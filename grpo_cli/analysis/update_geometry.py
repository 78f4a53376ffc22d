"""Two readings beside the claims, not in their verdicts (docs/results.md defines the columns):

- the energy in the top-k singular directions, E_k (ranks.csv `top<k>_energy_share`, SALT arXiv
  2606.05800), per matrix and R over each run's last probe steps, beside claim 2's rank against R:
  with R orthogonal rows of equal norm E_k = k / R, with one shared direction E_1 = 1;
- the update's trajectory over kept checkpoints (trajectory.csv, `grpo trajectory`; AlphaRL arXiv
  2510.00553, RELEX arXiv 2605.21468) at each run's last kept step, beside the `update` spectra:
  the weights' median rank-1 share, and the path's rank-1 share and linearity.

Means over seeds; no interval and no rule: these answer "how much lies outside the dominant
directions", which no claim asks.
"""

from __future__ import annotations

import pandas as pd

from grpo_cli.analysis.load import Run, read_trajectory
from grpo_cli.analysis.summary import last_part_means, rank_summary, verdict_rows
from grpo_cli.analysis.tables import rank_table, run_meta
from grpo_cli.measures import TOP_ENERGY_COLUMNS

ENERGY_MATRICES = ("rollout_group", "rollout_batch", "group_batch", "layer", "update")
ALL_LAYERS = "all"  # trajectory.csv's row of every selected weight together


def top_energy_table(runs: list[Run], last_fraction: float) -> pd.DataFrame:
    """variant x matrix x R: mean over seeds of E_1..E_3 and the residual 1 - E_3 over the
    runs' last probe steps (per-group matrices: the groups' mean; layers: the layer mean)."""
    present = [column for column in TOP_ENERGY_COLUMNS if any(column in run.ranks for run in runs)]
    table = rank_table(runs, present) if present else pd.DataFrame()
    if table.empty:
        return pd.DataFrame()
    summary = verdict_rows(rank_summary(last_part_means(table, last_fraction)))
    summary = summary[summary["matrix"].isin(ENERGY_MATRICES)]
    if summary.empty:
        return pd.DataFrame()
    wide = summary.pivot_table(index=["variant", "matrix", "group_size"], columns="measure",
                               values="mean").reset_index()
    seeds = summary.groupby(["variant", "matrix", "group_size"])["n_seeds"].max().reset_index()
    wide = wide.merge(seeds, on=["variant", "matrix", "group_size"])
    if "top3_energy_share" in wide:
        wide["residual_3"] = 1.0 - wide["top3_energy_share"]
    order = {matrix: k for k, matrix in enumerate(ENERGY_MATRICES)}
    wide = wide.sort_values(["variant", "matrix", "group_size"], key=lambda c: c.map(order) if c.name == "matrix" else c)
    names = {f"top{k}_energy_share": f"E_{k}" for k in (1, 2, 3)}
    return wide.rename(columns={**names, "residual_3": "1 - E_3"}).reset_index(drop=True)


def trajectory_table(runs: list[Run]) -> pd.DataFrame:
    """variant x R: at each run's last kept step, the weights' median rank1_share, path_rank1_share
    and path_linearity, and those of the path of every weight together (`all`); mean over seeds."""
    rows = []
    for run in runs:
        table = read_trajectory(run)
        if table.empty:
            continue
        last = table[table["step"] == table["step"].max()]
        weights, together = last[last["layer"] != ALL_LAYERS], last[last["layer"] == ALL_LAYERS]
        rows.append({**run_meta(run), "step": int(last["step"].iloc[0]), "weights": len(weights),
                     "rank1_share": weights["rank1_share"].median(),
                     "path_rank1_share": weights["path_rank1_share"].median(),
                     "path_linearity": weights["path_linearity"].median(),
                     "all_path_rank1_share": together["path_rank1_share"].mean(),
                     "all_path_linearity": together["path_linearity"].mean()})
    if not rows:
        return pd.DataFrame()
    frame = pd.DataFrame(rows)
    values = ["rank1_share", "path_rank1_share", "path_linearity", "all_path_rank1_share", "all_path_linearity"]
    grouped = frame.groupby(["variant", "group_size"])
    out = grouped[values].mean()
    out["last_step"] = grouped["step"].max()
    out["weights"] = grouped["weights"].max()
    out["n_seeds"] = grouped["seed"].nunique()
    return out.reset_index()
