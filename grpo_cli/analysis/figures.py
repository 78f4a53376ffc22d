"""Every figure of `grpo analyze` in one registry: its file name, its caption, the claim it
sits beside (if any) and the function that draws it from `FigureInputs`, which holds what the
drawing functions read, computed once. Adding a figure is one `FigureSpec` entry; the report
reads the captions and each claim's figure from here."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from grpo_cli.analysis import plots, plots_claims, plots_collapse, plots_training, style
from grpo_cli.analysis.claims import zero_sum_variants
from grpo_cli.analysis.records import AnalysisResult
from grpo_cli.analysis.summary import last_part_means
from grpo_cli.analysis.tables import (
    X_LABELS,
    X_NOTES,
    event_table,
    gradient_table,
    metric_table,
    progress_edges,
    with_x,
)

DYNAMICS_COLUMNS = [
    "grad_sparsity",
    "entropy",
    "zero_variance_frac",
    "expected_zero_variance_frac",
    "expected_zero_variance_frac_batch",
    "kl",
    "groups_all_wrong",
    "groups_all_right",
]


@dataclass(frozen=True)
class FigureInputs:
    """What the figures read: the analysis result (records.AnalysisResult) and the tables
    aligned on its x-axis."""

    result: AnalysisResult
    ranks: pd.DataFrame  # tables.rank_table
    composition: pd.DataFrame  # composition.composition_table
    steps: list[int] | None  # the spectra figure's steps (None: start, middle, end)
    styles: style.Styles
    title: str
    aligned_title: str  # title with the x-axis alignment's note
    xlabel: str
    alarms: pd.DataFrame  # events at their exact progress
    edges: Any  # progress bin edges of the x-axis (None for steps)

    @property
    def runs(self):
        return self.result.analysed

    def aligned(self, frame: pd.DataFrame) -> pd.DataFrame:
        return with_x(frame, self.runs, self.result.align, self.edges)


def figure_inputs(result, ranks: pd.DataFrame, composition: pd.DataFrame,
                  steps: list[int] | None) -> FigureInputs:
    runs, align, title = result.analysed, result.align, result.title
    if any(run.status == "incomplete" for run in runs):
        title = f"{title} (provisional: includes incomplete runs)"
    edges = progress_edges(runs, align, result.progress_bins)
    alarms = with_x(event_table(runs), runs, align, edges)
    alarms["x"] = alarms["progress"]  # alarms sit at their exact progress, not a bin centre
    aligned_title = title
    if align != "step":
        aligned_title = (f"{title} [{X_NOTES[align]}, {result.progress_bins} equal-width bins, "
                         "each run averaged within a bin]")
    return FigureInputs(result=result, ranks=ranks, composition=composition, steps=steps,
                        styles=style.Styles([r.variant for r in runs]), title=title,
                        aligned_title=aligned_title, xlabel=X_LABELS[align], alarms=alarms,
                        edges=edges)


def _claim(f: FigureInputs, number: int):
    """Claim `number` of the result (None: not judged in these results)."""
    return next((c for c in f.result.claims if c.number == number), None)


def _verdict(f: FigureInputs, number: int) -> str:
    claim = _claim(f, number)
    return claim.verdict if claim is not None else "not judged"


def _claim2(f: FigureInputs):
    r = f.result
    return plots_claims.claim2_figure(r.summary, r.verdicts, zero_sum_variants(f.runs), r.rules,
                                      f.styles, f.title, _verdict(f, 2))


def _claim3(f: FigureInputs):
    zero_sum = set(zero_sum_variants(f.runs))
    table = metric_table([r for r in f.runs if r.variant in zero_sum],
                         [*plots_claims.CLAIM3_PANELS, "grad_norm"])
    claim = _claim(f, 3)
    trends = claim.table if claim is not None else pd.DataFrame()
    return plots_claims.claim3_figure(with_x(table, f.runs, "step", None), trends, f.styles,
                                      f.title, _verdict(f, 3))


def _claim4(f: FigureInputs):
    claim = _claim(f, 4)
    table = claim.table if claim is not None else pd.DataFrame()
    return plots_claims.claim4_figure(table, f.result.rules, f.styles, f.title, _verdict(f, 4))


def _rank_vs_r(f: FigureInputs):
    r = f.result
    return plots.rank_vs_r_figure(last_part_means(f.ranks, r.last_fraction), r.summary, r.matched,
                                  r.measures, f.styles, f.title, r.rules)


def _gradients(f: FigureInputs):
    table = gradient_table(f.runs, list(plots_training.GRADIENT_COLUMNS))
    return plots_training.gradients_figure(f.aligned(table), f.styles, f.aligned_title, f.xlabel)


def _collapse(f: FigureInputs):
    rules = f.result.rules
    return plots_collapse.collapse_figure(f.result.collapse, f.styles, f.title, rules.rank_matrix,
                                          rules.rank_measure, rules.target)


@dataclass(frozen=True)
class FigureSpec:
    name: str  # the file <name>.png and the report's key
    caption: str
    claim: int | None  # the claim whose verdict it sits beside
    draw: Callable[[FigureInputs], Any]  # -> a matplotlib Figure


REGISTRY: tuple[FigureSpec, ...] = (
    FigureSpec(
        "claim2",
        "Claim 2: the headline rank against R with its seed-level intervals (bars), the band "
        "around 2 (grey), the cap rank <= R (dotted; hatched: R <= 2, forced) and the slope "
        "fitted over the judged R values.",
        2, _claim2),
    FigureSpec(
        "claim3",
        "Claim 3: gradient sparsity (probe steps) and the zero-advantage group fraction (every "
        "step) over training: each R's fitted trend (the mean per-seed slope the verdict tests, "
        "shaded: its interval) over its mean series over seeds (thin).",
        3, _claim3),
    FigureSpec(
        "claim4",
        "Claim 4's deciding reading: outcome and per-token ranks on claim 2's matrix with the "
        "same rows (informative groups; multi-step problems where recorded) against R, and their "
        "difference (last part of training, seed-level intervals; dashed: the thresholds).",
        4, _claim4),
    FigureSpec(
        "spectra",
        "Normalised singular values sigma_k/sigma_1 per matrix at the start, middle and end of "
        "training (or --steps), one colour per R, one line style per step.",
        None, lambda f: plots.spectra_figure(f.runs, f.steps, f.styles, f.title)),
    FigureSpec(
        "effective_rank",
        "Effective rank over training per matrix and measure; band = min-max over seeds; "
        "triangles = training-health alarms (events.csv).",
        None, lambda f: plots.effective_rank_figure(f.aligned(f.ranks), f.alarms, f.result.measures,
                                                    f.styles, f.aligned_title, f.xlabel)),
    FigureSpec(
        "rank_vs_R",
        "Effective rank (mean over the last part of training) against R, with its seed-level "
        "interval (bar); dashed line at 2, grey band = the rule's band; hatched = R <= 2, where a "
        "group's rank is capped at R; hollow markers = matched-progress means.",
        None, _rank_vs_r),
    FigureSpec(
        "accuracy",
        "Held-out accuracy (eval.csv) and training reward (metrics.csv) over training.",
        None, lambda f: plots_training.accuracy_figure(f.runs, f.styles, f.title)),
    FigureSpec(
        "dynamics",
        "Gradient sparsity, token entropy, zero-variance group fraction (dashed: expected, mean "
        "over prompts of p_b^R + (1-p_b)^R with p_b a running per-problem estimate; dotted: "
        "p^R + (1-p)^R at the batch success rate, a lower bound), KL, and the shares of all-wrong "
        "and all-right groups (the rest are mixed), with alarms.",
        None, lambda f: plots_training.dynamics_figure(
            f.aligned(metric_table(f.runs, DYNAMICS_COLUMNS)), f.alarms, f.styles, f.aligned_title,
            f.xlabel)),
    FigureSpec(
        "gradients",
        "Gradient statistics from the per-rollout Gram on probe steps: per-rollout norms "
        "(median, coefficient of variation), the batch gradient's norm sqrt(1'K1) (dashed: the "
        "trainer's own over the probed parameters; x: steps where they disagree beyond "
        "round-off), the SNR and McCandlish et al.'s noise scale per rollout and per prompt.",
        None, _gradients),
    FigureSpec(
        "composition",
        "rollout_group per-group rank against the minority fraction m/R, with the closed-form "
        "prediction for m = 1..R/2.",
        None, lambda f: plots.composition_figure(f.composition, f.result.measures, f.styles,
                                                 f.title)),
    FigureSpec(
        "collapse",
        "The claim-2 rank over probe steps beside distinct completions per informative group and "
        "token entropy, per R; dotted: each R's cap (R rows, R distinct completions), densely "
        "dotted: the closed form over each group's distinct completions, dashed: the claimed "
        "rank 2.",
        None, _collapse),
)
CAPTIONS = {spec.name: spec.caption for spec in REGISTRY}


def figure_of_claim(number: int) -> str | None:
    """The figure beside claim `number`'s verdict (None: none)."""
    return next((spec.name for spec in REGISTRY if spec.claim == number), None)


def draw_figures(inputs: FigureInputs, out_dir: Path) -> dict[str, Path]:
    """Every registered figure, drawn and saved as <out_dir>/<name>.png."""
    return {spec.name: style.save(spec.draw(inputs), out_dir / f"{spec.name}.png")
            for spec in REGISTRY}
