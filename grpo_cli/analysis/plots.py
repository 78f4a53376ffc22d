"""Rank figures: spectra, effective rank over training, rank vs R, group composition.

Spectra aggregation (said in each panel title): per-group matrices average the normalised
spectra of their groups; `layer`/`update` average the normalised spectra of all layers, cut to
the shortest layer's length; other matrices show the whole-matrix spectrum.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.ticker import MaxNLocator

from grpo_cli.analysis.composition import prediction_curve
from grpo_cli.analysis.load import Run, read_spectra, spectra_steps
from grpo_cli.analysis.rules import Rules, capped_group_sizes
from grpo_cli.analysis.style import (
    Grid,
    Styles,
    band,
    draw_alarms,
    empty_figure,
    new_figure,
    no_data,
    r_color,
)
from grpo_cli.analysis.summary import verdict_rows
from grpo_cli.analysis.tables import LAYER_MATRICES, PER_GROUP_MATRICES, curves, ordered_matrices
from grpo_cli.measures import MEASURE_LABELS

STEP_STYLES = ("-", "--", ":", "-.")
SPECTRUM_FLOOR = 1e-6  # sigma_k / sigma_1 below this (numerically zero) is drawn at the floor
SPECTRUM_NOTES = {m: "mean over groups" for m in PER_GROUP_MATRICES} | {
    m: "mean over layers" for m in LAYER_MATRICES
}


def default_steps(steps_per_run: list[list[int]]) -> list[int]:
    """Start, middle and end of the steps every run has (of all runs' steps if none is shared)."""
    sets = [set(s) for s in steps_per_run if s]
    pool = sorted(set.intersection(*sets) or set.union(*sets)) if sets else []
    if not pool:
        return []
    middle = min(pool, key=lambda s: abs(s - (pool[0] + pool[-1]) / 2))
    return sorted({pool[0], middle, pool[-1]})


def normalised_spectra(table: pd.DataFrame, by: tuple[str, ...] = ()) -> pd.DataFrame:
    """[*by], matrix, index (1-based, descending), value = sigma_index / sigma_1, aggregated per
    matrix (and per value of the `by` columns, e.g. step: one call for all of a run's steps)."""
    table = table[pd.to_numeric(table["sigma"], errors="coerce").notna()].copy()
    table["sigma"] = table["sigma"].astype(float)
    by = list(by)
    keys = [*by, "matrix", "layer", "group"]
    table = table.sort_values([*keys, "sigma"], ascending=[True] * len(keys) + [False])
    table["index"] = table.groupby(keys).cumcount() + 1
    top = table.groupby(keys)["sigma"].transform("max")
    table = table[top > 0].assign(value=lambda t: t["sigma"] / top[top > 0])
    parts = []
    for matrix, rows in table.groupby("matrix"):
        if matrix in PER_GROUP_MATRICES:
            rows = rows[rows["group"].str.match(r"g\d")]
        elif matrix in LAYER_MATRICES:  # up to the shortest layer spectrum (per `by` value)
            length = rows.groupby([*by, "layer", "group"])["index"].transform("max")
            shortest = length.groupby([rows[column] for column in by]).transform("min") if by else length.min()
            rows = rows[rows["index"] <= shortest]
        else:
            rows = rows[rows["group"].isin(["all", ""])]
        parts.append(rows.groupby([*by, "index"], as_index=False)["value"].mean().assign(matrix=matrix))
    return pd.concat(parts) if parts else pd.DataFrame(columns=[*by, "index", "value", "matrix"])


def _spectra_at_steps(runs: list[Run], steps: list[int] | None) -> tuple[list[int], list[pd.DataFrame]]:
    """The steps drawn (`steps`, or start, middle and end) and each run's normalised spectra at
    its probe step nearest to each of them."""
    available = {str(run.path): spectra_steps(run) for run in runs}
    chosen = sorted(steps) if steps else default_steps(list(available.values()))
    parts = []
    for run in runs:
        have = available[str(run.path)]
        if not have or not chosen:
            continue
        nearest = {s: min(have, key=lambda a, s=s: abs(a - s)) for s in chosen}
        spectra = normalised_spectra(read_spectra(run, sorted(set(nearest.values()))), by=("step",))
        for wanted, actual in nearest.items():
            spectrum = spectra[spectra["step"] == actual].drop(columns="step")
            parts.append(
                spectrum.assign(step=wanted, group_size=run.group_size, variant=run.variant)
            )
    return chosen, parts


def spectra_figure(runs: list[Run], steps: list[int] | None, styles: Styles, title: str) -> Figure:
    chosen, parts = _spectra_at_steps(runs, steps)
    if not parts or all(p.empty for p in parts):
        return empty_figure(f"{title}: singular-value spectra", "no spectra.parquet data")
    data = (
        pd.concat(parts)
        .groupby(["variant", "matrix", "group_size", "step", "index"], as_index=False)["value"]
        .mean()
    )
    matrices, variants = ordered_matrices(data["matrix"].unique()), styles.variants
    panels = [(m, v) for m in matrices for v in variants]
    cols = len(variants) if len(variants) > 1 else min(3, len(matrices))
    grid = new_figure(-(-len(panels) // cols), cols, width=4.6, height=3.0)
    flat = [ax for row in grid.axes for ax in row]
    for ax in flat[len(panels) :]:
        ax.set_visible(False)
    for ax, (matrix, variant) in zip(flat, panels, strict=False):
        panel = data[(data["matrix"] == matrix) & (data["variant"] == variant)]
        if panel.empty:
            no_data(ax)
            continue
        _spectra_panel(ax, panel, chosen)
        note = SPECTRUM_NOTES.get(matrix, "whole matrix")
        ax.set_title(
            f"{matrix} ({note})" + (f"\n{variant}" if len(variants) > 1 else ""), fontsize=9
        )
    handles = styles.legend_handles(data["group_size"].unique(), variants=False)
    handles += [
        Line2D([], [], color="0.3", ls=STEP_STYLES[i % len(STEP_STYLES)], label=f"step {s}")
        for i, s in enumerate(chosen)
    ]
    return grid.finish(
        f"{title}: normalised singular-value spectra sigma_k / sigma_1 (mean over "
        "seeds; per-group matrices: mean over groups; layer/update: mean over "
        f"layers, cut to the shortest layer; floored at {SPECTRUM_FLOOR:g})",
        handles,
    )


def _spectra_panel(ax, panel: pd.DataFrame, chosen: list[int]) -> None:
    """One matrix's spectra: a curve per R (colour) and step (line style), log axes."""
    for (size, step), curve in panel.groupby(["group_size", "step"]):
        style = STEP_STYLES[chosen.index(step) % len(STEP_STYLES)]
        ax.plot(curve["index"], curve["value"].clip(lower=SPECTRUM_FLOOR), color=r_color(size),
                ls=style, lw=1.4, marker="." if len(curve) <= 16 else None)
    ax.set_yscale("log")
    lowest = panel["value"].clip(lower=SPECTRUM_FLOOR).min()
    ax.set_ylim(max(SPECTRUM_FLOOR / 2, lowest / 3), 2)
    if panel["index"].max() > 64:
        ax.set_xscale("log")
    else:
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("singular-value index k")
    ax.set_ylabel("sigma_k / sigma_1")
    ax.grid(alpha=0.3)


def matrix_measure_panels(
    matrices: list[str], measures: list[str], width: float, height: float, xlabel: str
) -> tuple[Grid, list[tuple]]:
    """A panel per matrix x measure: rows x columns, or a 3-column grid for a single measure.

    Returns the grid and (ax, matrix, measure) per panel, with titles and axis labels set.
    """
    if len(measures) == 1:
        cols = min(3, len(matrices))
        grid = new_figure(-(-len(matrices) // cols), cols, width=width + 0.4, height=height)
        flat = [ax for row in grid.axes for ax in row]
        for ax in flat[len(matrices) :]:
            ax.set_visible(False)
        label = MEASURE_LABELS.get(measures[0], measures[0])
        panels = []
        for index, (ax, matrix) in enumerate(zip(flat, matrices, strict=False)):
            ax.set_title(matrix, fontsize=10)
            ax.set_xlabel(xlabel)
            if index % cols == 0:
                ax.set_ylabel(f"effective rank\n({label})")
            panels.append((ax, matrix, measures[0]))
        return grid, panels
    grid = new_figure(len(matrices), len(measures), width=width, height=height)
    panels = []
    for i, matrix in enumerate(matrices):
        for j, measure in enumerate(measures):
            ax = grid.axes[i][j]
            if i == 0:
                ax.set_title(MEASURE_LABELS.get(measure, measure), fontsize=9)
            if j == 0:
                ax.set_ylabel(f"{matrix}\neffective rank")
            if i == len(matrices) - 1:
                ax.set_xlabel(xlabel)
            panels.append((ax, matrix, measure))
    return grid, panels


def effective_rank_figure(
    ranks_x: pd.DataFrame,
    alarms: pd.DataFrame,
    measures: list[str],
    styles: Styles,
    title: str,
    xlabel: str,
) -> Figure:
    table = verdict_rows(ranks_x)
    if table.empty:
        return empty_figure(f"{title}: effective rank", "no ranks.csv data")
    data = curves(table, ["matrix", "measure"])
    matrices = ordered_matrices(data["matrix"].unique())
    grid, panels = matrix_measure_panels(matrices, measures, 3.3, 2.8, xlabel)
    for ax, matrix, measure in panels:
        panel = data[(data["matrix"] == matrix) & (data["measure"] == measure)]
        if panel.empty:
            no_data(ax)
            continue
        for (size, variant), curve in panel.groupby(["group_size", "variant"]):
            band(ax, curve, r_color(size), styles.line(variant), styles.label(size, variant))
        ax.axhline(2.0, color="0.5", ls="--", lw=0.8)
        draw_alarms(ax, alarms)
        ax.grid(alpha=0.3)
    handles = styles.legend_handles(data["group_size"].unique(), alarms=not alarms.empty)
    handles.append(Line2D([], [], color="0.5", ls="--", lw=0.8, label="rank 2 (claim)"))
    return grid.finish(
        f"{title}: effective rank (line: mean over seeds, band: min-max; "
        "per-group matrices: mean over groups, layer/update: mean over layers)",
        handles,
    )


def _rank_vs_r_panel(ax, part, points, matched, matrix, measure, variant, styles) -> None:
    """One variant in one panel: mean with its seed-level interval per R (a dotted full-height
    bar where one seed gives no interval), single seeds, matched-progress means."""
    part = part.sort_values("group_size")
    marker = styles.marker(variant)
    ax.plot(part["group_size"], part["mean"], color="0.35", ls=styles.line(variant), lw=1)
    colors = [r_color(r) for r in part["group_size"]]
    low = part["low"] if "low" in part else part["mean"]
    high = part["high"] if "high" in part else part["mean"]
    finite = np.isfinite(low.astype(float)) & np.isfinite(high.astype(float))
    ax.vlines(part["group_size"][finite], low[finite], high[finite],
              colors=[c for c, f in zip(colors, finite, strict=True) if f], lw=2)
    ax.scatter(part["group_size"], part["mean"], c=colors, s=36, zorder=3, marker=marker)
    where = (
        (points["matrix"] == matrix)
        & (points["measure"] == measure)
        & (points["variant"] == variant)
    )
    seeds = points[where]
    ax.scatter(
        seeds["group_size"],
        seeds["value"],
        s=9,
        alpha=0.5,
        c=[r_color(r) for r in seeds["group_size"]],
    )
    if matched.empty:
        return
    hit = matched[
        (matched["matrix"] == matrix)
        & (matched["measure"] == measure)
        & (matched["variant"] == variant)
    ]
    pairs = [(size, value) for values in hit["means"] for size, value in values.items()]
    if pairs:
        ax.scatter(
            [p[0] for p in pairs],
            [p[1] for p in pairs],
            s=60,
            facecolors="none",
            linewidths=1.2,
            edgecolors=[r_color(p[0]) for p in pairs],
            marker=marker,
        )


def rank_vs_r_figure(
    per_run: pd.DataFrame,
    summary: pd.DataFrame,
    matched: pd.DataFrame,
    measures: list[str],
    styles: Styles,
    title: str,
    rules: Rules,
) -> Figure:
    points, means = verdict_rows(per_run), verdict_rows(summary)
    if means.empty:
        return empty_figure(f"{title}: effective rank vs R", "no ranks.csv data")
    matrices = ordered_matrices(means["matrix"].unique())
    grid, panels = matrix_measure_panels(matrices, measures, 3.1, 2.8, "group size R")
    sizes = sorted(int(r) for r in means["group_size"].unique())
    for ax, matrix, measure in panels:
        sel = (means["matrix"] == matrix) & (means["measure"] == measure)
        if not sel.any():
            no_data(ax)
            continue
        ax.axhspan(rules.target - rules.band, rules.target + rules.band, color="0.9")
        ax.axhline(rules.target, color="k", ls="--", lw=1)
        capped = capped_group_sizes(sizes, rules.target)
        if capped:  # R <= target: a group of R rows has rank <= R
            ax.axvspan(min(sizes) / 1.3, max(capped) * 1.2, color="0.6", alpha=0.15, hatch="//")
        for variant, part in means[sel].groupby("variant"):
            _rank_vs_r_panel(ax, part, points, matched, matrix, measure, variant, styles)
        ax.set_xscale("log", base=2)
        ax.set_xticks(sizes, [str(r) for r in sizes])
        ax.grid(alpha=0.3)
    handles = styles.legend_handles(sizes) + [
        Line2D([], [], color="0.3", marker="o", ls="", label=f"mean, {rules.confidence:.0%} interval"),
        Line2D([], [], color="0.3", marker=".", ls="", alpha=0.5, label="single seed"),
        Line2D([], [], color="0.3", marker="o", ls="", mfc="none", label="matched progress"),
        Line2D([], [], color="k", ls="--", label=f"rank {rules.target:g} +- {rules.band:g}"),
    ]
    return grid.finish(
        f"{title}: effective rank vs group size R (mean over the last "
        f"{rules.last_fraction:.0%} of probe steps; hatched: R <= {rules.target:g}, capped)",
        handles,
    )


def composition_figure(
    table: pd.DataFrame, measures: list[str], styles: Styles, title: str, rank_rtol: float = 1e-6
) -> Figure:
    if table.empty:
        return empty_figure(
            f"{title}: rollout_group rank vs group composition",
            "no per-group rollout_group rows with `minority` in ranks.csv",
        )
    variants = sorted(table["variant"].unique())
    present = [m for m in measures if m in set(table["measure"])]
    grid = new_figure(len(variants), len(present), width=3.3, height=3.0)
    jitter = np.random.default_rng(0)
    for i, variant in enumerate(variants):
        for j, measure in enumerate(present):
            ax = grid.axes[i][j]
            panel = table[(table["variant"] == variant) & (table["measure"] == measure)]
            for size, rows in panel.groupby("group_size"):
                rows = rows.sample(min(len(rows), 1500), random_state=0)
                x = rows["minority_frac"] + jitter.uniform(-0.012, 0.012, len(rows))
                ax.scatter(x, rows["measured"], s=8, alpha=0.3, color=r_color(size), lw=0)
                frac, pred = prediction_curve(measure, int(size), rank_rtol)
                ax.plot(frac, pred, color=r_color(size), lw=1.5, marker="D", ms=5, mec="white")
            ax.grid(alpha=0.3)
            ax.set_title(
                MEASURE_LABELS.get(measure, measure)
                + (f"\n{variant}" if len(variants) > 1 else ""),
                fontsize=9,
            )
            ax.set_xlabel("minority fraction m/R")
            if j == 0:
                ax.set_ylabel("effective rank (per group)")
    handles = styles.legend_handles(table["group_size"].unique(), variants=False) + [
        Line2D([], [], color="0.3", marker=".", ls="", label="measured (one group)"),
        Line2D([], [], color="0.3", marker="D", mec="white", label="closed form, m=1..R/2"),
    ]
    return grid.finish(
        f"{title}: rollout_group per-group rank vs minority fraction m/R, with "
        "the closed-form composition prediction (singular values M, m times, and "
        "m, M times)",
        handles,
    )
