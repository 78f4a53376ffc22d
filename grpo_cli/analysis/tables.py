"""Long ("tidy") tables built from runs, shared by the summary and the figures.

Which ranks.csv row stands for a matrix at a step:
- `rollout_group`, `score_group`: the `group == "mean"` aggregate over informative groups (and
  `"median"`, kept as a second statistic); if a file has only per-group rows, they are averaged.
- `layer`, `update`: every layer's whole-matrix row, plus a derived `layer == "mean over layers"`
  row (mean across layers at that step), which is what verdicts use.
- everything else: the whole-matrix row (`group == "all"`).
A row whose every measure is 0 is a zero matrix (no gradient signal, e.g. every group had equal
rewards, or the update at step 0); it has no rank and is left out (counted in
`table.attrs["zero_rows"]`), and NaN measures (no informative group) are dropped too.

Progress alignment replaces the step by the training reward (rolling mean of `reward_mean`) or
the held-out accuracy (eval.csv, linearly interpolated between eval steps) at that step, binned
into equal-width bins shared by all runs so that runs are compared at matched progress.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from grpo_cli.analysis.load import Run
from grpo_cli.measures import RANK_MEASURES

PER_GROUP_MATRICES = ("rollout_group", "score_group")
LAYER_MATRICES = ("layer", "update", "grad_sum")
MATRIX_ORDER = ("rollout_group", "rollout_batch", "score_group", "group_batch", "layer", "update",
                "grad_sum")
LAYER_MEAN = "mean over layers"
REWARD_WINDOW = 5  # steps in the rolling mean of the training reward used as progress
ALIGNS = ("step", "reward", "accuracy")
X_LABELS = {
    "step": "step",
    "reward": "training reward (binned)",
    "accuracy": "held-out accuracy (fraction, binned)",
}
X_NOTES = {  # said once in the figure title, too long for every axis
    "step": "",
    "reward": f"x: training reward = rolling mean of reward_mean over {REWARD_WINDOW} steps",
    "accuracy": "x: held-out accuracy (eval.csv) interpolated between eval steps",
}
META = ["run_id", "run", "group_size", "variant", "seed", "status"]
# gradients.png: per-rollout norms carry the loss's 1/N (every `algorithm.loss_agg`), so they are
# drawn times N; the noise scales, a ratio with single spikes 1000x the rest, as a running median
SCALED_BY_ROLLOUTS = ("grad_norm_rollout_median",)
RUNNING_MEDIAN = ("grad_noise_scale", "grad_noise_scale_groups")
NOISE_WINDOW = 5  # probe steps in the running median (centred)


def run_meta(run: Run) -> dict:
    return {
        "run_id": str(run.path),
        "run": run.name,
        "group_size": run.group_size if run.group_size is not None else -1,
        "variant": run.variant,
        "seed": run.seed if run.seed is not None else -1,
        "status": run.status,
    }


def ordered_matrices(names) -> list[str]:
    names = set(names)
    return [m for m in MATRIX_ORDER if m in names] + sorted(names - set(MATRIX_ORDER))


def measures_present(runs: list[Run], measure: str = "all") -> list[str]:
    """Rank-measure columns present in any ranks.csv; `measure` picks one of them."""
    present = [m for m in RANK_MEASURES if any(m in run.ranks.columns for run in runs)]
    if measure == "all":
        return present
    if measure not in RANK_MEASURES:
        raise ValueError(
            f"unknown measure {measure!r}; choose 'all' or one of {', '.join(RANK_MEASURES)}"
        )
    return [measure]


def _matrix_rows(ranks: pd.DataFrame, matrix: str, measures: list[str]) -> pd.DataFrame:
    rows = ranks[ranks["matrix"] == matrix]
    if matrix in PER_GROUP_MATRICES:
        # a callable, not rows["group"]: assigning a Series to an empty frame gives it the
        # Series' index, rows of NaN, and the per-group fallback below never ran
        picked = rows[rows["group"].isin(["mean", "median"])].assign(stat=lambda f: f["group"])
        per_group = rows[rows["group"].str.startswith("g")]
        if picked.empty and not per_group.empty:
            by_step = per_group.groupby("step")[measures]
            picked = pd.concat(
                [
                    by_step.mean().reset_index().assign(stat="mean"),
                    by_step.median().reset_index().assign(stat="median"),
                ]
            )
        return picked.assign(layer="")
    picked = rows[rows["group"].isin(["all", ""])].assign(stat="all")
    if matrix in LAYER_MATRICES and not picked.empty:
        mean = picked.groupby("step")[measures].mean().reset_index()
        picked = pd.concat([picked, mean.assign(stat="all", layer=LAYER_MEAN)])
    return picked


def rank_table(runs: list[Run], measures: list[str]) -> pd.DataFrame:
    """Long table: META + step, matrix, layer, stat, measure, value."""
    columns = [*META, "step", "matrix", "layer", "stat", "measure", "value"]
    parts, zero_rows = [], 0
    for run in runs:
        ranks = run.ranks
        have = [m for m in measures if m in ranks.columns]
        if ranks.empty or not have or "matrix" not in ranks:
            continue
        ranks = ranks.assign(**{m: pd.to_numeric(ranks[m], errors="coerce") for m in have})
        zero = (ranks[have] == 0).all(axis=1)
        zero_rows += int(zero.sum())
        ranks = ranks[~zero]
        for matrix in ordered_matrices(ranks["matrix"].unique()):
            rows = _matrix_rows(ranks, matrix, have)
            if rows.empty:
                continue
            rows = rows.assign(matrix=matrix)[["step", "matrix", "layer", "stat", *have]]
            long = rows.melt(id_vars=["step", "matrix", "layer", "stat"], var_name="measure")
            parts.append(long.assign(**run_meta(run)))
    table = (
        pd.concat(parts, ignore_index=True).dropna(subset=["value"])[columns]
        if parts
        else pd.DataFrame(columns=columns)
    )
    table.attrs["zero_rows"] = zero_rows
    return table


def group_table(runs: list[Run], measures: list[str]) -> pd.DataFrame:
    """Per-group rows (group g<b>) of the per-group matrices: META + step, matrix, group,
    measure, value. A `grpo probe` run's interval takes its groups as the units (analysis/rank_verdict.py)."""
    columns = [*META, "step", "matrix", "group", "measure", "value"]
    parts = []
    for run in runs:
        ranks = run.ranks
        have = [m for m in measures if m in ranks.columns]
        if ranks.empty or not have or "matrix" not in ranks or "group" not in ranks:
            continue
        rows = ranks[ranks["matrix"].isin(PER_GROUP_MATRICES) & ranks["group"].str.startswith("g")]
        if rows.empty:
            continue
        rows = rows.assign(**{m: pd.to_numeric(rows[m], errors="coerce") for m in have})
        long = rows[["step", "matrix", "group", *have]].melt(
            id_vars=["step", "matrix", "group"], var_name="measure"
        )
        parts.append(long.dropna(subset=["value"]).assign(**run_meta(run)))
    if not parts:
        return pd.DataFrame(columns=columns)
    return pd.concat(parts, ignore_index=True)[columns]


def metric_table(runs: list[Run], columns: list[str]) -> pd.DataFrame:
    """Long table of metrics.csv columns (NaN rows dropped): META + step, metric, value."""
    parts = []
    for run in runs:
        have = [c for c in columns if c in run.metrics.columns]
        if not have:
            continue
        long = run.metrics[["step", *have]].melt(id_vars="step", var_name="metric")
        long["value"] = pd.to_numeric(long["value"], errors="coerce")
        parts.append(long.dropna(subset=["value"]).assign(**run_meta(run)))
    if not parts:
        return pd.DataFrame(columns=[*META, "step", "metric", "value"])
    return pd.concat(parts, ignore_index=True)


def rollouts_per_step(run: Run) -> float:
    """N = R x prompts per step, from config.yaml (NaN when either is missing)."""
    prompts = run.config.get("rollout.prompts_per_step")
    if run.group_size is None or prompts is None:
        return float("nan")
    return float(run.group_size * int(prompts))


def gradient_table(runs: list[Run], columns: list[str]) -> pd.DataFrame:
    """metric_table of `columns`, plus the rows gradients.png draws instead of some of them:
    `<column>_times_n` (N x value, N = rollouts_per_step) for SCALED_BY_ROLLOUTS, and
    `<column>_running_median` (each run's median over NOISE_WINDOW consecutive probe steps,
    centred) for RUNNING_MEDIAN."""
    table = metric_table(runs, columns)
    if table.empty:
        return table
    rollouts = table["run_id"].map({str(run.path): rollouts_per_step(run) for run in runs})
    scaled = table[table["metric"].isin(SCALED_BY_ROLLOUTS)]
    scaled = scaled.assign(metric=scaled["metric"] + "_times_n",
                           value=scaled["value"] * rollouts[scaled.index]).dropna(subset=["value"])
    heavy = table[table["metric"].isin(RUNNING_MEDIAN)].sort_values(["run_id", "metric", "step"])
    medians = heavy.groupby(["run_id", "metric"])["value"].transform(
        lambda values: values.rolling(NOISE_WINDOW, center=True, min_periods=1).median())
    heavy = heavy.assign(metric=heavy["metric"] + "_running_median", value=medians)
    return pd.concat([table, scaled, heavy], ignore_index=True)


def event_table(runs: list[Run]) -> pd.DataFrame:
    """Training-health alarms of every run: META + step, alarm, value, message."""
    parts = [run.events.assign(**run_meta(run)) for run in runs if not run.events.empty]
    if not parts:
        return pd.DataFrame(columns=[*META, "step", "alarm", "value", "message"])
    return pd.concat(parts, ignore_index=True)


def reward_curve(run: Run) -> pd.DataFrame:
    """step, reward: the rolling mean of metrics.csv reward_mean."""
    if "reward_mean" not in run.metrics:
        return pd.DataFrame(columns=["step", "reward"])
    table = run.metrics[["step", "reward_mean"]].copy()
    table["reward_mean"] = pd.to_numeric(table["reward_mean"], errors="coerce")
    table = table.dropna().sort_values("step")
    table["reward"] = table["reward_mean"].rolling(REWARD_WINDOW, min_periods=1).mean()
    return table[["step", "reward"]]


def accuracy_curve(run: Run) -> pd.DataFrame:
    """step, accuracy from eval.csv (numeric rows only)."""
    if "accuracy" not in run.evals:
        return pd.DataFrame(columns=["step", "accuracy"])
    table = run.evals[["step", "accuracy"]].copy()
    table["accuracy"] = pd.to_numeric(table["accuracy"], errors="coerce")
    return table.dropna().sort_values("step")


def progress_at(run: Run, steps: np.ndarray, align: str) -> np.ndarray:
    """Progress of `run` at `steps`: the step itself, training reward or held-out accuracy."""
    steps = np.asarray(steps, dtype=float)
    if align == "step":
        return steps
    curve = reward_curve(run) if align == "reward" else accuracy_curve(run)
    if curve.empty:
        return np.full(steps.shape, np.nan)
    return np.interp(steps, curve["step"].to_numpy(float), curve.iloc[:, 1].to_numpy(float))


def progress_edges(runs: list[Run], align: str, bins: int) -> np.ndarray | None:
    """Equal-width bin edges over the progress every run reached (None for align="step")."""
    if align == "step":
        return None
    curves = [reward_curve(r) if align == "reward" else accuracy_curve(r) for r in runs]
    values = np.concatenate([c.iloc[:, 1].to_numpy(float) for c in curves] + [np.array([])])
    if values.size == 0:
        return np.array([0.0, 1.0])
    low, high = float(values.min()), float(values.max())
    return np.linspace(low, high if high > low else low + 1e-9, bins + 1)


def with_x(
    table: pd.DataFrame, runs: list[Run], align: str, edges: np.ndarray | None
) -> pd.DataFrame:
    """Add `progress` (raw) and `x` (step, or the centre of the progress bin) to a long table."""
    table = table.copy()
    if align == "step" or table.empty:
        table["progress"] = table["step"].astype(float)
        table["x"] = table["progress"]
        return table
    by_id = {str(run.path): run for run in runs}
    progress = pd.Series(np.nan, index=table.index)
    for run_id, rows in table.groupby("run_id"):
        progress[rows.index] = progress_at(by_id[run_id], rows["step"].to_numpy(), align)
    table["progress"] = progress
    index = np.clip(
        np.searchsorted(edges, progress.to_numpy(), side="right") - 1, 0, len(edges) - 2
    )
    centres = (edges[:-1] + edges[1:]) / 2
    table["x"] = np.where(progress.notna(), centres[index], np.nan)
    return table.dropna(subset=["x"])


def curves(table: pd.DataFrame, keys: list[str]) -> pd.DataFrame:
    """Mean and min-max band over runs of `value` at each x, per `keys` + R + variant.

    Within a run, values sharing an x (steps in the same progress bin) are averaged first.
    """
    by = [*keys, "group_size", "variant"]
    if table.empty:
        return pd.DataFrame(columns=[*by, "x", "mean", "lo", "hi", "n"])
    per_run = table.groupby([*by, "run_id", "x"], as_index=False)["value"].mean()
    grouped = per_run.groupby([*by, "x"])["value"]
    out = grouped.agg(mean="mean", lo="min", hi="max", n="count").reset_index()
    return out.sort_values([*by, "x"]).reset_index(drop=True)
