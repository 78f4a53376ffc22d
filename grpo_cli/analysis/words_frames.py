"""Readings' tables in words: the sentences report.py writes under the matching, same-checkpoint
and update-density tables (the renderer's room; matching.py, same_checkpoint.py and
update_density.py compute the tables and write no sentence)."""

from __future__ import annotations

import numpy as np
import pandas as pd

from grpo_cli.analysis.matching import VARIABLES
from grpo_cli.analysis.update_density import LABELS, SPARSITY, STEP_READINGS


def matching_sentences(coverage: pd.DataFrame) -> list[str]:
    """The plain reading of matching.coverage_table, one sentence per variable and variant."""
    out = []
    for (variable, variant), part in coverage.groupby(["variable", "variant"], sort=False):
        what = VARIABLES.get(variable, variable) + (f", {variant}" if variant else "")
        matching = part["matching"].iloc[0]
        means = ", ".join(
            f"R={r['group_size']}: "
            + (f"{r['matched mean']:.2f} matched" if np.isfinite(r["matched mean"]) else "no shared bin")
            + f" vs {r['all-steps mean']:.2f} over all probe steps"
            for r in part.to_dict("records"))
        reached = ", ".join(f"R={r['group_size']} {r['min']:.2f}-{r['max']:.2f} "
                            f"({r['in common bins']:.0%} of its probe steps in common bins)"
                            for r in part.to_dict("records"))
        if matching == "not possible":
            out.append(f"{what}: no matching is possible, no bin is reached by every judged R "
                       f"({reached}).")
        elif matching == "reweights only":
            out.append(
                f"{what}: no matching is possible on this variable, because it does not separate "
                f"the R values: every R covers the same range ({reached}), so a mean over common "
                f"bins is a reweighted whole-run average ({means}). Read the per-bin slopes below.")
        else:
            gap = (part["matched mean"] - part["all-steps mean"]).abs().max()
            out.append(f"{what}: the judged R values share part of their range ({reached}); over "
                       f"the common bins the rank moves by at most {gap:.2f} from its all-steps "
                       f"mean ({means}).")
    return out


def same_checkpoint_sentences(table: pd.DataFrame, matrix: str = "rollout_group",
                               measure: str = "erank_entropy") -> list[str]:
    """Per source and variant: what the same-checkpoint comparison (same_checkpoint.py) reads, step
    by step."""
    out = []
    for (source, variant), part in table.groupby(["source", "variant"], sort=False):
        readings = "; ".join(
            f"step {r['checkpoint step']}: slope {r['slope / doubling']:+.2f}"
            + (f" [{r['slope low']:+.2f}, {r['slope high']:+.2f}]"
               if np.isfinite(r["slope low"]) else " (no interval: fewer than 2 seeds)")
            + f" per doubling over R={r['judged R']}, largest deviation from 2 "
            f"{r['max dev. from 2']:.2f}"
            for r in part.to_dict("records")
        )
        who = f" ({variant})" if variant else ""
        out.append(
            f"Same checkpoint{who}: every R of {source} was sampled from the same weights on the "
            f"same prompts, so these {matrix} / {measure} comparisons have no trajectory in them. "
            f"{readings}."
        )
    return out


def update_density_sentences(table: pd.DataFrame) -> list[str]:
    """Per variant (update_density.density_table), one sentence: each measure early -> late, averaged over R."""
    out = []
    for variant, rows in table.groupby("variant", sort=True):
        means = rows.groupby("measure")[["early", "late"]].mean()
        parts = [f"{LABELS[m]} {means.loc[m, 'early']:.3g} -> {means.loc[m, 'late']:.3g}"
                 for m in (SPARSITY, *STEP_READINGS) if m in means.index]
        out.append(f"{variant or 'runs'} (early -> late half of training, mean over R): "
                   + "; ".join(parts) + ".")
    return out
