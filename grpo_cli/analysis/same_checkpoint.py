"""`grpo probe` results: every R measured on the same weights and prompts, per checkpoint.

A `grpo probe` results directory (run.json `kind: probe`, trainer `grpo-probe`) holds one run per
R, each with one row per probed checkpoint at the step that checkpoint continues from
(grpo_cli/train/probe_checkpoint.py). Comparing its R values at one step compares them on the
same weights and the same prompts: the trajectory, which decides the rank in a comparison across
training runs (issue 30), is out of the comparison. `checkpoint_table` reads claim 2 at each
checkpoint: the rank per R (mean over seeds), the slope per doubling of R over the judged
(uncapped) R values with its seed-level interval where two or more seeds ran every judged R
(claim 2's kernel, over_r.slope_interval: the t-interval of per-seed slopes) and the largest
deviation from the target; `sentences` says what they are. Claim 2's verdict reads the training
runs (primary: the paper's claim is about each R's own training); this reading removes the
trajectory (collapse proceeds at a different pace per R) and is the check on it.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from grpo_cli.analysis.bootstrap import UNBOUNDED
from grpo_cli.analysis.load import Run
from grpo_cli.analysis.over_r import per_r_intervals, reading_over_r, slope_interval
from grpo_cli.analysis.rules import Rules

PROBE_TRAINER = "grpo-probe"


def is_probe(run: Run) -> bool:
    """Written by `grpo probe` (run.json kind `probe`, or trainer `grpo-probe`)."""
    return run.info.get("kind") == "probe" or run.info.get("trainer") == PROBE_TRAINER


def probe_source(run: Run) -> str:
    """What was probed: run.json probe.source (a run, a checkpoint file or a model directory)."""
    probe = run.info.get("probe") or {}
    return str(probe.get("source") or run.config.get("model.path") or run.experiment)


def _slope_interval(part: pd.DataFrame, judged: list[int], rules: Rules) -> tuple[float, float]:
    """(low, high) of the slope per doubling over `judged` (over_r.slope_interval, claim 2's
    kernel: the t-interval of per-seed slopes where the same seeds ran every judged R, else
    Welch's; NaN with fewer than two seeds or two R)."""
    if len(judged) < 2:
        return np.nan, np.nan
    rng = np.random.default_rng(0)  # draws only: low and high are exact
    per_r = per_r_intervals(part[part["group_size"].isin(judged)], {}, False, rules, rng,
                            lambda size: UNBOUNDED)
    if sorted(per_r) != sorted(judged):
        return np.nan, np.nan
    iv = slope_interval(per_r, judged, rules, rng)
    return (iv.low, iv.high) if iv.finite else (np.nan, np.nan)


def checkpoint_table(runs: list[Run], ranks: pd.DataFrame, rules: Rules) -> pd.DataFrame:
    """One row per probed source x variant x checkpoint step: the rank per R (mean over seeds of
    the step's value), the judged R values, the slope per doubling and the largest |rank -
    target| over them, on the rule book's matrix and measure. Empty without `grpo probe` runs.
    `ranks`: tables.rank_table."""
    matrix, measure, target = rules.rank_matrix, rules.rank_measure, rules.target
    probes = {str(run.path): run for run in runs if is_probe(run)}
    if not probes or ranks.empty:
        return pd.DataFrame()
    picked = ranks[ranks["run_id"].isin(probes) & (ranks["matrix"] == matrix)
                   & (ranks["measure"] == measure) & ranks["stat"].isin(["mean", "all"])]
    picked = picked.assign(source=picked["run_id"].map(lambda run_id: probe_source(probes[run_id])))
    sizes = sorted(int(r) for r in picked["group_size"].unique())
    rows = []
    for (source, variant, step), part in picked.groupby(["source", "variant", "step"], sort=True):
        means = part.groupby("group_size")["value"].mean()
        means = {int(r): float(v) for r, v in means.items()}
        reading = reading_over_r(means, target)
        low, high = _slope_interval(part, list(reading.judged), rules)
        rows.append({
            "source": source, "variant": variant, "checkpoint step": int(step),
            "seeds": int(part["seed"].nunique()),
            **{f"R={r}": means.get(r, np.nan) for r in sizes},
            "judged R": reading.judged_text,
            "slope / doubling": reading.slope,
            "slope low": low, "slope high": high,
            "max dev. from 2": reading.max_deviation,
        })
    return pd.DataFrame(rows)
