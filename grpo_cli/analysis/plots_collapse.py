"""The mode-collapse figure: the claim-2 rank beside distinct completions and token entropy."""

from __future__ import annotations

import pandas as pd
from matplotlib.figure import Figure
from matplotlib.lines import Line2D

from grpo_cli.analysis.collapse import COLLAPSE_METRICS, PREDICTED
from grpo_cli.analysis.style import Styles, band, empty_figure, new_figure, no_data, r_color
from grpo_cli.analysis.tables import curves

PANELS = {
    "rank": "per-group effective rank",
    "distinct_completions": "distinct completions per informative group",
    "entropy": "token entropy (nats)",
}


def collapse_figure(frame: pd.DataFrame, styles: Styles, title: str, matrix: str, measure: str,
                    target: float) -> Figure:
    """Over probe steps, per R (mean over seeds, band min-max): the `matrix` / `measure` rank
    with the target, each R's cap (a group has at most R independent rows) and the closed form
    over the group's distinct completions (densely dotted, where it applies), distinct
    completions per informative group with R (all distinct), and token entropy. A rank that
    follows distinct completions down is sampling collapse (analysis/collapse.py)."""
    if frame.empty:
        return empty_figure(f"{title}: mode collapse", f"no {matrix} / {measure} probe rows")
    grid = new_figure(1, 3, width=4.6, height=3.4)
    sizes = sorted(int(r) for r in frame["group_size"].unique())
    for ax, (column, ylabel) in zip(grid.axes[0], PANELS.items(), strict=True):
        long = frame.assign(x=frame["step"].astype(float), value=frame[column]).dropna(subset=["value"])
        if long.empty:
            no_data(ax, f"no {column} values" + ("" if column == "rank" else " in metrics.csv"))
            ax.set_title(column, fontsize=10)
            continue
        data = curves(long, [])
        for (size, variant), curve in data.groupby(["group_size", "variant"]):
            band(ax, curve, r_color(size), styles.line(variant), styles.label(size, variant))
        if column in ("rank", "distinct_completions"):
            top = 1.25 * float(data["hi"].max())
            for size in sizes:  # the cap: R rows, R distinct completions (where it is in view)
                if size <= top:
                    ax.axhline(size, color=r_color(size), ls=":", lw=0.9, alpha=0.7)
            ax.set_ylim(0, max(top, target + 0.5))
        if column == "rank":
            ax.axhline(target, color="0.2", ls="--", lw=1.0)
            predicted = frame.assign(x=frame["step"].astype(float), value=frame[PREDICTED])
            predicted = predicted.dropna(subset=["value"])
            for (size, _), curve in (curves(predicted, []).groupby(["group_size", "variant"])
                                     if not predicted.empty else []):
                ax.plot(curve["x"], curve["mean"], color=r_color(size), ls=(0, (1, 1)), lw=1.0)
        ax.set_title(f"{matrix} / {measure}" if column == "rank" else column, fontsize=10)
        ax.set_xlabel("step (probe steps)")
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
    handles = styles.legend_handles(sizes)
    handles += [
        Line2D([], [], color="0.2", ls="--", lw=1.0, label=f"claimed rank {target:g}"),
        Line2D([], [], color="0.3", ls=":", lw=0.9, label="cap: R rows / R distinct completions"),
        Line2D([], [], color="0.3", ls=(0, (1, 1)), lw=1.0,
               label="closed form over distinct completions (pred_distinct)"),
    ]
    assert set(PANELS) - {"rank"} == set(COLLAPSE_METRICS)
    return grid.finish(
        f"{title}: rank beside distinct completions and entropy (mean over seeds, band: min-max); "
        "a rank that falls with distinct completions is sampling collapse, not zero-sum structure",
        handles,
    )
