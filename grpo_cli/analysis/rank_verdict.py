"""Claim 2's rule on every variant x matrix x measure, with intervals (analysis/rules.py).

Per R: the mean over seeds of each run's mean over its last probe steps, with a seed-level
t-interval (analysis/bootstrap.py). Over the judged R values (the uncapped ones,
`rules.judged_group_sizes`): the least-squares slope per doubling of R with its interval. Three
parts, each supported / contradicted / inconclusive: 2a "does the rank depend
on R at all?" (slope = 0, descriptive), 2b "is the growth small?" (|slope| <= tolerance) and 2c
"is the rank ~2?" (each judged R within the band); the verdict combines 2b and 2c.

Each part carries the numbers that decided it (parts.Part); analysis/words_over_r.py says them.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Callable
from dataclasses import replace

import numpy as np
import pandas as pd

from grpo_cli.analysis import bootstrap as bs
from grpo_cli.analysis.over_r import PerR, per_r_intervals, reading_over_r, slope_interval
from grpo_cli.analysis.parts import Part
from grpo_cli.analysis.rules import (
    CONTRADICTED,
    INCONCLUSIVE,
    NOT_JUDGED,
    Rules,
    capped_group_sizes,
    combine,
    family_wise,
    judged_group_sizes,
)
from grpo_cli.analysis.summary import SUMMARY_KEYS, last_part, sort_rows, verdict_rows
from grpo_cli.analysis.tables import PER_GROUP_MATRICES
from grpo_cli.analysis.words_over_r import (
    SLOPE_ZERO_QUESTION,
    LevelPart,
    MatchedWords,
    SlopeNotJudged,
    SlopePart,
    Together,
    VerdictWords,
    closest_part,
    common_span,
    growth_question,
    level_question,
    outside,
)

VERDICT_COLUMNS = [
    *SUMMARY_KEYS,
    "judged",
    "capped",
    "slope",
    "slope_low",
    "slope_high",
    "max_deviation",
    "verdict_slope_zero",
    "verdict_growth",
    "verdict_level",
    "verdict",
    "flip_slope_zero",
    "flip_growth",
    "flip_level",
    "n_incomplete",
    "means",
    "intervals",
    "parts",
    "words",  # words_over_r.VerdictWords: the row's sentence, when a reader asks
]
INTERVAL_COLUMNS = [*SUMMARY_KEYS, "group_size", "low", "high", "capped"]
VERDICT_PARTS = ("2b", "2c")  # the parts claim 2's verdict reads (2a is shown, descriptive)


def rng_for(rules: Rules, *key) -> np.random.Generator:
    """A generator per judged number, seeded from `rules.seed` and the number's key: the same
    numbers whatever else is analysed alongside."""
    return np.random.default_rng([rules.seed, zlib.crc32(repr(key).encode())])


def read_together(parts: list[Part], labels: list[str], rules: Rules, what: str
                  ) -> tuple[list[str], Together | None, list[Part]]:
    """The verdicts `parts` count for in their claim's verdict (rules.family_wise: Holm over
    their contradiction p-values), what reading them together did (words_over_r.Together; None
    when no part reads contradicted on its own, or only one part was tested), and the parts
    with their `counted_as` set. Where none stays contradicted, `Together.more` is about how
    many more seeds would let the closest count (its p at the Bonferroni level over the tested
    parts, which Holm's first step is). `labels` name the parts there; `what` names them in the
    plural."""
    level = rules.one_sided_level
    read, adjusted = family_wise([p.verdict for p in parts], [p.p_contradict for p in parts], level)
    counted = [replace(part, counted_as=verdict) for part, verdict in zip(parts, read, strict=True)]
    tested = sum(math.isfinite(a) for a in adjusted)
    alone = [k for k, p in enumerate(parts) if p.verdict == CONTRADICTED]
    if not alone or tested < 2:
        return read, None, counted
    kept = [k for k in alone if read[k] == CONTRADICTED]
    more = None
    if not kept:
        tests = parts[closest_part(alone, adjusted)].contradiction
        more = tests.seeds_to_reach(level / tested) if tests is not None else None
    return read, Together(what, level, tested, tuple(labels), tuple(adjusted), tuple(alone),
                          tuple(kept), more), counted


def rank_bounds(matrix: str, stat: str, group_size: int) -> tuple[float, float]:
    """The range a rank reading can take: >= 0 (measures.py: a zero spectrum gives 0), and a
    group's R x P matrix has rank <= R, so its per-group mean is <= R."""
    upper = float(group_size) if matrix in PER_GROUP_MATRICES and stat == "mean" else math.inf
    return 0.0, upper


def slope_parts(per_r: dict[int, PerR], judged: list[int], capped: list[int], rules: Rules,
                rng):
    """2a and 2b from the per-R values; returns (parts, slope interval or None)."""
    tol = rules.growth_tolerance
    if len(judged) < 2:
        return [Part(name, question, NOT_JUDGED,
                     SlopeNotJudged(name, tuple(judged), tuple(capped), rules.target))
                for name, question in (("2a", SLOPE_ZERO_QUESTION), ("2b", growth_question(tol)))
                ], None
    iv = slope_interval(per_r, judged, rules, rng)
    # 2a: the literal claim, descriptive (a point hypothesis: see Rules.slope_zero)
    zero = rules.slope_zero(iv.low, iv.high)
    flip_zero = bs.flip_probability(iv.estimate, iv.replicates, lambda v: v > 0)
    seeds_zero = None
    if zero == INCONCLUSIVE and iv.finite:
        options = [s for s in (bs.seeds_to_settle(iv, [0.0], rules.confidence),
                               bs.seeds_to_settle(iv, [-tol, tol], rules.confidence)) if s]
        seeds_zero = min(options) if options else None
    part_a = Part("2a", SLOPE_ZERO_QUESTION, zero,
                  SlopePart("2a", zero, tuple(judged), tuple(capped), iv, tol, flip_zero, seeds_zero),
                  flip_zero, seeds_zero)
    # 2b: the tolerance, an equivalence reading
    growth = rules.growth_small(iv.low, iv.high)
    flip_growth = bs.flip_probability(iv.estimate, iv.replicates, lambda v: np.abs(v) <= tol)
    seeds_growth = (bs.seeds_to_settle(iv, [-tol, tol], rules.confidence)
                    if growth == INCONCLUSIVE else None)
    part_b = Part("2b", growth_question(tol), growth,
                  SlopePart("2b", growth, tuple(judged), tuple(capped), iv, tol, flip_growth,
                            seeds_growth),
                  flip_growth, seeds_growth, bs.Contradiction(((iv, tol, "above"), (iv, -tol, "below"))))
    return [part_a, part_b], iv


def level_part(per_r: dict, judged: list[int], rules: Rules,
               bounds: Callable[[int], tuple[float, float]] = lambda r: bs.UNBOUNDED) -> Part:
    """2c: every judged R's rank within target +- band; an R reads wholly outside at the
    Bonferroni level over the judged R (`Rules.level`). `bounds(R)`: the range a reading can
    take (`rank_bounds`), which clips the wider intervals as it clips the others."""
    lo, hi = rules.target - rules.band, rules.target + rules.band
    question = level_question(rules.target, rules.band)
    level_out = rules.bonferroni(len(judged))  # = confidence with one judged R
    if not judged:
        return Part("2c", question, NOT_JUDGED, LevelPart(
            NOT_JUDGED, rules.target, rules.band, rules.confidence, level_out, (), (), (),
            math.nan, None))
    ivs = [per_r[r].interval for r in judged]
    wide = [bs.at_confidence(iv, level_out, bounds(r)) for r, iv in zip(judged, ivs, strict=True)]
    verdict = rules.level([(iv.low, iv.high) for iv in ivs], [(w.low, w.high) for w in wide])
    flip = math.nan
    if all(iv.replicates.size for iv in ivs):
        stacked = np.stack([iv.replicates for iv in ivs], axis=1)  # [resamples, judged R]
        inside = ((stacked >= lo) & (stacked <= hi)).all(axis=1)
        point = all(lo <= iv.estimate <= hi for iv in ivs)
        flip = float(np.mean(inside != point))
    seeds = None
    if verdict == INCONCLUSIVE:  # an R outside at `confidence` only must settle at the wider level
        needs = [bs.seeds_to_settle(iv, [lo, hi], rules.confidence)
                 if not outside(iv.low, iv.high, lo, hi)
                 else bs.seeds_to_settle(w, [lo, hi], level_out)
                 for iv, w in zip(ivs, wide, strict=True)
                 if iv.finite and not (lo <= iv.low and iv.high <= hi)]
        seeds = max(needs) if needs and all(needs) else None
    out_of_band = bs.Contradiction(  # an R's two sides exclude each other: k tests, not 2k
        tuple(test for iv in ivs for test in ((iv, hi, "above"), (iv, lo, "below"))), len(judged))
    facts = LevelPart(verdict, rules.target, rules.band, rules.confidence, level_out,
                      tuple(judged), tuple(ivs), tuple(wide), flip, seeds)
    return Part("2c", question, verdict, facts, flip, seeds, out_of_band)


def over_r_parts(per_r: dict[int, PerR], rules: Rules, rng,
                 bounds: Callable[[int], tuple[float, float]]) -> tuple[list[Part], bs.Interval | None, str]:
    """Claim 2's parts (2a, 2b, 2c), the slope interval and the verdict from per-R intervals;
    `bounds(R)` the range a reading can take (`rank_bounds`). A pair whose slope cannot be judged
    (one R, or none beyond the cap) gets no verdict: the claim is about R. The verdict reads 2b
    and 2c; 2a is descriptive (Rules.rank_text)."""
    sizes = sorted(per_r)
    judged = judged_group_sizes(sizes, rules.target)
    capped = capped_group_sizes(sizes, rules.target)
    slope_pair, slope_iv = slope_parts(per_r, judged, capped, rules, rng)
    parts = [*slope_pair, level_part(per_r, judged, rules, bounds)]
    verdict = (NOT_JUDGED if any(p.verdict == NOT_JUDGED for p in parts)
               else combine(p.verdict for p in parts if p.name in VERDICT_PARTS))
    return parts, slope_iv, verdict


def _group_lookup(groups: pd.DataFrame, window: pd.DataFrame) -> dict:
    """(variant, matrix, measure) -> {(run_id, step): per-group values} in the window."""
    if groups.empty or window.empty:
        return {}
    steps = window[["run_id", "step"]].drop_duplicates()
    groups = groups.merge(steps, on=["run_id", "step"])
    return {
        key: {(run_id, int(step)): rows["value"].to_numpy(float)
              for (run_id, step), rows in part.groupby(["run_id", "step"])}
        for key, part in groups.groupby(["variant", "matrix", "measure"])
    }


def rank_verdicts(ranks: pd.DataFrame, groups: pd.DataFrame, rules: Rules,
                  same_weights: frozenset[str] = frozenset()
                  ) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(verdicts: one row per variant x matrix x measure, intervals: one row per R of each).
    `same_weights`: run ids of `grpo probe` runs (groups, not seeds, are resampled)."""
    window = verdict_rows(last_part(ranks, rules.last_fraction)) if not ranks.empty else ranks
    lookup = _group_lookup(groups, window)
    rows, intervals = [], []
    if window.empty:
        return pd.DataFrame(columns=VERDICT_COLUMNS), pd.DataFrame(columns=INTERVAL_COLUMNS)
    for key, part in window.groupby(SUMMARY_KEYS, sort=False):
        variant, matrix, layer, stat, measure = key
        use_groups = stat == "mean" and matrix in PER_GROUP_MATRICES
        rng = rng_for(rules, *key)
        per_r = per_r_intervals(part, lookup.get((variant, matrix, measure), {}), use_groups, rules,
                                rng, lambda r, m=matrix, s=stat: rank_bounds(m, s, r), same_weights)
        sizes = sorted(per_r)
        judged = judged_group_sizes(sizes, rules.target)
        capped = capped_group_sizes(sizes, rules.target)
        parts, slope_iv, verdict = over_r_parts(per_r, rules, rng,
                                                lambda r, m=matrix, s=stat: rank_bounds(m, s, r))
        n_incomplete = int(part.loc[part["status"] == "incomplete", "run_id"].nunique())
        means = {r: per_r[r].interval.estimate for r in sizes}
        rows.append({
            **dict(zip(SUMMARY_KEYS, key, strict=True)),
            "judged": ", ".join(map(str, judged)),
            "capped": ", ".join(map(str, capped)),
            "slope": slope_iv.estimate if slope_iv else math.nan,
            "slope_low": slope_iv.low if slope_iv else math.nan,
            "slope_high": slope_iv.high if slope_iv else math.nan,
            "max_deviation": reading_over_r({r: means[r] for r in judged}, rules.target).max_deviation,
            "verdict_slope_zero": parts[0].verdict,
            "verdict_growth": parts[1].verdict,
            "verdict_level": parts[2].verdict,
            "verdict": verdict,
            "flip_slope_zero": parts[0].flip,
            "flip_growth": parts[1].flip,
            "flip_level": parts[2].flip,
            "n_incomplete": n_incomplete,
            "means": means,
            "intervals": {r: per_r[r].interval for r in sizes},
            "parts": parts,
            "words": VerdictWords(variant, matrix, measure, verdict, tuple(parts), n_incomplete),
        })
        intervals += [
            {**dict(zip(SUMMARY_KEYS, key, strict=True)), "group_size": r,
             "low": per_r[r].interval.low, "high": per_r[r].interval.high,
             "capped": r in capped}
            for r in sizes
        ]
    return (sort_rows(pd.DataFrame(rows, columns=VERDICT_COLUMNS)),
            pd.DataFrame(intervals, columns=INTERVAL_COLUMNS))


def point_reading(means: dict[int, float], rules: Rules) -> tuple[str, float, float]:
    """(reading, max deviation, slope) of point estimates with no interval (matched progress):
    "inside" / "outside" the rule's region, on the judged R values."""
    reading = reading_over_r(means, rules.target)
    deviation, slope = reading.max_deviation, reading.slope
    if len(reading.judged) < 2:
        return NOT_JUDGED, deviation, math.nan
    inside = deviation <= rules.band and abs(slope) <= rules.growth_tolerance
    return ("inside" if inside else "outside"), deviation, slope


def matched_readings(ranks_x: pd.DataFrame, rules: Rules, progress: str) -> pd.DataFrame:
    """Claim 2's rule on point estimates at matched progress (descriptive: no interval).

    `ranks_x` carries `x`, the centre of each probe step's progress bin. Per R, the rank is
    averaged within each bin (first within a run, then over runs) and then over the bins that
    every R of the variant reaches; bins reached by only some Rs are left out.
    """
    columns = [*SUMMARY_KEYS, "reading", "max_deviation", "slope", "common_bins", "means",
               "words"]
    if ranks_x.empty:
        return pd.DataFrame(columns=columns)
    table = verdict_rows(ranks_x)
    per_run = table.groupby([*SUMMARY_KEYS, "group_size", "run_id", "x"], as_index=False)[
        "value"].mean()
    per_bin = per_run.groupby([*SUMMARY_KEYS, "group_size", "x"], as_index=False)["value"].mean()
    rows = []
    for key, part in per_bin.groupby(SUMMARY_KEYS, sort=False):
        bins_per_r = part.groupby("group_size")["x"].apply(set)
        common = sorted(set.intersection(*bins_per_r)) if len(bins_per_r) else []
        matched = part[part["x"].isin(common)]
        means = {int(r): m for r, m in matched.groupby("group_size")["value"].mean().items()}
        reading, deviation, slope = point_reading(means, rules) if common else (
            NOT_JUDGED, math.nan, math.nan)
        words = MatchedWords(key[0], key[1], key[4], progress, reading, tuple(sorted(means.items())),
                             slope, bool(common))
        rows.append({**dict(zip(SUMMARY_KEYS, key, strict=True)), "reading": reading,
                     "max_deviation": deviation, "slope": slope,
                     "common_bins": str(len(common)) + " (" + common_span(progress, common) + ")",
                     "means": means, "words": words})
    return sort_rows(pd.DataFrame(rows, columns=columns)) if rows else pd.DataFrame(columns=columns)
