"""Shared figure style: one fixed colour per group size R in every figure, one line style per
variant, alarm markers, and "no data" panels. Figures are built with `matplotlib.figure.Figure`
(Agg canvas, no pyplot state), so plotting never depends on a display or a global backend.
"""

from __future__ import annotations

import textwrap
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.lines import Line2D

R_COLORS = {
    1: "tab:gray",
    2: "tab:blue",
    4: "tab:orange",
    8: "tab:green",
    16: "tab:red",
    32: "tab:purple",
    64: "tab:brown",
}
_SPARE_COLORS = ("tab:pink", "tab:olive", "tab:cyan", "black")
VARIANT_STYLES = ("-", "--", "-.", ":")
VARIANT_MARKERS = ("o", "s", "^", "D", "v", "P")
DPI = 100


def r_color(group_size: int) -> str:
    """Fixed colour of a group size: R=2,4,8,16 are tab10 blue, orange, green, red everywhere."""
    return R_COLORS.get(int(group_size), _SPARE_COLORS[int(group_size) % len(_SPARE_COLORS)])


class Styles:
    """Line style and marker per variant, fixed for the whole analysis."""

    def __init__(self, variants: list[str]):
        self.variants = sorted(set(variants))

    def line(self, variant: str) -> str:
        return VARIANT_STYLES[self.variants.index(variant) % len(VARIANT_STYLES)]

    def marker(self, variant: str) -> str:
        return VARIANT_MARKERS[self.variants.index(variant) % len(VARIANT_MARKERS)]

    def label(self, group_size: int, variant: str) -> str:
        return f"R={group_size}" + (f", {variant}" if variant and len(self.variants) > 1 else "")

    def legend_handles(
        self, group_sizes, alarms: bool = False, variants: bool = True
    ) -> list[Line2D]:
        """Colour per R; line style per variant unless variants have their own panels."""
        handles = [
            Line2D([], [], color=r_color(r), lw=2, label=f"R={r}") for r in sorted(group_sizes)
        ]
        if variants and len(self.variants) > 1:
            handles += [
                Line2D([], [], color="0.3", ls=self.line(v), label=v) for v in self.variants
            ]
        if alarms:
            handles.append(
                Line2D([], [], color="0.3", marker="v", ls=":", label="alarm (events.csv)")
            )
        return handles


@dataclass
class Grid:
    """A figure with a grid of panels of fixed size in inches; `finish` adds title and legend.

    Margins are set by hand (not constrained layout, which is several times slower on the
    6 x 7 panel figures), so the figure grows with the number of panels, title lines and legend
    rows and nothing overlaps.
    """

    fig: Figure
    axes: list[list[Axes]]
    width: float  # inches per panel column, spacing included
    height: float  # inches per panel row, spacing included

    def finish(self, title: str, handles: list | None = None) -> Figure:
        rows, cols = len(self.axes), len(self.axes[0])
        fig_w = self.width * cols + MARGIN_LEFT + MARGIN_RIGHT
        lines = textwrap.wrap(title, max(40, int(fig_w * 8.5)))
        handles = handles or []
        ncols = max(1, min(len(handles), int(fig_w // 1.8)))
        legend_rows = -(-len(handles) // ncols) if handles else 0
        title_h = 0.12 + 0.22 * len(lines)
        top = title_h + 0.24 * legend_rows + 0.4
        fig_h = self.height * rows + MARGIN_BOTTOM + top
        self.fig.set_size_inches(fig_w, fig_h)
        self.fig.subplots_adjust(
            left=MARGIN_LEFT / fig_w,
            right=1 - MARGIN_RIGHT / fig_w,
            bottom=MARGIN_BOTTOM / fig_h,
            top=1 - top / fig_h,
            wspace=SPACE_W / (self.width - SPACE_W),
            hspace=SPACE_H / (self.height - SPACE_H),
        )
        self.fig.suptitle("\n".join(lines), y=1 - 0.08 / fig_h, va="top", fontsize=11)
        if handles:
            self.fig.legend(
                handles=handles,
                loc="upper center",
                ncols=ncols,
                fontsize=8,
                frameon=False,
                bbox_to_anchor=(0.5, 1 - title_h / fig_h),
            )
        return self.fig


MARGIN_LEFT, MARGIN_RIGHT, MARGIN_BOTTOM = 0.95, 0.3, 0.7  # inches
SPACE_W, SPACE_H = 0.85, 0.95  # inches between panels: tick labels, axis labels, titles


def new_figure(rows: int, cols: int, width: float = 3.4, height: float = 2.8) -> Grid:
    fig = Figure(figsize=(width * cols + MARGIN_LEFT + MARGIN_RIGHT, height * rows + 1.5))
    return Grid(fig, fig.subplots(rows, cols, squeeze=False).tolist(), width, height)


def no_data(ax: Axes, what: str = "no data") -> None:
    ax.text(0.5, 0.5, what, ha="center", va="center", transform=ax.transAxes, color="0.4")
    ax.set_xticks([])
    ax.set_yticks([])


def empty_figure(title: str, message: str) -> Figure:
    grid = new_figure(1, 1, width=7, height=3)
    no_data(grid.axes[0][0], message)
    return grid.finish(title)


def draw_alarms(ax: Axes, alarms: pd.DataFrame) -> None:
    """Alarms (rows with x, group_size) as dotted vertical lines with a triangle on top."""
    if alarms.empty:
        return
    alarms = alarms.drop_duplicates(["x", "group_size"])
    colors = [r_color(r) for r in alarms["group_size"]]
    where = ax.get_xaxis_transform()  # x in data, y in axes fraction
    ax.vlines(alarms["x"], 0, 1, colors=colors, linestyles=":", lw=0.9, alpha=0.7, transform=where)
    ax.scatter(
        alarms["x"],
        [1.0] * len(alarms),
        c=colors,
        marker="v",
        s=40,
        clip_on=False,
        transform=where,
        zorder=4,
    )


def band(ax: Axes, curve: pd.DataFrame, color: str, style: str, label: str) -> None:
    """A mean line with a shaded min-max band (columns x, mean, lo, hi)."""
    ax.plot(
        curve["x"],
        curve["mean"],
        color=color,
        ls=style,
        lw=1.6,
        label=label,
        marker="." if len(curve) < 12 else None,
    )
    if (curve["hi"] > curve["lo"]).any():
        ax.fill_between(curve["x"], curve["lo"], curve["hi"], color=color, alpha=0.18, lw=0)


def save(fig: Figure, path: Path) -> Path:
    fig.savefig(path, dpi=DPI, pil_kwargs={"compress_level": 3})  # faster than the default 6
    return path
