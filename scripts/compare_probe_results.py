"""Do two runs record the same probes? ranks.csv and spectra.parquet compared to a tolerance.

    python scripts/compare_probe_results.py RUN_DIR_BEFORE RUN_DIR_AFTER [--rtol 1e-6]

For checking that a change to the probes' code keeps what they record (docs/speed_log.md, "Probes
against a faster step"): run the same command at both commits and compare the two run folders.

- ranks.csv: the same rows and columns; every numeric value within `rtol` relative, and the
  same NaN pattern and text columns.
- spectra.parquet: the same (step, matrix, layer, group, k) rows; |sigma_k - sigma_k'| <= rtol
  sigma_1 of the same spectrum. Values far below sigma_1 are the eigen-solver's round-off (a
  spectrum read off a Gram resolves sigma to ~1e-8 sigma_1, grpo_cli/probes/rank_measures.py),
  so they are held to sigma_1, not to themselves; the relative difference of the values above
  rtol sigma_1 is printed too. Exit status 1 when anything differs.
"""

from __future__ import annotations

import argparse
import sys

import numpy as np
import pandas as pd

KEYS = ["step", "matrix", "layer", "group"]


def _relative(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    scale = np.maximum(np.abs(x), np.abs(y))
    return np.abs(x - y) / np.where(scale > 0, scale, 1.0)


def compare_ranks(before: pd.DataFrame, after: pd.DataFrame, rtol: float) -> list[str]:
    if list(before.columns) != list(after.columns) or len(before) != len(after):
        return [f"ranks.csv: shape or columns differ ({before.shape} vs {after.shape})"]
    problems, worst = [], 0.0
    for column in before.columns:
        if before[column].dtype.kind not in "fiu":
            if not (before[column].fillna("").astype(str) == after[column].fillna("").astype(str)).all():
                problems.append(f"ranks.csv {column}: values differ")
            continue
        x, y = before[column].to_numpy(float), after[column].to_numpy(float)
        if not (np.isnan(x) == np.isnan(y)).all():
            problems.append(f"ranks.csv {column}: NaN where the other has a value")
        both = ~np.isnan(x) & ~np.isnan(y)
        rel = _relative(x[both], y[both])
        if rel.size and rel.max() > rtol:
            row = np.flatnonzero(both)[int(rel.argmax())]
            problems.append(f"ranks.csv {column}: {x[row]!r} vs {y[row]!r} "
                            f"(relative {rel.max():.2e}) at {before.loc[row, KEYS].tolist()}")
        worst = max(worst, float(rel.max()) if rel.size else 0.0)
    print(f"ranks.csv: {len(before)} rows x {len(before.columns)} columns, "
          f"max relative difference {worst:.2e}")
    return problems


def compare_spectra(before: pd.DataFrame, after: pd.DataFrame, rtol: float) -> list[str]:
    labels = KEYS + ["k"]
    if len(before) != len(after) or not (
        before[labels].fillna("").astype(str).to_numpy() == after[labels].fillna("").astype(str).to_numpy()
    ).all():
        return ["spectra.parquet: the (step, matrix, layer, group, k) rows differ"]
    sigma_1 = before.groupby(KEYS, dropna=False)["sigma"].transform("max").to_numpy()
    x, y = before["sigma"].to_numpy(), after["sigma"].to_numpy()
    held = np.abs(x - y) / np.where(sigma_1 > 0, sigma_1, 1.0)
    large = x > rtol * sigma_1
    rel = _relative(x[large], y[large])
    print(f"spectra.parquet: {len(before)} values, max |difference| / sigma_1 {held.max():.2e}; "
          f"max relative difference of the {int(large.sum())} values above {rtol:g} sigma_1 "
          f"{rel.max() if rel.size else 0.0:.2e}")
    if held.size and held.max() > rtol:
        row = int(held.argmax())
        return [f"spectra.parquet: {x[row]!r} vs {y[row]!r} (sigma_1 {sigma_1[row]!r}) at "
                f"{before.loc[row, labels].tolist()}"]
    return []


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("before")
    parser.add_argument("after")
    parser.add_argument("--rtol", type=float, default=1e-6)
    args = parser.parse_args()
    problems = compare_ranks(pd.read_csv(f"{args.before}/ranks.csv"),
                             pd.read_csv(f"{args.after}/ranks.csv"), args.rtol)
    problems += compare_spectra(pd.read_parquet(f"{args.before}/spectra.parquet"),
                                pd.read_parquet(f"{args.after}/spectra.parquet"), args.rtol)
    for problem in problems:
        print(problem)
    print("DIFFERENT" if problems else f"the same to {args.rtol:g}")
    sys.exit(1 if problems else 0)


if __name__ == "__main__":
    main()
