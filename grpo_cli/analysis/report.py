"""What summary.csv, summary.md and report.html say: summary.csv's tidy frame, and the report's
sections as typed blocks (analysis/render.py renders them as Markdown and as HTML, so the two
always say the same thing).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from grpo_cli.analysis import (
    credit_compare,
    headline,
    token_weights,
)
from grpo_cli.analysis.claims import claims_table, zero_sum_variants
from grpo_cli.analysis.figures import figure_of_claim
from grpo_cli.analysis.records import AnalysisResult
from grpo_cli.analysis.render import (
    Block,
    Bullets,
    ClaimBlock,
    Details,
    Fold,
    Heading,
    Headline,
    Link,
    Paragraph,
    Quote,
    Table,
    fmt,
)
from grpo_cli.analysis.rules import Rules
from grpo_cli.analysis.words_frames import (
    matching_sentences,
    same_checkpoint_sentences,
    update_density_sentences,
)
from grpo_cli.analysis.words_over_r import ModeCollapse

SUMMARY_COLUMNS = [
    "kind",
    "claim",
    "variant",
    "matrix",
    "layer",
    "stat",
    "measure",
    "group_size",
    "mean",
    "std",
    "min",
    "max",
    "n_seeds",
    "n_incomplete",
    "n_obs",
    "start_mean",
    "low",
    "high",
    "capped",
    "judged",
    "verdict",
    "verdict_slope_zero",
    "verdict_growth",
    "verdict_level",
    "flip_slope_zero",
    "flip_growth",
    "flip_level",
    "max_deviation",
    "slope",
    "slope_low",
    "slope_high",
    "unit",
    "detail",
]
DETAILS = "details.md"  # the evidence, written beside summary.md
OBJECT_COLUMNS = ["means", "intervals", "parts"]  # kept in memory, not written to summary.csv


def summary_frame(result: AnalysisResult) -> pd.DataFrame:
    """Every summary row of an AnalysisResult in one tidy table; `kind` says what a row is."""
    parts = []
    if result.claims:
        claims = claims_table(result.claims)
        parts.append(
            claims.drop(columns=["parts"]).assign(
                kind="claim", detail=claims["statement"] + " " + claims["evidence"])
        )
    parts.append(result.summary.assign(kind="rank"))
    for kind, table in (("verdict", result.verdicts), ("verdict_matched", result.matched)):
        if not table.empty:
            parts.append(
                table.drop(columns=[c for c in OBJECT_COLUMNS if c in table])
                .assign(words=[w.sentence() for w in table["words"]])
                .rename(columns={"words": "detail", "reading": "verdict"})
                .assign(kind=kind)
            )
    if not result.composition.empty:
        parts.append(_composition_rows(result.composition))
    if not result.accuracy.empty:
        parts += _accuracy_rows(result.accuracy)
    frame = pd.concat([p for p in parts if not p.empty], ignore_index=True)
    frame = frame.reindex(columns=SUMMARY_COLUMNS)
    verdict_rows = frame["kind"] == "verdict"  # a verdict's unit is its variant's (units.py)
    words = {variant: unit.words for variant, unit in result.units.items()}
    frame.loc[verdict_rows, "unit"] = frame.loc[verdict_rows, "variant"].map(words)
    for column in ("claim", "group_size", "n_seeds", "n_incomplete", "n_obs"):
        frame[column] = frame[column].astype("Int64")
    for key, label in result.variant_columns.items():  # one column per differing key
        frame.insert(
            2, label, frame["variant"].map(lambda v, k=key: result.variant_values.get(v, {}).get(k))
        )
    return frame


def _composition_rows(comp: pd.DataFrame) -> pd.DataFrame:
    """summary.csv's `composition` rows: mean |measured - predicted| per variant, R and measure."""
    return (
        comp.rename(columns={"mean_abs_departure": "mean", "n_groups": "n_obs"})
        .assign(
            kind="composition",
            matrix="rollout_group",
            layer="",
            stat="per group",
            detail=[
                f"mean |measured - pred_{r.measure}|; measured {r.mean_measured:.3f}, "
                f"predicted {r.mean_predicted:.3f}, predicted over distinct completions "
                f"{r.mean_predicted_distinct:.3f} (mean distinct {r.mean_distinct:.2f})"
                for r in comp.itertuples(index=False)
            ],
        )
        .drop(columns=[c for c in comp.columns
                       if c.startswith(("mean_", "gap_")) and c != "mean_abs_departure"])
    )


def _accuracy_rows(acc: pd.DataFrame) -> list[pd.DataFrame]:
    """summary.csv's `accuracy` rows: held-out accuracy, then the training reward."""
    return [
        acc.rename(columns={"final_mean": "mean", "final_std": "std"})
        .assign(
            kind="accuracy",
            measure="heldout_accuracy",
            detail="held-out accuracy at the last eval (start_mean: at the first eval)",
        )
        .drop(columns=["final_reward_mean"]),
        acc.rename(columns={"final_reward_mean": "mean"})[
            ["variant", "group_size", "mean", "n_seeds", "n_incomplete"]
        ].assign(
            kind="accuracy",
            measure="training_reward",
            detail="reward_mean, rolling mean at the last step",
        ),
    ]


def _cell(lookup: dict, key: tuple, size: int) -> str:
    row = lookup.get(key + (size,))
    if row is None:
        return "-"
    low, high = row.get("low", np.nan), row.get("high", np.nan)
    if pd.notna(low) and np.isfinite(low) and np.isfinite(high):
        spread = f" [{low:.2f}, {high:.2f}]"
    else:
        spread = f" +- {row['std']:.2f}" if row["n_seeds"] > 1 else ""
    mark = "*" if row["n_incomplete"] else ""
    cap = " capped" if row.get("capped") is True else ""
    return f"{row['mean']:.2f}{spread} (n={row['n_seeds']}{mark}){cap}"


def verdict_table(result: AnalysisResult, verdicts: pd.DataFrame,
                  stat: str | None = None) -> pd.DataFrame:
    """variant, matrix, measure, one "mean [interval] (n)" column per R, slope, verdicts."""
    summary = result.summary
    sizes = sorted(int(r) for r in summary["group_size"].unique())
    lookup = {
        (r.variant, r.matrix, r.layer, r.stat, r.measure, int(r.group_size)): r._asdict()
        for r in summary.itertuples(index=False)
    }
    rows = []
    for v in verdicts.itertuples(index=False):
        key = (v.variant, v.matrix, v.layer, stat or v.stat, v.measure)
        row = {"variant": v.variant, "matrix": v.matrix, "measure": v.measure}
        row |= {f"R={r}": _cell(lookup, key, r) for r in sizes}
        if stat is None:
            slope = fmt(v.slope)
            if np.isfinite(v.slope_low) and np.isfinite(v.slope_high):
                slope = f"{v.slope:+.2f} [{v.slope_low:+.2f}, {v.slope_high:+.2f}]"
            row |= {
                "judged R": v.judged,
                "slope / doubling": slope,
                "2a slope = 0": v.verdict_slope_zero,
                "2b growth small": v.verdict_growth,
                "2c ~2": v.verdict_level,
                "verdict": v.verdict,
            }
            unit = result.units.get(v.variant)
            row["unit"] = unit.words if unit else "-"
        rows.append(row)
    table = pd.DataFrame(rows)
    if not table.empty and table["variant"].eq("").all():
        table = table.drop(columns=["variant"])
    return table


def matched_table(matched: pd.DataFrame) -> pd.DataFrame:
    """Matched-progress point readings with one column of matched means per R."""
    if matched.empty:
        return matched
    sizes = sorted({int(r) for means in matched["means"] for r in means})
    per_r = pd.DataFrame(
        [{f"R={r}": means.get(r, np.nan) for r in sizes} for means in matched["means"]],
        index=matched.index,
    )
    columns = ["variant", "matrix", "measure"]
    return pd.concat(
        [matched[columns], per_r, matched[["slope", "max_deviation", "common_bins", "reading"]]],
        axis=1,
    )


def run_table(runs) -> pd.DataFrame:
    return pd.DataFrame(
        [
            {
                "run": run.name,
                "status": run.status,
                "R": run.group_size,
                "variant": run.variant,
                "seed": run.seed,
                "last step": run.last_step,
                "stopped by": run.info.get("stopped_by") or "",
                "error / problems": "; ".join(filter(None, [run.error or "", *run.problems])),
            }
            for run in runs
        ]
    )


def composition_sentences(comp: pd.DataFrame, measure: str = "erank_entropy") -> list[str]:
    """Per variant x R, the composition gap in words for one measure."""
    rows = comp[(comp["measure"] == measure) & comp["mean_predicted_distinct"].notna()]
    return [
        f"{r.variant + ', ' if r.variant else ''}R={r.group_size}, {measure}: the composition "
        f"predicts {r.mean_predicted:.2f}; over the distinct completions ({r.mean_distinct:.2f} "
        f"of {r.group_size} per group on average) {r.mean_predicted_distinct:.2f}, so "
        f"duplicates take away {r.gap_duplicates:.2f}; measured {r.mean_measured:.2f}, so "
        f"correlated score vectors take away {r.gap_rest:.2f} more."
        for r in rows.itertuples(index=False)
    ]


VERDICT_LEGEND = (
    "Verdicts: supported (the whole interval lies inside the rule's region), contradicted (the "
    "whole interval lies outside), inconclusive (it straddles a boundary), mixed (the data "
    "decide, but not one way: some parts or variants are supported and others contradicted, "
    "e.g. a rank flat in R but not ~2), not judged (too little data: one seed, one R, no R "
    "beyond the cap; the sentence says what is missing), not measured (no run the rule can "
    "use). Each part's sentence names what decided it, how often it flips (the share of draws "
    "of the estimate's sampling distribution read the other way) and, if inconclusive, roughly "
    "how many seeds would settle it."
)


SHORT_LEGEND = (
    "supported / contradicted: the whole interval lies inside / outside the rule's region; "
    "inconclusive: it straddles a boundary; mixed: parts read both ways; not judged: too little "
    "data. Every part, rule and table: details.md (report.html: the folded sections below)."
)


def claim_sentences(result: AnalysisResult) -> dict[int, str]:
    """claim number -> the one sentence that says what decided it (analysis/headline.py)."""
    return headline.headlines(result.claims, result.verdicts, result.token_weights, result.rules,
                              zero_sum_variants(result.analysed))


def _claim_heading(claim) -> str:
    conditional = f"; {claim.unit.clause}" if claim.unit and claim.unit.conditional else ""
    return (f"Claim {claim.number}: {claim.statement} Verdict: {claim.verdict}"
            + (f" ({claim.parts_text}{conditional})" if claim.parts_text
               else (f" ({claim.unit.clause})" if conditional else "")))


def claim_blocks(result: AnalysisResult) -> list[Block]:
    """The answer: the four verdicts, one sentence each on what decided it, each beside the one
    figure that shows it."""
    if not result.claims:
        return []
    sentences = claim_sentences(result)
    layer = headline.layer_beside_headline(result.verdicts, result.rules,
                                           zero_sum_variants(result.analysed))
    out: list[Block] = [
        Heading("The paper's four claims"),
        Table(claims_table(result.claims)[["claim", "statement", "verdict", "parts", "unit"]]),
        Paragraph(SHORT_LEGEND),
    ]
    for c in result.claims:
        out.append(Headline(_claim_heading(c), sentences[c.number], figure_of_claim(c.number)))
        if c.number == 2 and layer:  # the matrix the paper's words most plausibly name (2w)
            out.append(Paragraph(layer))
    return out


def claim_detail_blocks(result: AnalysisResult) -> list[Block]:
    """The evidence behind each verdict: every part's sentence, the rule, the table."""
    if not result.claims:
        return []
    out: list[Block] = [Heading("The four claims: every part, rule and table"),
                        Paragraph(VERDICT_LEGEND)]
    for claim in result.claims:
        sentences = [p.sentence for p in claim.parts] or [claim.evidence]
        if claim.unit is not None:
            sentences.append(claim.unit.sentence())
        out.append(ClaimBlock(heading=_claim_heading(claim), figure=None, sentences=sentences,
                              rule=claim.rule, table=claim.table))
    return out


def credit_comparison_blocks(table: pd.DataFrame, measure: str) -> list[Block]:
    """Claim 4 on every matrix, on the same rows (analysis/credit_compare.py), for `measure`
    and its per-non-zero-row reading; every measure is in credit_comparison.csv."""
    if table.empty:
        return []
    table = table[table["measure"].isin([measure, measure + credit_compare.PER_ROW])]
    return [
        Heading("Claim 4 on claim 2's matrices: outcome rank and slope beside the per-token "
               "difference", 3),
        Paragraph("Per matrix and measure: the outcome estimator's rank per R (last-part mean, mean "
              "over seeds) and its slope per doubling of R (uncapped R), beside the per-token "
              "estimator's rank and the difference (per-token minus outcome) on the same matrix. "
              "Per-group matrices use informative groups only for every estimator (column "
              "'rows'), and of those the problems with at least two checked steps, on both "
              "sides and for every estimator alike: claim 4's verdict is read on these rows of "
              "claim 2's matrix. Batch matrices are also read per non-zero row (a learned "
              "critic gives zero-variance groups non-zero rows); they are claim 4's side reading. "
              "Each per-token estimator is its own row. `grpo probe CHECKPOINT algorithm.name=process` "
              "beside a grpo probe of the same checkpoint gives the very same rollouts, which "
              "claim 4 compares group by group. Every measure: credit_comparison.csv."),
        Table(table),
    ]


def data_problem_blocks(runs) -> list[Block]:
    """A "Data problems" section: runs whose files contradict themselves (left out of all)."""
    lines = [f"{run.name}: {problem}" for run in runs for problem in run.contradictions]
    if not lines:
        return []
    return [
        Heading("Data problems"),
        Paragraph("These runs' files contradict themselves (two writers, or files edited by hand); "
              "they are left out of every average, verdict and figure. Re-run them into a fresh "
              "results_dir."),
        Bullets(lines),
    ]


def blocks(result: AnalysisResult) -> list[Block]:
    """summary.md: the answer (the verdicts, one sentence each, the claims' figures), then any
    collapse warning and data problem; every other section is in `sections`."""
    return [
        Heading(f"{result.title}: does effective rank stay ~2 as group size R grows?", 1),
        *claim_blocks(result),
        *[Paragraph(f"WARNING: {warning.sentence()}") for warning in result.collapse_warnings],
        *data_problem_blocks(result.runs),
        Link("The evidence (every part, rule and table)", DETAILS),
    ]


def detail_blocks(result: AnalysisResult) -> list[Block]:
    """The evidence, section by section (a level-2 heading opens each)."""
    return [
        *claim_detail_blocks(result),
        *update_geometry_blocks(result.top_energy, result.trajectory),
        *token_weight_blocks(result.token_weights),
        *update_density_blocks(result.update_density),
        *credit_comparison_blocks(result.credit_comparison, result.rules.rank_measure),
        *same_checkpoint_blocks(result.same_checkpoint, result.rules.rank_matrix,
                                result.rules.rank_measure),
        *run_blocks(result),
        *verdict_blocks(result),
        *matched_blocks(result),
        *matching_blocks(result.matching_coverage, result.matching_bins, result.progress_bins),
        Heading("Held-out accuracy"),
        Table(result.accuracy.round(3)),
        *composition_blocks(result.composition),
        *collapse_blocks(result.stages, result.stage_readings, result.collapse_warnings, result.rules),
        *median_blocks(result),
    ]


def sections(result: AnalysisResult) -> list[Fold]:
    """`detail_blocks` cut at each level-2 heading into folds (report.html folds them away)."""
    folds: list[Fold] = []
    for block in detail_blocks(result):
        if isinstance(block, Heading) and block.level == 2:
            folds.append(Fold(block.text, ()))
        elif folds:
            folds[-1] = Fold(folds[-1].title, (*folds[-1].blocks, block))
    return folds


def details_page(result: AnalysisResult) -> list[Block]:
    """details.md: every section of the evidence."""
    return [Heading(f"{result.title}: the evidence behind summary.md", 1), *sections(result)]


def html_page(result: AnalysisResult) -> list[Block]:
    """report.html: the answer, then every section of the evidence folded."""
    return [*[b for b in blocks(result) if not isinstance(b, Link)], *sections(result)]


def run_blocks(result: AnalysisResult) -> list[Block]:
    """The runs: what differs between them, their states, notes, the run table, data problems."""
    counts = pd.Series([r.status for r in result.runs]).value_counts().to_dict()
    incomplete = "included, marked * (provisional)" if result.include_incomplete else "excluded"
    variants = (f" Variants (own curves and verdicts): {', '.join(result.variant_columns.values())}."
                if result.variant_columns else "")
    return [
        Heading("Runs"),
        Paragraph(f"Runs differ in: {result.grouping.describe()}. Replicate axis: seed; "
              "x-axis of the claim: rollout.group_size (R)." + variants),
        Paragraph(f"{len(result.runs)} runs: {counts.get('completed', 0)} completed, "
              f"{counts.get('failed', 0)} failed (excluded from every average), "
              f"{counts.get('incomplete', 0)} incomplete ({incomplete}). "
              f"Figures use align={result.align}."),
        *[Paragraph(f"Note: {note}") for note in result.notes],
        Table(run_table(result.runs)),
    ]


def verdict_blocks(result: AnalysisResult) -> list[Block]:
    """Claim 2's rule, and its verdict per matrix x measure."""
    return [
        Heading("Verdict rule"),
        Quote(result.rules.rank_text()),
        Paragraph("For layer/update the rank is first averaged over layers at each step (per-layer "
              "rows are in summary.csv); for rollout_group/score_group the verdict uses the "
              "group == 'mean' rows (median below)."),
        Heading("Verdicts"),
        Table(verdict_table(result, result.verdicts)),
        Details(f"One sentence per matrix x measure ({len(result.verdicts)})",
                     [w.sentence() for w in result.verdicts["words"]]),
    ]


def matched_blocks(result: AnalysisResult) -> list[Block]:
    """Claim 2's thresholds on point estimates at matched progress."""
    matched = result.matched
    return [
        Heading(f"Point readings at matched progress ({result.matched_progress})"),
        Paragraph(f"Claim 2's thresholds on point estimates, no interval (descriptive only): each R's "
              f"rank is averaged over the {result.matched_progress} bins "
              f"({result.progress_bins} equal-width bins over the pooled range of all runs) that "
              "every R of the variant reaches; 'inside' / 'outside' the rule's region."),
        Table(matched_table(matched)),
        Details(f"One sentence per matrix x measure ({len(matched)})",
                     [w.sentence() for w in matched["words"]] if not matched.empty else []),
    ]


def composition_blocks(composition: pd.DataFrame) -> list[Block]:
    """rollout_group's per-group rank against the closed-form prediction."""
    return [
        Heading("rollout_group vs the composition prediction"),
        Paragraph("Over every informative per-group row (group g<b>) whose advantages fit the closed "
              "form (c (r_i - mean r), binary r: a zero-sum outcome estimator), per R: the "
              "prediction from the composition (R orthonormal rows, singular values M (m times) "
              "and m (M times)), the prediction over distinct completions (sqrt(n_u) |a_u| per "
              "distinct completion u with n_u copies), and the measurement. gap_duplicates = "
              "predicted - predicted over distinct: what duplicate completions (low entropy) take "
              "away; gap_rest = predicted over distinct - measured: what the distinct "
              "completions' correlated score vectors take away."),
        Table(composition.round(3)),
        Bullets(composition_sentences(composition)),
    ]


def median_blocks(result: AnalysisResult) -> list[Block]:
    """The per-group matrices' verdict table read on the median over groups."""
    median = result.verdicts[result.verdicts["stat"] == "mean"]
    if median.empty:
        return []
    return [
        Heading("Per-group matrices: median over groups (last-part mean)"),
        Table(verdict_table(result, median, stat="median")),
    ]


def collapse_blocks(stages: pd.DataFrame, readings: pd.DataFrame, warnings: list[ModeCollapse],
                    rules: Rules) -> list[Block]:
    """Mode collapse beside the rank: warnings, claim 2 per stage, the stage table."""
    if stages.empty:
        return []
    matrix, measure = rules.rank_matrix, rules.rank_measure
    return [
        Heading("Mode collapse beside the rank, and claim 2 per stage"),
        Paragraph(f"Each run's probe steps are split into an early and a late half. Per R: {matrix} / "
              f"{measure} (the claim-2 rank) beside metrics.csv distinct_completions (distinct "
              "completions per informative group: a group has at most that many independent "
              "rows) and entropy at the same steps, means over seeds. A warning is raised when "
              f"the late rank is at most {rules.target:g} + {rules.band:g} and lower than early "
              f"while distinct completions fall by at least {rules.distinct_fall:.0%}. Point "
              "estimates; "
              "the intervals are the whole-run reading's (claims above)."),
        Bullets([w.sentence() for w in warnings] or ["No mode-collapse warning: no R whose rank nears "
                              f"{rules.target:g} while distinct completions fall."]),
        Table(readings),
        Table(stages),
    ]


def matching_blocks(coverage: pd.DataFrame, per_bin: pd.DataFrame, bins: int) -> list[Block]:
    """What matched progress can match (analysis/matching.py)."""
    if coverage.empty:
        return []
    return [
        Heading("What matched progress can match"),
        Paragraph(f"Per progress variable ({bins} equal-width bins over the pooled range of each "
              "variant's probe steps, claim 2's rank): which bins each R reaches, and within "
              "each bin that two or more judged R values share, the rank per R and its slope "
              "per doubling of R."),
        Bullets(matching_sentences(coverage)),
        Table(coverage),
        Table(per_bin),
    ]


def same_checkpoint_blocks(table: pd.DataFrame, matrix: str, measure: str) -> list[Block]:
    """Claim 2 on the same checkpoint (analysis/same_checkpoint.py)."""
    if table.empty:
        return []
    return [
        Heading("Claim 2 on the same checkpoint (grpo probe)", 3),
        Paragraph("These results include `grpo probe` directories: per checkpoint, every R measured "
              "on the same weights and prompts. Claim 2's verdict above reads the training runs "
              "(primary: the paper's claim is about each R's own training); this reading removes "
              "the trajectory, which differs by R (collapse proceeds at its own pace), and is the "
              "check on it: where the two disagree, the difference is the trajectory's. "
              "Intervals are seed-level (per-seed slopes)."),
        Bullets(same_checkpoint_sentences(table, matrix, measure)),
        Table(table),
    ]


def update_density_blocks(table: pd.DataFrame) -> list[Block]:
    """Beside claim 3: the step's update density and head share (analysis/update_density.py)."""
    if table.empty:
        return []
    return [
        Heading("Beside claim 3: how dense each step's update is", 3),
        Paragraph("Descriptive, not in claim 3's verdict. A sparser gradient need not mean a "
                  "sparser update: metrics.csv step_changed_frac is the share of the layer weights "
                  "one optimizer step changed (step_changed_frac_bf16: in a bf16 copy), "
                  "grad_share_head_embedding the output head's and embedding's share of the "
                  "gradient's squared norm. Each run's mean over the first and second half of its "
                  "steps, then the mean over its seeds."),
        Bullets(update_density_sentences(table)),
        Table(table.round(4)),
    ]


def token_weight_blocks(table: pd.DataFrame) -> list[Block]:
    """Claim 1's empirical part (analysis/token_weights.py)."""
    if table.empty:
        return []
    return [
        Heading("Claim 1, empirically: the loss gradient's weight per token", 3),
        Paragraph("The advantages check above is true by construction for outcome estimators (one "
              "scalar broadcast over the tokens). This reading can fail: metrics.csv "
              f"{token_weights.COLUMN}, the fraction of informative rollouts whose effective token weight "
              "d loss / d log pi(y_t) (after clipping, importance ratios, the KL term and token "
              "aggregation, by autograd of the loss) is uniform to a relative 1e-6. With one "
              "pass, no KL and no truncated importance weights it is uniform by the same "
              "construction; num_iterations > 1 (ratios, clipping) or kl_coef > 0 can break it."),
        Bullets([reading.sentence() for reading in token_weights.readings(table)]),
        Table(table),
    ]


def _shown_digits(table: pd.DataFrame, digits: int = 3) -> pd.DataFrame:
    """Shares near 1 need three decimals (render's default shows two)."""
    return table.apply(lambda c: c.map(lambda v: f"{v:.{digits}f}" if pd.notna(v) else "-")
                       if c.dtype.kind == "f" else c)


def update_geometry_blocks(energy: pd.DataFrame, trajectory: pd.DataFrame) -> list[Block]:
    """Beside the claims (analysis/update_geometry.py's tables): the section `grpo analyze`
    writes to details.md / report.html (nothing when neither file has these columns)."""
    if energy.empty and trajectory.empty:
        return []
    out: list[Block] = [Heading("Beside the claims: energy outside the top directions, the update's path")]
    if not energy.empty:
        out += [Heading("Energy in the top-k singular directions (beside claim 2)", 3),
                Paragraph("E_k = sum_{j<=k} sigma_j^2 / sum sigma^2 of each matrix (ranks.csv "
                          "top<k>_energy_share; SALT, arXiv 2606.05800), mean over seeds of each run's "
                          "last probe steps; 1 - E_3 is the energy outside the three dominant "
                          "directions. R orthogonal rows of equal norm give E_k = k/R; one shared "
                          "direction E_1 = 1. Not part of any verdict."),
                Table(_shown_digits(energy))]
    if not trajectory.empty:
        out += [Heading("The update's trajectory over kept checkpoints (beside the update spectra)", 3),
                Paragraph("trajectory.csv (`grpo trajectory RUN`) at each run's last kept step: the "
                          "median over weights of the update's rank-1 share sigma_1^2 / ||W_t - W_0||_F^2 "
                          "(AlphaRL, arXiv 2510.00553), and of the path's rank-1 share and linearity "
                          "over the kept steps (RELEX, arXiv 2605.21468); all_*: the path of every "
                          "weight together. Mean over seeds. Not part of any verdict."),
                Table(_shown_digits(trajectory))]
    return out
