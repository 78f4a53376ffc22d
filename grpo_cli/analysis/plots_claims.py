"""The one figure beside each claim's verdict in report.html (claims 2, 3 and 4).

- claim2: the headline rank against R with its intervals, the band around 2, the rank cap
  (a group of R rows has rank <= R) and the fitted slope over the judged R values.
- claim3: gradient sparsity and the zero-advantage group fraction over training: each R's
  fitted trend (claim 3's slope) with its interval over its mean series.
Every title says the claim's verdict.
- claim4: claim 4's deciding reading: outcome and per-token ranks on claim 2's matrix (same
  rows) and their difference against R, with intervals.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.lines import Line2D

from grpo_cli.analysis.rules import Rules, capped_group_sizes
from grpo_cli.analysis.style import Styles, empty_figure, new_figure, no_data, r_color
from grpo_cli.analysis.tables import curves

CLAIM3_PANELS = {"grad_sparsity": "gradient sparsity",
                 "zero_variance_frac": "zero-advantage groups (fraction)"}


def _interval_lines(ax, rows: pd.DataFrame, style: str, marker: str, label: str) -> None:
    rows = rows.sort_values("group_size")
    ax.plot(rows["group_size"], rows["mean"], color="0.3", ls=style, lw=1, marker=marker,
            label=label)
    low, high = rows["low"].astype(float), rows["high"].astype(float)
    finite = np.isfinite(low) & np.isfinite(high)
    ax.vlines(rows["group_size"][finite], low[finite], high[finite],
              colors=[r_color(r) for r in rows["group_size"][finite]], lw=3, alpha=0.8)
    ax.scatter(rows["group_size"], rows["mean"], c=[r_color(r) for r in rows["group_size"]],
               s=40, zorder=3, marker=marker)


def _r_axis(ax, sizes: list[int]) -> None:
    ax.set_xscale("log", base=2)
    ax.set_xticks(sizes, [str(r) for r in sizes])
    ax.set_xlabel("group size R")
    ax.grid(alpha=0.3)


def claim2_figure(summary: pd.DataFrame, verdicts: pd.DataFrame, variants: list[str],
                  rules: Rules, styles: Styles, title: str, verdict: str) -> Figure:
    sel = summary[(summary["matrix"] == rules.rank_matrix)
                  & (summary["measure"] == rules.rank_measure) & (summary["stat"] == "mean")
                  & summary["variant"].isin(variants)]
    name = f"{rules.rank_matrix} / {rules.rank_measure}"
    if sel.empty:
        return empty_figure(f"{title}: claim 2 {verdict}", f"no {name} ranks")
    grid = new_figure(1, 1, width=5.0, height=3.6)
    ax = grid.axes[0][0]
    sizes = sorted(int(r) for r in sel["group_size"].unique())
    ax.axhspan(rules.target - rules.band, rules.target + rules.band, color="0.9")
    ax.axhline(rules.target, color="k", ls="--", lw=1)
    line = np.array([min(sizes) / 1.2, max(sizes) * 1.2])
    ax.plot(line, line, color="0.5", ls=":", lw=1)  # the cap: rank <= R
    capped = capped_group_sizes(sizes, rules.target)
    if capped:
        ax.axvspan(line[0], max(capped) * 1.2, color="0.6", alpha=0.15, hatch="//")
    for variant, rows in sel.groupby("variant"):
        _interval_lines(ax, rows, styles.line(variant), styles.marker(variant), variant or name)
        v = verdicts[(verdicts["variant"] == variant) & (verdicts["matrix"] == rules.rank_matrix)
                     & (verdicts["measure"] == rules.rank_measure)]
        if len(v) and np.isfinite(v["slope"].iloc[0]):
            judged = [int(r) for r in str(v["judged"].iloc[0]).split(", ")]
            means = rows.set_index("group_size")["mean"]
            x = np.log2(np.array(judged, dtype=float))
            y = np.array([means[r] for r in judged])
            fit = y.mean() + v["slope"].iloc[0] * (x - x.mean())
            ax.plot(judged, fit, color="tab:purple", lw=1.5, alpha=0.7)
    top = float(np.nanmax(sel["high"].replace([np.inf, -np.inf], np.nan).to_list()
                          + sel["mean"].to_list()))
    ax.set_ylim(0, max(top * 1.1, rules.target + 2 * rules.band))
    _r_axis(ax, sizes)
    ax.set_ylabel(f"{rules.rank_measure} (last {rules.last_fraction:.0%})")
    handles = [
        Line2D([], [], color="0.3", marker="o", ls="", label=f"mean, {rules.confidence:.0%} interval"),
        Line2D([], [], color="k", ls="--", label=f"{rules.target:g} +- {rules.band:g}"),
        Line2D([], [], color="0.5", ls=":", label="cap: rank <= R"),
        Line2D([], [], color="tab:purple", label="slope over judged R"),
    ]
    return grid.finish(f"{title}: claim 2 {verdict}, {name} against R", handles)


def _trend_lines(ax, curve: pd.DataFrame, trend: pd.Series, color: str) -> None:
    """A part's fitted trend (claim 3's table: the mean per-seed slope per 100 steps and its
    interval) through the centre of its mean series, the interval as a fan about it."""
    x = curve["x"].to_numpy(float)
    centre_x, centre_y = x.mean(), curve["mean"].to_numpy(float).mean()
    span = np.array([x.min(), x.max()])
    def line(slope):
        return centre_y + slope / 100 * (span - centre_x)
    ax.plot(span, line(trend["slope per 100"]), color=color, lw=2.2)
    if np.isfinite(trend["slope per 100 low"]) and np.isfinite(trend["slope per 100 high"]):
        low, high = line(trend["slope per 100 low"]), line(trend["slope per 100 high"])
        ax.fill_between(span, np.minimum(low, high), np.maximum(low, high), color=color,
                        alpha=0.2, lw=0)


def claim3_figure(metrics_x: pd.DataFrame, trends: pd.DataFrame, styles: Styles, title: str,
                  verdict: str) -> Figure:
    """`metrics_x`: CLAIM3_PANELS and grad_norm rows; sparsity at a zero gradient (every group
    had equal rewards: fully sparse by definition) is left out, as in the claim's test.
    `trends`: claim 3's table (one row per variant label x measure x R with its slope); each
    R's fitted trend is drawn with its interval over its mean series (thin)."""
    zero = metrics_x.loc[(metrics_x["metric"] == "grad_norm") & (metrics_x["value"] == 0),
                         ["run_id", "step"]]
    if len(zero):
        keyed = metrics_x.set_index(["run_id", "step"]).index
        drop = keyed.isin(pd.MultiIndex.from_frame(zero)) & (metrics_x["metric"] != "zero_variance_frac")
        metrics_x = metrics_x[~drop]
    metrics_x = metrics_x[metrics_x["metric"].isin(CLAIM3_PANELS)]
    if metrics_x.empty:
        return empty_figure(f"{title}: claim 3 {verdict}", "no grad_sparsity or zero_variance_frac")
    grid = new_figure(1, len(CLAIM3_PANELS), width=3.8, height=3.0)
    has_trends = not trends.empty and "slope per 100" in trends
    for ax, (metric, label) in zip(grid.axes[0], CLAIM3_PANELS.items(), strict=True):
        rows = metrics_x[metrics_x["metric"] == metric]
        if rows.empty:
            no_data(ax)
            continue
        for (size, variant), curve in curves(rows, []).groupby(["group_size", "variant"]):
            color = r_color(size)
            ax.plot(curve["x"], curve["mean"], color=color, ls=styles.line(variant), lw=0.7,
                    alpha=0.45, label=styles.label(size, variant))
            match = (trends[(trends["measure"] == metric) & (trends["R"] == size)
                            & ((trends["variant"] == variant) | (variant == ""))]
                     if has_trends else trends)
            if len(match) and len(curve) > 1:
                _trend_lines(ax, curve, match.iloc[0], color)
        ax.set_title(label, fontsize=9)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
    sizes = metrics_x["group_size"].unique()
    return grid.finish(f"{title}: claim 3 {verdict}: each R's fitted trend (mean per-seed slope, "
                       "shaded: its interval) over its mean series (thin)",
                       styles.legend_handles(sizes))


def claim4_figure(table: pd.DataFrame, rules: Rules, styles: Styles, title: str,
                  verdict: str = "") -> Figure:
    """Claim 4's deciding reading (its table, analysis/falsifier.py): per pair, the outcome and
    per-token ranks against R with their intervals (left) and their difference (right), beside
    the thresholds target + margin and margin."""
    name = f"{rules.rank_matrix} / {rules.rank_measure}, same rows"
    needed = {"difference", "difference low", "per-token rank"}
    rows = table[table["difference"].notna()] if needed <= set(table.columns) else table[:0]
    if rows.empty:
        return empty_figure(f"{title}: claim 4 {verdict}".rstrip(), f"no judged {name} pair of an outcome and a "
                            "per-token estimator")
    grid = new_figure(1, 2, width=4.6, height=3.6)
    ranks, differences = grid.axes[0]
    ranks.axhline(rules.target + rules.margin, color="k", ls="--", lw=1)
    differences.axhline(rules.margin, color="k", ls="--", lw=1)
    differences.axhline(0, color="0.5", lw=0.8)
    markers = iter("osD^v<>")
    for (reading, outcome, per_token), pair in rows.groupby(["reading", "outcome", "per-token"]):
        marker, where = next(markers, "o"), reading.split("(")[-1].rstrip(")")
        for column, style, label in (("outcome rank", ":", outcome), ("per-token rank", "-",
                                                                      per_token)):
            _interval_lines(ranks, pair.rename(columns={
                "R": "group_size", column: "mean", f"{column} low": "low",
                f"{column} high": "high"}), style, marker, f"{label} ({where})")
        _interval_lines(differences, pair.rename(columns={
            "R": "group_size", "difference": "mean", "difference low": "low",
            "difference high": "high"}), styles.line(per_token), marker,
            f"{per_token} - {outcome} ({where})")
    sizes = sorted(int(r) for r in rows["R"].unique())
    for ax, ylabel in ((ranks, f"{rules.rank_measure} (last {rules.last_fraction:.0%})"),
                       (differences, "per-token minus outcome")):
        _r_axis(ax, sizes)
        ax.set_ylabel(ylabel)
        ax.legend(fontsize=6)
    handles = [Line2D([], [], color="k", ls="--", label=f"{rules.target:g} + {rules.margin:g} "
                      f"(left), {rules.margin:g} (right)")]
    return grid.finish(f"{title}: claim 4 {verdict} on {name}".replace("  ", " "), handles)
