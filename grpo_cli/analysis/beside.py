"""Readings beside claims 2 and 4's verdicts, in words: claim 2's rank at matched diversity (is
its growth with R the distinct completions' or the geometry's? analysis/diversity.py) and the
`layer` gradient (the matrix the paper's words most plausibly point to;
analysis/layer_gradient.py); claim 4's difference per distinct completion. Shown in the claims'
evidence and tables, never in their verdicts.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from grpo_cli.analysis import diversity, layer_gradient
from grpo_cli.analysis.credit_compare import INFORMATIVE
from grpo_cli.analysis.parts import Part
from grpo_cli.analysis.rank_verdict import rng_for
from grpo_cli.analysis.rules import CONTRAST, Rules

GROWTH_SOURCE = {  # diversity.growth_source -> what claim 2's sentence says of it
    diversity.DIVERSITY: "the growth with R is diversity: at equal distinct completions the rank "
                         "does not grow beyond +{tol:g} per doubling, so the raw slope measures "
                         "how many distinct completions each R samples from this policy (its "
                         "entropy), not GRPO's geometry",
    diversity.GEOMETRY: "the growth with R is geometry: the rank grows beyond +{tol:g} per "
                        "doubling at equal distinct completions too",
    diversity.NO_GROWTH: "there is no growth beyond +{tol:g} per doubling to explain",
    diversity.UNDECIDED: "which of the two moves with R is undecided (an interval straddles "
                         "+{tol:g}, or there is none)",
}
LAYER_WHY = (
    "Which matrix the paper's words point to: 'an SVD of GRPO gradients' on a 4B model most "
    "plausibly means this weight-shaped per-layer gradient, the batch gradient of a weight as "
    "the training loop holds it (d_out x d_in, what low-rank-gradient methods decompose); the "
    "per-rollout R x P matrix over ~4e9 parameters needs R separate whole-model gradients per "
    "group, which no training loop forms. Claim 2's verdict reads rollout_group, the matrix of "
    "the paper's zero-sum argument; the layer reading is shown beside it, not in the verdict."
)


@dataclass(frozen=True)
class Beside:
    """What claim 2 shows beside its verdict."""

    parts: tuple[Part, ...]  # "2m" per variant, then "2w"
    columns: dict  # variant -> its table columns at matched diversity
    layer_rows: tuple[dict, ...]  # rows of the claim's table, one per layer reading


def _r_list(sizes) -> str:
    return ", ".join(f"R={r}" for r in sizes)


def matched_diversity(variant: str, label: str, groups: pd.DataFrame, rules: Rules
                      ) -> tuple[Part | None, dict]:
    """One variant's reading at matched diversity: its sentence as a part (None where it cannot
    be read: fewer than two judged R) and its columns of the claim's table."""
    rows = diversity.window(groups[(groups["variant"] == variant)
                                   & (groups["stat"] == INFORMATIVE)], rules)
    slopes = diversity.slope_readings(rows, rules, rng_for(rules, variant, "matched diversity"))
    if slopes is None:
        return None, {}
    share = diversity.closed_form_share(rows, rules, rng_for(rules, variant, "closed form"))
    source = diversity.growth_source(slopes.raw, slopes.matched, rules)
    per_run = rows.groupby(["group_size", "run_id"])["distinct"].mean()
    distinct = {int(r): m for r, m in per_run.groupby(level="group_size").mean().items()}
    judged = slopes.judged
    shares = "" if share is None else (
        "; the rank is " + " / ".join(iv.text(3) for r, iv in share.per_r if r in judged)
        + " of the orthogonal closed form at its composition and distinct completions at "
        + "/".join(f"R={r}" for r, _ in share.per_r if r in judged)
        + (f" (slope {share.slope.text(3, sign=True)} per doubling)" if share.slope else ""))
    first = diversity.slope_readings(
        diversity.early(groups[(groups["variant"] == variant) & (groups["stat"] == INFORMATIVE)]),
        rules, rng_for(rules, variant, "matched diversity", "early"))
    earlier = "" if first is None else (
        f"; early in training (each run's first half of probe steps) "
        f"{first.raw.text(2, sign=True)} without control and {first.matched.text(2, sign=True)} "
        "with it")
    sentence = (
        f"At matched diversity ({label}, {rules.rank_matrix} / {rules.rank_measure}, "
        f"{INFORMATIVE}, claim 2's window; descriptive, not in the verdict): a group's rank per "
        f"doubling of R is {slopes.raw.text(2, sign=True)} without control and "
        f"{slopes.matched.text(2, sign=True)} with its distinct completions as categories "
        f"(per-{slopes.units[:-1]} regressions over {_r_list(judged)}; distinct completions per "
        "group " + " / ".join(f"{distinct[r]:.2f}" for r in judged) + f"){shares}{earlier}: "
        + GROWTH_SOURCE[source].format(tol=rules.growth_tolerance) + ".")
    columns = {"slope at matched diversity": slopes.matched.text(2, sign=True),
               "early: at matched diversity": "-" if first is None else first.matched.text(2, True),
               "share of closed form": "-" if share is None else ", ".join(
                   f"R={r}: {iv.text(3)}" for r, iv in share.per_r),
               "growth is": source}
    return Part("2m", "does the rank grow with R at matched diversity?", CONTRAST, sentence), columns


def same_weights(groups: pd.DataFrame, probes: dict[str, str], labels: dict[str, str],
                 rules: Rules) -> list[Part]:
    """Claim 2 at matched diversity on `grpo probe` directories (`probes`: run id -> probed
    source): per source and variant, at its latest checkpoint, every R on the same weights, the
    prompt groups as units."""
    rows = groups[groups["run_id"].isin(probes) & (groups["stat"] == INFORMATIVE)]
    rows = rows.assign(source=rows["run_id"].map(probes))
    out = []
    for (source, variant), part in rows.groupby(["source", "variant"], sort=True):
        part = part[part["step"] == part["step"].max()]
        rng = rng_for(rules, source, variant, "same weights")
        slopes = diversity.slope_readings(part, rules, rng, groups_are_units=True)
        if slopes is None:
            continue
        share = diversity.closed_form_share(part, rules, rng, groups_are_units=True)
        shares = "" if share is None else "; share of the closed form " + ", ".join(
            f"R={r} {iv.text(3)}" for r, iv in share.per_r if r in slopes.judged)
        source_of = diversity.growth_source(slopes.raw, slopes.matched, rules)
        out.append(Part("2m", "on the same weights, at matched diversity", CONTRAST, (
            f"On the same weights ({labels.get(variant, variant)}, grpo probe of {source} at "
            f"step {int(part['step'].iloc[0])}, its {slopes.units} as units): a group's rank per "
            f"doubling of R is {slopes.raw.text(2, sign=True)} without control and "
            f"{slopes.matched.text(2, sign=True)} with its distinct completions as categories "
            f"over {_r_list(slopes.judged)}{shares}: "
            + GROWTH_SOURCE[source_of].format(tol=rules.growth_tolerance) + ".")))
    return out


def per_distinct_sentence(name: str, stat: str, readings: list[tuple[int, diversity.PerDistinct]]
                          ) -> str:
    """The per-distinct-completion difference of one pair over its judged R, in words
    (reported beside the verdict, not in it)."""
    ivs = [x.difference for _, x in readings]
    if all(iv.finite and iv.high < 0 for iv in ivs):
        what = ("per-token credit lowers the rank per distinct completion at every R: it "
                "concentrates directions here; it does not add them")
    elif all(iv.finite and iv.low > 0 for iv in ivs):
        what = ("per-token credit raises the rank per distinct completion at every R: it adds "
                "directions beyond what more distinct completions give")
    else:
        what = "no difference per distinct completion holds at every R"
    paired = "paired by seed" if all(x.paired for _, x in readings) else "Welch's interval"
    values = ", ".join(f"R={r} {x.difference.text(3, sign=True)} (distinct completions "
                       f"{x.distinct_per_token:.2f} vs {x.distinct_outcome:.2f})"
                       for r, x in readings)
    return (f"Per distinct completion ({name}, {stat}; per-token minus outcome of a group's rank "
            f"/ its distinct completions, {paired}; reported, not in the verdict): {values}: "
            f"{what}.")


def layer_row(x: layer_gradient.LayerReading, label: str) -> dict:
    """One layer reading as a row of claim 2's table (beside the verdict, not in it)."""
    return {"variant": label, "matrix": "layer" + ("" if x.pooled else f": {x.layer}"),
            "measure": x.measure, **{f"R={r}": iv.text(2) for r, iv in x.per_r},
            "slope / doubling": "-" if x.slope is None else x.slope.text(2, sign=True),
            "2b growth small": x.growth, "2c ~2": x.level, "verdict": "beside (not in the verdict)"}


def layer_sentence(layers: list[layer_gradient.LayerReading], labels: dict[str, str],
                   rules: Rules) -> str:
    """The layer gradient's pooled readings (and each weight's range at the largest R) beside
    claim 2, and which matrix the paper's words point to."""
    out = []
    for x in (x for x in layers if x.pooled):
        values = ", ".join(f"R={r} {iv.text(2)}" for r, iv in x.per_r)
        slope = "" if x.slope is None else f"; slope {x.slope.text(2, sign=True)} per doubling"
        largest = max(r for r, _ in x.per_r)
        low, high = layer_gradient.spread([y for y in layers if y.variant == x.variant],
                                          x.measure, largest)
        weights = (f"; per weight at R={largest} from {low:.2f} to {high:.2f}"
                   if np.isfinite(low) else "")
        out.append(f"{labels.get(x.variant, x.variant)}, {x.measure} (mean over layers): "
                   f"{values}{slope} (2b {x.growth}, 2c {x.level}){weights}")
    return (f"Beside {rules.rank_matrix}, the layer gradient (each probed weight's batch "
            "gradient; claim 2's rule on it, table rows 'layer'): " + "; ".join(out) + ". "
            + LAYER_WHY)


def claim2_beside(variants: list[str], labels: dict[str, str], groups: pd.DataFrame,
                  layers: list[layer_gradient.LayerReading], rules: Rules,
                  probes: dict[str, str] | None = None) -> Beside:
    """Claim 2's readings beside its verdict for its `variants` (`groups`: the runs'
    diversity.group_frame; `layers`: layer_gradient.layer_readings; `probes`: run id -> probed
    source of the `grpo probe` runs among them, read on their own weights)."""
    probes = probes or {}
    training = groups[~groups["run_id"].isin(probes)]
    readings = {v: matched_diversity(v, labels.get(v, v), training, rules) for v in variants}
    parts = [part for part, _ in readings.values() if part is not None]
    parts += same_weights(groups[groups["variant"].isin(variants)], probes, labels, rules)
    if any(x.pooled for x in layers):
        parts.append(Part("2w", "the layer gradient beside rollout_group", CONTRAST,
                          layer_sentence(layers, labels, rules)))
    return Beside(tuple(parts), {v: columns for v, (_, columns) in readings.items()},
                  tuple(layer_row(x, labels.get(x.variant, x.variant)) for x in layers))

