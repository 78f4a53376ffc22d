"""Readings beside claims 2 and 4's verdicts (their words: words_beside.py): claim 2's rank at matched diversity (is
its growth with R the distinct completions' or the geometry's? analysis/diversity.py) and the
`layer` gradient (the matrix the paper's words most plausibly point to;
analysis/layer_gradient.py); claim 4's difference per distinct completion. Shown in the claims'
evidence and tables, never in their verdicts.
"""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from grpo_cli.analysis import diversity, layer_gradient
from grpo_cli.analysis.credit_compare import INFORMATIVE
from grpo_cli.analysis.parts import Part
from grpo_cli.analysis.rank_verdict import rng_for
from grpo_cli.analysis.rules import CONTRAST, Rules
from grpo_cli.analysis.words_beside import (
    LayerBeside,
    LayerPooled,
    MatchedDiversity,
    PerDistinct,
    SameWeights,
)


@dataclass(frozen=True)
class Beside:
    """What claim 2 shows beside its verdict."""

    parts: tuple[Part, ...]  # "2m" per variant, then "2w"
    columns: dict  # variant -> its table columns at matched diversity
    layer_rows: tuple[dict, ...]  # rows of the claim's table, one per layer reading


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
    first = diversity.slope_readings(
        diversity.early(groups[(groups["variant"] == variant) & (groups["stat"] == INFORMATIVE)]),
        rules, rng_for(rules, variant, "matched diversity", "early"))
    facts = MatchedDiversity(
        label, rules.rank_matrix, rules.rank_measure, INFORMATIVE, slopes.raw, slopes.matched,
        slopes.units, tuple(judged), tuple(distinct[r] for r in judged),
        None if share is None else tuple((r, iv) for r, iv in share.per_r if r in judged),
        None if share is None else share.slope,
        None if first is None else (first.raw, first.matched), source, rules.growth_tolerance)
    columns = {"slope at matched diversity": slopes.matched.text(2, sign=True),
               "early: at matched diversity": "-" if first is None else first.matched.text(2, True),
               "share of closed form": "-" if share is None else ", ".join(
                   f"R={r}: {iv.text(3)}" for r, iv in share.per_r),
               "growth is": source}
    return Part("2m", "does the rank grow with R at matched diversity?", CONTRAST, facts), columns


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
        out.append(Part("2m", "on the same weights, at matched diversity", CONTRAST, SameWeights(
            labels.get(variant, variant), source, int(part["step"].iloc[0]), slopes.units,
            slopes.raw, slopes.matched, tuple(slopes.judged),
            None if share is None else tuple((r, iv) for r, iv in share.per_r if r in slopes.judged),
            diversity.growth_source(slopes.raw, slopes.matched, rules), rules.growth_tolerance)))
    return out


def per_distinct_part(name: str, stat: str, readings: list[tuple[int, diversity.PerDistinct]]
                      ) -> PerDistinct:
    """The per-distinct-completion difference of one pair over its judged R (its words:
    words_beside.PerDistinct; reported beside the verdict, not in it)."""
    return PerDistinct(name, stat, tuple((r, x.difference, x.distinct_per_token, x.distinct_outcome)
                                         for r, x in readings),
                       all(x.paired for _, x in readings))


def layer_row(x: layer_gradient.LayerReading, label: str) -> dict:
    """One layer reading as a row of claim 2's table (beside the verdict, not in it)."""
    return {"variant": label, "matrix": "layer" + ("" if x.pooled else f": {x.layer}"),
            "measure": x.measure, **{f"R={r}": iv.text(2) for r, iv in x.per_r},
            "slope / doubling": "-" if x.slope is None else x.slope.text(2, sign=True),
            "2b growth small": x.growth, "2c ~2": x.level, "verdict": "beside (not in the verdict)"}


def layer_part(layers: list[layer_gradient.LayerReading], labels: dict[str, str],
               rules: Rules) -> LayerBeside:
    """The layer gradient's pooled readings (and each weight's range at the largest R) beside
    claim 2 (its words: words_beside.LayerBeside)."""
    out = []
    for x in (x for x in layers if x.pooled):
        largest = max(r for r, _ in x.per_r)
        low, high = layer_gradient.spread([y for y in layers if y.variant == x.variant],
                                          x.measure, largest)
        out.append(LayerPooled(labels.get(x.variant, x.variant), x.measure, tuple(x.per_r),
                               x.slope, x.growth, x.level, largest, float(low), float(high)))
    return LayerBeside(rules.rank_matrix, tuple(out))


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
                          layer_part(layers, labels, rules)))
    return Beside(tuple(parts), {v: columns for v, (_, columns) in readings.items()},
                  tuple(layer_row(x, labels.get(x.variant, x.variant)) for x in layers))

