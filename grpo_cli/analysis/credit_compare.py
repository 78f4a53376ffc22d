"""Claim 4 on claim 2's matrices and rows: does per-token credit raise the rank where the outcome
estimators' rank is measured?

Claim 4 as first judged compared estimators on `rollout_batch`, a different matrix from claim 2's
`rollout_group`, and on different rows: ppo's critic gives non-zero advantages to zero-variance
groups, so its batch matrix has about twice the non-zero rows of grpo's, and a larger rank from
more rows says nothing about credit (issue 30). Here every matrix x measure is compared on the
same footing:

- `rollout_group`, `score_group`: the per-group rows (ranks.csv group g<b>) of informative groups
  only (minority >= 1: the rewards differ), for every estimator, so outcome and per-token
  estimators are read on the same kind of group; and of those, for every estimator alike, the
  problems with at least two checked steps (ranks.csv `problem_steps` >= 2: there a step-reward
  estimator such as process gives uniform credit on one-step problems). Claim 4 decides on the
  second where it is recorded (`deciding_stat`; analysis/falsifier.py).
- `rollout_batch`, `group_batch`: the whole matrix, and its rank per non-zero row (rank /
  `n_nonzero_rows`), which does not grow just because more rows are non-zero.
- `layer`: the mean over layers (the layer stable rank, the one measure that reads "~2 whatever R").

ppo (a critic: credit from a learned value, rows for zero-variance groups) and process (credit
from checked steps) are separate rows, never pooled. Per run the value is the mean over its last
`last_fraction` of probe steps, then the mean over seeds per R; the outcome slope is per doubling
of R over the judged (uncapped) R values; the difference is per-token minus outcome, per R and
averaged over the R values both have.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from grpo_cli.analysis.load import Run
from grpo_cli.analysis.over_r import reading_over_r
from grpo_cli.analysis.rules import (
    OUTCOME,
    PER_TOKEN,
    Rules,
    estimator_family,
)
from grpo_cli.analysis.summary import last_part_means, rank_summary
from grpo_cli.analysis.tables import LAYER_MEAN, META, run_meta

PER_GROUP = ("rollout_group", "score_group")
WHOLE = ("rollout_batch", "group_batch")
PER_ROW = " per non-zero row"  # suffix of the measure read per non-zero row
READINGS = {  # which reading of the paper a matrix covers
    "rollout_group": "per group: the R x P matrix of the zero-sum argument",
    "score_group": "per group, unweighted score rows (control: no advantages)",
    "rollout_batch": "per step: all rollouts' advantage-weighted rows",
    "group_batch": "per step: one row per group (the group's summed gradient)",
    "layer": "per layer: the batch gradient as a weight-shaped matrix (stable rank ~2)",
}


INFORMATIVE, MULTI_STEP, WHOLE_MATRIX = "informative groups", "multi-step problems", "all"


def group_selections(rows: pd.DataFrame, rules: Rules) -> dict[str, pd.DataFrame]:
    """Per-group rows of groups whose rewards differ (`INFORMATIVE`), and of those the groups
    whose problem has at least `rules.min_checked_steps` checked steps (`MULTI_STEP`, where a
    step-reward estimator's credit can differ from uniform; absent without `problem_steps`)."""
    if "minority" in rows:
        rows = rows[pd.to_numeric(rows["minority"], errors="coerce") >= 1]
    out = {INFORMATIVE: rows}
    if "problem_steps" in rows and rows["problem_steps"].notna().any():
        out[MULTI_STEP] = rows[pd.to_numeric(rows["problem_steps"], errors="coerce") >= rules.min_checked_steps]
    return out


def deciding_stat(available: set[str]) -> str:
    """The per-group rows claim 4 compares on, the same for every estimator (never chosen by
    name): multi-step problems where both sides record checked steps (on a one-step problem a
    step-reward estimator gives uniform credit, so per-token credit cannot show there), else
    informative groups."""
    return MULTI_STEP if MULTI_STEP in available else INFORMATIVE


def same_rows_table(runs: list[Run], measures: list[str], rules: Rules) -> pd.DataFrame:
    """Long table (META + step, matrix, layer, stat, measure, value) of every run's ranks read
    on the same rows for every estimator (module docstring): per-group matrices with `stat`
    INFORMATIVE and MULTI_STEP, whole matrices with `stat` "all" and `<measure> per non-zero
    row` beside each measure."""
    columns = [*META, "step", "matrix", "layer", "stat", "measure", "value"]
    parts = []
    for run in runs:
        ranks = run.ranks
        if ranks.empty or "matrix" not in ranks:
            continue
        have = [m for m in measures if m in ranks]
        numeric = ranks.assign(**{c: pd.to_numeric(ranks[c], errors="coerce")
                                  for c in [*have, "n_nonzero_rows"] if c in ranks})
        for matrix in (*PER_GROUP, *WHOLE, "layer"):
            rows = numeric[numeric["matrix"] == matrix]
            if matrix in PER_GROUP:
                selections = {stat: picked.groupby("step", as_index=False)[have].mean()
                              for stat, picked in group_selections(
                                  rows[rows["group"].str.startswith("g")], rules).items()}
            elif matrix in WHOLE:
                rows = rows[rows["group"].isin(["all", ""])]
                wide = rows[["step", *have]].copy()
                if "n_nonzero_rows" in rows:
                    nonzero = rows["n_nonzero_rows"].where(rows["n_nonzero_rows"] > 0)
                    for m in have:
                        wide[m + PER_ROW] = rows[m] / nonzero
                selections = {WHOLE_MATRIX: wide}
            else:
                rows = rows[rows["group"].isin(["all", ""])]
                selections = {WHOLE_MATRIX: rows.groupby("step", as_index=False)[have].mean()}
            layer = LAYER_MEAN if matrix == "layer" else ""
            for stat, wide in selections.items():
                if wide.empty:
                    continue
                long = wide.melt(id_vars="step", var_name="measure").dropna(subset=["value"])
                long = long[long["value"] != 0]  # a zero matrix has no rank (tables.py)
                parts.append(long.assign(matrix=matrix, layer=layer, stat=stat, **run_meta(run)))
    if not parts:
        return pd.DataFrame(columns=columns)
    return pd.concat(parts, ignore_index=True)[columns]


def measure_rows(table: pd.DataFrame, measures: list[str]) -> pd.DataFrame:
    """The rows of a `same_rows_table` for `measures` (and their readings per non-zero row), in
    its order: that table as `same_rows_table(runs, measures, rules)` would build it."""
    return table[table["measure"].isin([*measures, *(m + PER_ROW for m in measures)])]


def comparison_table(runs: list[Run], measures: list[str], rules: Rules,
                     same_rows: pd.DataFrame | None = None) -> pd.DataFrame:
    """One row per matrix x measure x outcome variant x per-token variant: the reading, the
    outcome rank per R and its slope per doubling (judged R), the per-token rank per R, and the
    difference per R and on average (empty without both kinds of estimator). `same_rows`: the
    runs' `same_rows_table` for these measures or more, where the caller has it."""
    facts = {run.variant: run.estimator_facts for run in runs}
    estimators = {variant: f["name"] for variant, f in facts.items()}
    outcome = sorted(v for v, f in facts.items() if estimator_family(f) == OUTCOME)
    per_token = sorted(v for v, f in facts.items() if estimator_family(f) == PER_TOKEN)
    table = same_rows_table(runs, measures, rules) if same_rows is None else measure_rows(same_rows, measures)
    summary = rank_summary(last_part_means(table, rules.last_fraction))
    if summary.empty or not outcome or not per_token:
        return pd.DataFrame()
    means = {key: dict(zip(part["group_size"].astype(int), part["mean"], strict=True))
             for key, part in summary.groupby(["variant", "matrix", "stat", "measure"], sort=False)}
    rows = []
    for (variant, matrix, stat, measure), base in means.items():
        if variant not in outcome:
            continue
        slope = reading_over_r(base, rules.target).slope
        for other in per_token:
            # every selection on per-group matrices (claim 4 decides on deciding_stat's);
            # whole matrices as they are
            theirs = means.get((other, matrix, stat, measure), {})
            common = sorted(set(base) & set(theirs))
            difference = {r: theirs[r] - base[r] for r in common}
            rows.append({
                "matrix": matrix, "measure": measure,
                "reading": READINGS.get(matrix, matrix)
                + (" (rank / non-zero rows)" if measure.endswith(PER_ROW) else "")
                + (f"; {stat}" if stat != WHOLE_MATRIX else ""),
                "rows": stat,  # INFORMATIVE, MULTI_STEP (claim 4 decides on it where recorded), all
                "outcome": variant or estimators[variant], "per-token": other or estimators[other],
                "outcome rank": _per_r(base), "outcome slope": slope,
                "per-token rank": _per_r(theirs),
                "difference": _per_r(difference, signed=True),
                "mean difference": float(np.mean(list(difference.values()))) if common else np.nan,
            })
    return pd.DataFrame(rows)


def _per_r(values: dict[int, float], signed: bool = False) -> str:
    if not values:
        return "-"
    form = "{:+.2f}" if signed else "{:.2f}"
    return ", ".join(f"R={r}: {form.format(v)}" for r, v in sorted(values.items()))
