"""Matched progress: can the R values be compared at equal progress, and on which variable?

Claim 2 compares R across separate runs, so a rank that moves over training mixes "depends on
R" with "R=8 is further along". Matching compares R where a progress variable takes the same
value. It only matches something when the variable's ranges differ between R; when every R
reaches every bin, the "matched" mean over bins is a reweighted whole-run average (issue 30: on
the CPU preset every R reaches all 8 training-reward bins). So, per candidate variable
(held-out accuracy when eval.csv has it, the training reward, and distinct completions per
informative group, the group-composition variable that R itself bounds):

- `coverage_table`: per variant and R, the variable's range on probe steps, the equal-width
  bins it reaches and the share of its probe steps in bins every R reaches: matching is not
  possible without a common bin, and only reweights when every R lies almost wholly in them;
- `per_bin_table`: within each bin that two or more judged R values reach, the rank per R and its
  slope per doubling of R: "does the rank depend on R at equal progress?", read per bin instead
  of averaged over bins;
- `sentences`: the plain reading, including "no matching is possible" where it is not.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from grpo_cli.analysis.load import Run
from grpo_cli.analysis.over_r import reading_over_r
from grpo_cli.analysis.rules import Rules, judged_group_sizes
from grpo_cli.analysis.tables import progress_at

VARIABLES = {  # name -> what it is, in words
    "accuracy": "held-out accuracy (eval.csv, interpolated between evals)",
    "reward": "training reward (rolling mean of reward_mean)",
    "distinct_completions": "distinct completions per informative group (metrics.csv)",
}


def with_progress(runs: list[Run], frame: pd.DataFrame, variable: str) -> pd.DataFrame:
    """`frame` (collapse.collapse_frame: run_id, step, rank, ...) with `progress`, the value of
    `variable` at each probe step (rows without a value dropped)."""
    frame = frame.copy()
    if frame.empty:
        return frame.assign(progress=pd.Series(dtype=float))
    if variable == "distinct_completions":
        frame["progress"] = frame["distinct_completions"]
    else:
        by_id = {str(run.path): run for run in runs}
        frame["progress"] = np.nan
        for run_id, rows in frame.groupby("run_id"):
            frame.loc[rows.index, "progress"] = progress_at(by_id[run_id], rows["step"].to_numpy(),
                                                            variable)
    return frame.dropna(subset=["progress", "rank"])


def _bins(progress: pd.Series, bins: int) -> tuple[np.ndarray, np.ndarray]:
    """Equal-width edges over the pooled range and each value's bin index."""
    low, high = float(progress.min()), float(progress.max())
    edges = np.linspace(low, high if high > low else low + 1e-9, bins + 1)
    index = np.clip(np.searchsorted(edges, progress.to_numpy(float), side="right") - 1, 0, bins - 1)
    return edges, index


def coverage_table(frame: pd.DataFrame, variable: str, bins: int, rules: Rules) -> pd.DataFrame:
    """Per variant and R: the variable's range on probe steps, the bins reached, the share of
    the R's probe steps in bins that every R reaches (`in common bins`), the mean rank over those
    bins (`matched mean`, each bin weighted equally) beside the mean over all probe steps, and
    `matching`: "not possible" (no bin every R reaches), "reweights only" (every R has at least
    `rules.match_common_share` of its probe steps in common bins: the R values cover the same progress, so
    the matched mean is a reweighted whole-run average) or "possible". Common bins are those
    every judged (uncapped) R reaches (rules.judged_group_sizes, at rules.target)."""
    rows = []
    for variant, part in frame.groupby("variant", sort=True):
        edges, index = _bins(part["progress"], bins)
        part = part.assign(bin=index)
        reached = {int(r): set(p["bin"]) for r, p in part.groupby("group_size")}
        judged = judged_group_sizes(reached, rules.target)  # capped R (R=2: 2 distinct at most) do not decide
        common = set.intersection(*(reached[r] for r in judged)) if judged else set()
        shares = {int(r): float(p["bin"].isin(common).mean()) for r, p in part.groupby("group_size")}
        if len(judged) < 2 or not common:
            matching = "not possible"
        elif min(shares[r] for r in judged) >= rules.match_common_share:
            matching = "reweights only"
        else:
            matching = "possible"
        for size, p in part.groupby("group_size"):
            in_common = p[p["bin"].isin(common)]
            rows.append({
                "variable": variable, "variant": variant, "group_size": int(size),
                "min": float(p["progress"].min()), "max": float(p["progress"].max()),
                "bins reached": len(reached[int(size)]), "bins": bins,
                "in common bins": shares[int(size)], "matching": matching,
                "matched mean": float(in_common.groupby("bin")["rank"].mean().mean())
                if len(in_common) else np.nan,
                "all-steps mean": float(p["rank"].mean()),
            })
    return pd.DataFrame(rows)


def per_bin_table(frame: pd.DataFrame, variable: str, bins: int, rules: Rules) -> pd.DataFrame:
    """Per variant and bin shared by two or more judged R values: the bin's range, the rank per
    R (per run first, then over seeds) and its slope per doubling of R."""
    rows = []
    for variant, part in frame.groupby("variant", sort=True):
        edges, index = _bins(part["progress"], bins)
        per_run = part.assign(bin=index).groupby(["group_size", "run_id", "bin"], as_index=False)[
            "rank"].mean()
        means = per_run.groupby(["bin", "group_size"])["rank"].mean()
        sizes = sorted(int(r) for r in part["group_size"].unique())
        for b in sorted({int(b) for b, _ in means.index}):
            here = {int(r): float(v) for r, v in means.loc[b].items()}
            reading = reading_over_r(here, rules.target)
            if len(reading.judged) < 2:
                continue
            rows.append({
                "variable": variable, "variant": variant,
                "bin": f"{edges[b]:.3g}-{edges[b + 1]:.3g}",
                **{f"R={r}": here.get(r, np.nan) for r in sizes},
                "slope / doubling": reading.slope,
            })
    return pd.DataFrame(rows)


def matching_tables(runs: list[Run], frame: pd.DataFrame, bins: int, rules: Rules
                    ) -> tuple[pd.DataFrame, pd.DataFrame]:
    """coverage_table and per_bin_table over every variable with data (held-out accuracy only
    when some run has eval.csv rows); `frame`: collapse.collapse_frame."""
    coverage, per_bin = [], []
    has_eval = any("accuracy" in run.evals and run.evals["accuracy"].notna().any() for run in runs)
    for variable in VARIABLES:
        if variable == "accuracy" and not has_eval:
            continue
        progress = with_progress(runs, frame, variable)
        if progress.empty:
            continue
        coverage.append(coverage_table(progress, variable, bins, rules))
        per_bin.append(per_bin_table(progress, variable, bins, rules))
    return _concat(coverage), _concat(per_bin)


def _concat(parts: list[pd.DataFrame]) -> pd.DataFrame:
    return pd.concat(parts, ignore_index=True) if parts else pd.DataFrame()
