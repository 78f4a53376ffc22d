"""Summary tables and the verdict on the claim "effective rank ~2, independent of R".

Per run, a rank measure is summarised by its mean over the last `last_fraction` of that run's
probe steps (steps >= (1 - last_fraction) * last probe step). Those per-run values are then
averaged over seeds per R (and per variant), and the rule of `Rule.text` decides the verdict.
"""

from __future__ import annotations

from dataclasses import dataclass

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


@dataclass(frozen=True)
class Rule:
    """When "effective rank ~2 independent of R" holds."""

    tolerance: float = 0.5  # every R's mean must lie within target +- tolerance
    trend_threshold: float = 0.25  # max |least-squares slope| of mean rank vs log2(R)
    target: float = 2.0  # the claimed effective rank

    def text(self, last_fraction: float) -> str:
        return (
            f"'~{self.target:g} independent of R' holds iff (a) for every group size R, "
            f"|mean rank - {self.target:g}| <= {self.tolerance:g}, where mean rank is the mean "
            f"over seeds of each run's mean over its last {last_fraction:.0%} of probe steps, "
            f"and (b) the least-squares slope of those means against log2(R) satisfies "
            f"|slope| <= {self.trend_threshold:g} rank units per doubling of R. "
            "With fewer than two values of R the verdict is 'undetermined'."
        )

    def judge(self, means: dict[int, float]) -> dict:
        """Verdict, largest deviation from the target, slope per doubling, and a plain sentence."""
        means = {r: m for r, m in sorted(means.items()) if np.isfinite(m) and r > 0}
        if not means:
            return {"verdict": "undetermined", "max_deviation": np.nan, "slope": np.nan}
        deviation = max(abs(m - self.target) for m in means.values())
        if len(means) < 2:
            return {"verdict": "undetermined", "max_deviation": deviation, "slope": np.nan}
        slope = float(np.polyfit(np.log2(list(means)), list(means.values()), 1)[0])
        holds = deviation <= self.tolerance and abs(slope) <= self.trend_threshold
        return {
            "verdict": "holds" if holds else "fails",
            "max_deviation": deviation,
            "slope": slope,
        }

    def sentence(self, subject: str, means: dict[int, float], judged: dict) -> str:
        """One plain sentence that explains a verdict."""
        values = ", ".join(f"{m:.2f} at R={r}" for r, m in sorted(means.items()))
        target, tol = f"{self.target:g}", f"{self.tolerance:g}"
        if judged["verdict"] == "undetermined":
            return (
                f"{subject}: undetermined, only {len(means)} value(s) of R ({values or 'no data'})."
            )
        slope = f"{judged['slope']:+.2f} per doubling of R"
        if judged["verdict"] == "holds":
            return (
                f"{subject}: holds; the rank stays within {tol} of {target} ({values}) "
                f"and shows no trend in R ({slope})."
            )
        far = [f"R={r}" for r, m in sorted(means.items()) if abs(m - self.target) > self.tolerance]
        reasons = []
        if far:
            reasons.append(f"{', '.join(far)} lie(s) more than {tol} from {target}")
        if abs(judged["slope"]) > self.trend_threshold:
            reasons.append(f"the rank changes by {slope} (threshold {self.trend_threshold:g})")
        return f"{subject}: fails; {' and '.join(reasons)} ({values})."


def verdict_rows(table: pd.DataFrame) -> pd.DataFrame:
    """The rows a verdict is made on: per-group `mean`, whole matrices, and the layer mean."""
    return table[table["layer"].isin(["", LAYER_MEAN]) & table["stat"].isin(["mean", "all"])]


def last_part_means(ranks: pd.DataFrame, last_fraction: float) -> pd.DataFrame:
    """Per run x matrix x layer x stat x measure: mean value over the run's last probe steps."""
    if ranks.empty:
        return pd.DataFrame(columns=[*META, *SUMMARY_KEYS, "value"])
    last = ranks.groupby("run_id")["step"].transform("max")
    window = ranks[ranks["step"] >= (1 - last_fraction) * last]
    return window.groupby([*META, *SUMMARY_KEYS], as_index=False)["value"].mean()


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


def _subject(variant: str, matrix: str, measure: str) -> str:
    return f"{matrix} / {measure}" + (f" ({variant})" if variant else "")


def verdicts(summary: pd.DataFrame, rule: Rule) -> pd.DataFrame:
    """One verdict row per variant x matrix x measure, on the verdict rows of `summary`."""
    rows = []
    for (variant, matrix, layer, stat, measure), part in verdict_rows(summary).groupby(
        SUMMARY_KEYS, sort=False
    ):
        means = dict(zip(part["group_size"].astype(int), part["mean"], strict=True))
        judged = rule.judge(means)
        sentence = rule.sentence(_subject(variant, matrix, measure), means, judged)
        if part["n_incomplete"].sum():
            sentence += " Provisional: includes incomplete runs."
        rows.append(
            {
                "variant": variant,
                "matrix": matrix,
                "layer": layer,
                "stat": stat,
                "measure": measure,
                **judged,
                "n_incomplete": int(part["n_incomplete"].sum()),
                "means": means,
                "sentence": sentence,
            }
        )
    return pd.DataFrame(
        rows,
        columns=[
            *SUMMARY_KEYS,
            "verdict",
            "max_deviation",
            "slope",
            "n_incomplete",
            "means",
            "sentence",
        ],
    )


def matched_verdicts(ranks_x: pd.DataFrame, rule: Rule, progress: str) -> pd.DataFrame:
    """The same rule on ranks compared at matched progress.

    `ranks_x` carries `x`, the centre of each probe step's progress bin. Per R, the rank is
    averaged within each bin (first within a run, then over runs) and then over the bins that
    every R of the variant reaches; bins reached by only some Rs are left out.
    """
    columns = [
        *SUMMARY_KEYS,
        "verdict",
        "max_deviation",
        "slope",
        "common_bins",
        "means",
        "sentence",
    ]
    rows = []
    if ranks_x.empty:
        return pd.DataFrame(columns=columns)
    table = verdict_rows(ranks_x)
    per_run = table.groupby([*SUMMARY_KEYS, "group_size", "run_id", "x"], as_index=False)[
        "value"
    ].mean()
    per_bin = per_run.groupby([*SUMMARY_KEYS, "group_size", "x"], as_index=False)["value"].mean()
    for key, part in per_bin.groupby(SUMMARY_KEYS, sort=False):
        bins_per_r = part.groupby("group_size")["x"].apply(set)
        common = sorted(set.intersection(*bins_per_r)) if len(bins_per_r) else []
        matched = part[part["x"].isin(common)]
        means = matched.groupby("group_size")["value"].mean().to_dict()
        judged = (
            rule.judge(means)
            if common
            else {"verdict": "undetermined", "max_deviation": np.nan, "slope": np.nan}
        )
        span = f"{progress} bins centred {common[0]:.3g}..{common[-1]:.3g}" if common else "none"
        sentence = rule.sentence(
            _subject(key[0], key[1], key[4]) + f" at matched {progress}",
            {int(r): m for r, m in means.items()},
            judged,
        )
        if not common:
            sentence = (
                f"{_subject(key[0], key[1], key[4])} at matched {progress}: undetermined, "
                "no progress bin is reached by every R."
            )
        rows.append(
            {
                **dict(zip(SUMMARY_KEYS, key, strict=True)),
                **judged,
                "common_bins": f"{len(common)} ({span})",
                "means": means,
                "sentence": sentence,
            }
        )
    return sort_rows(pd.DataFrame(rows, columns=columns)) if rows else pd.DataFrame(columns=columns)


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
