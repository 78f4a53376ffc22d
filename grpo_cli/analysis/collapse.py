"""Mode collapse beside the rank: is "rank -> 2" the zero-sum structure or fewer distinct answers?

A group's R x P matrix has at most as many independent rows as the group has distinct
completions, so when sampling collapses (distinct completions per informative group and token
entropy fall over training) the per-group rank falls with them, towards 2 (one answer per reward
class) or below, for a reason that has nothing to do with the paper's zero-sum argument. A
longer run can then read "rank ~2" for the wrong reason (issue 30: at R=8 the CPU preset's rank
falls from ~3.8 to ~2 while distinct completions fall from 4.1 to ~3).

This module reads, per run, the claim-2 rank (`rollout_group` / `erank_entropy` by default) on
probe steps beside metrics.csv `distinct_completions` and `entropy` at the same steps, splits
each run's probe steps into an early and a late half, and

- `stage_table`: per variant, R and stage, the means over seeds of rank, the closed form over
  distinct completions (ranks.csv pred_distinct_<measure>), distinct completions and entropy;
- `stage_readings`: per variant and stage, claim 2's numbers on the stage alone: the mean rank
  per R, the slope per doubling of R and the largest deviation from the target over the judged
  (uncapped) R values;
- `collapse_warnings`: one record (words_over_r.ModeCollapse) per variant and R whose late rank is near the target or
  below it (within the claim-2 band above it) and lower than early, while distinct completions
  fall by at least the rule book's `distinct_fall` (relative).

Point estimates: the intervals and verdicts of the whole-run reading are the claims' (claims.py).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from grpo_cli.analysis.load import Run
from grpo_cli.analysis.over_r import reading_over_r
from grpo_cli.analysis.rules import Rules
from grpo_cli.analysis.tables import metric_table
from grpo_cli.analysis.words_over_r import ModeCollapse

STAGES = ("early", "late")  # first and second half of a run's probe steps
COLLAPSE_METRICS = ("distinct_completions", "entropy")
KEYS = ["variant", "group_size"]
PREDICTED = "predicted over distinct"  # the closed form over a group's distinct completions


def collapse_frame(runs: list[Run], ranks: pd.DataFrame, matrix: str = "rollout_group",
                   measure: str = "erank_entropy") -> pd.DataFrame:
    """One row per run and probe step: variant, group_size, seed, run_id, step, stage, rank,
    distinct_completions, entropy (NaN where metrics.csv lacks the column) and PREDICTED, the
    closed-form rank over the group's distinct completions (ranks.csv pred_distinct_<measure>,
    mean over the step's groups; NaN where the closed form does not apply). `ranks`:
    tables.rank_table (the group == "mean" rows of `matrix` are read)."""
    columns = ["variant", "group_size", "seed", "run_id", "step", "stage", "rank",
               *COLLAPSE_METRICS, PREDICTED]
    if ranks.empty:
        return pd.DataFrame(columns=columns)
    picked = ranks[(ranks["matrix"] == matrix) & (ranks["measure"] == measure)
                   & (ranks["stat"].isin(["mean", "all"]))]
    if picked.empty:
        return pd.DataFrame(columns=columns)
    frame = picked.groupby(["variant", "group_size", "seed", "run_id", "step"], as_index=False)[
        "value"].mean().rename(columns={"value": "rank"})
    metrics = metric_table(runs, list(COLLAPSE_METRICS))
    if not metrics.empty:
        wide = metrics.pivot_table(index=["run_id", "step"], columns="metric", values="value")
        frame = frame.merge(wide.reset_index(), on=["run_id", "step"], how="left")
    for column in COLLAPSE_METRICS:
        if column not in frame:
            frame[column] = np.nan
    frame = frame.merge(_predicted_over_distinct(runs, matrix, measure), on=["run_id", "step"],
                        how="left")
    frame = frame.sort_values(["run_id", "step"]).reset_index(drop=True)
    # early: the first half of each run's probe steps (the middle one of an odd count is late)
    order = frame.groupby("run_id").cumcount()
    count = frame.groupby("run_id")["step"].transform("size")
    frame["stage"] = np.where(order < count // 2, STAGES[0], STAGES[1])
    return frame[columns]


def _predicted_over_distinct(runs: list[Run], matrix: str, measure: str) -> pd.DataFrame:
    """run_id, step, PREDICTED: the mean over a step's per-group rows of pred_distinct_<measure>."""
    column, parts = f"pred_distinct_{measure}", []
    for run in runs:
        ranks = run.ranks
        if ranks.empty or column not in ranks or "matrix" not in ranks:
            continue
        rows = ranks[(ranks["matrix"] == matrix) & ranks["group"].astype(str).str.startswith("g")]
        values = pd.to_numeric(rows[column], errors="coerce")
        per_step = values.groupby(rows["step"]).mean().dropna()
        parts.append(pd.DataFrame({"run_id": str(run.path), "step": per_step.index,
                                   PREDICTED: per_step.to_numpy()}))
    if not parts:
        return pd.DataFrame(columns=["run_id", "step", PREDICTED])
    return pd.concat(parts, ignore_index=True)


def stage_table(frame: pd.DataFrame) -> pd.DataFrame:
    """Per variant, R and stage: steps (first-last probe step), seeds, and the means over seeds
    (each seed's stage mean first) of rank, distinct_completions and entropy."""
    columns = [*KEYS, "stage", "steps", "n_seeds", "rank", PREDICTED, *COLLAPSE_METRICS]
    if frame.empty:
        return pd.DataFrame(columns=columns)
    per_run = frame.groupby([*KEYS, "stage", "run_id"], as_index=False).agg(
        first=("step", "min"), last=("step", "max"), rank=("rank", "mean"),
        **{column: (column, "mean") for column in (PREDICTED, *COLLAPSE_METRICS)},
    )
    table = per_run.groupby([*KEYS, "stage"], as_index=False).agg(
        first=("first", "min"), last=("last", "max"), n_seeds=("run_id", "nunique"),
        rank=("rank", "mean"),
        **{column: (column, "mean") for column in (PREDICTED, *COLLAPSE_METRICS)},
    )
    table["steps"] = [f"{int(a)}-{int(b)}" for a, b in zip(table["first"], table["last"], strict=True)]
    table["stage"] = pd.Categorical(table["stage"], STAGES, ordered=True)
    return table.sort_values([*KEYS, "stage"])[columns].reset_index(drop=True)


def stage_readings(stages: pd.DataFrame, rules: Rules) -> pd.DataFrame:
    """Claim 2 per stage: variant, stage, judged R, one `R=<r>` mean rank column per R, the slope
    per doubling and the largest |rank - target| over the judged (uncapped) R values."""
    rows = []
    sizes = sorted(int(r) for r in stages["group_size"].unique()) if not stages.empty else []
    for (variant, stage), part in stages.groupby(["variant", "stage"], observed=True, sort=True):
        means = dict(zip(part["group_size"].astype(int), part["rank"], strict=True))
        reading = reading_over_r(means, rules.target)
        rows.append({
            "variant": variant, "stage": stage,
            "judged R": reading.judged_text,
            **{f"R={r}": means.get(r, np.nan) for r in sizes},
            "slope / doubling": reading.slope,
            "max dev. from 2": reading.max_deviation,
        })
    return pd.DataFrame(rows)


def collapse_warnings(stages: pd.DataFrame, rules: Rules) -> list[ModeCollapse]:
    """Per variant and R: the late rank is at most the rule book's target + band (claim 2's band,
    `grpo analyze --tolerance`) and lower than early, while distinct completions per informative
    group fall by at least `rules.distinct_fall` (relative). Its words: words_over_r.ModeCollapse."""
    target, band, distinct_fall = rules.target, rules.band, rules.distinct_fall
    out = []
    for (variant, size), part in stages.groupby(KEYS, sort=True):
        by_stage = part.set_index("stage")
        if not set(STAGES) <= set(by_stage.index):
            continue
        early, late = by_stage.loc[STAGES[0]], by_stage.loc[STAGES[1]]
        values = [early["rank"], late["rank"], early["distinct_completions"],
                  late["distinct_completions"]]
        if not np.isfinite(np.asarray(values, float)).all():
            continue
        falls = late["distinct_completions"] <= (1 - distinct_fall) * early["distinct_completions"]
        if late["rank"] <= target + band and late["rank"] < early["rank"] and falls:
            out.append(ModeCollapse(
                variant, int(size), target, float(early["rank"]), float(late["rank"]),
                early["steps"], late["steps"], float(early["distinct_completions"]),
                float(late["distinct_completions"]), float(early["entropy"]),
                float(late["entropy"])))
    return out
