"""Claim 4, the paper's falsifier: does per-token credit raise the rank well above 2?

The deciding reading is on claim 2's own matrix (`rules.rank_matrix`, rollout_group: the R x P
matrix of the zero-sum argument) with the same rows on both sides (analysis/credit_compare.py):
informative groups only (the rewards differ), and, where ranks.csv records checked steps, only
problems with >= the rule book's min_checked_steps of them (a step-reward estimator gives a one-step problem
uniform credit, so those groups cannot show what per-token credit does; the restriction is the
same for every estimator, never chosen by name). Per run the window mean over its last probe
steps, per R the seed-level t-interval and per-token minus outcome Welch's interval: the same
code as claim 2 (over_r.per_r_intervals, bootstrap.welch_interval), so the calibration tests cover
both. R <= target is capped (a group of R rows has rank <= R) and not judged. A group's rank is
also at most its number of distinct completions, so the absolute bar (per-token rank >= target +
margin) is judged only where the per-token groups' distinct completions leave room above it
(diversity.bar_reachable); elsewhere the part reads the difference alone (`judge_difference`).
Beside the verdict, per pair: the difference of the rank per distinct completion (seed-paired;
diversity.per_distinct_difference), which says whether per-token credit adds directions or only
concentrates them.

Where `grpo probe` directories of an outcome and a per-token estimator probed the same source
at the same checkpoint, seed and R, they sampled the very same rollouts: those are compared
group by group (paired differences; units the groups of one seed, or the seeds' means with
more), and are deciding parts too.

The whole-batch matrix (`rules.falsifier_matrix`, rollout_batch) is a labelled side reading,
not in the verdict: an estimator that gives zero-variance groups non-zero advantages (ppo's
critic) has more non-zero rows there, and more rows raise a rank without any per-token credit;
its rank per non-zero row is shown beside it (issue 46).
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from grpo_cli.analysis import beside, diversity
from grpo_cli.analysis import bootstrap as bs
from grpo_cli.analysis import credit_compare as cc
from grpo_cli.analysis.load import Run
from grpo_cli.analysis.over_r import per_r_intervals
from grpo_cli.analysis.parts import Joined, Part
from grpo_cli.analysis.rank_verdict import rank_bounds, read_together, rng_for
from grpo_cli.analysis.rules import (
    CONTRAST,
    INCONCLUSIVE,
    NOT_JUDGED,
    NOT_MEASURED,
    OUTCOME,
    PER_TOKEN,
    Families,
    Rules,
    combine,
    estimator_family,
    judged_group_sizes,
    three_way,
)
from grpo_cli.analysis.same_checkpoint import is_probe, probe_source
from grpo_cli.analysis.summary import last_part
from grpo_cli.analysis.words_beside import PerDistinct
from grpo_cli.analysis.words_falsifier import (
    Capped,
    DifferencePart,
    Missing,
    PairPart,
    SidePart,
    SideReading,
    at_r,
    no_families,
    no_ranks,
    pair_name,
    reading_label,
    side_question,
    with_stat,
)


def interval_columns(outcome: bs.Interval, per_token: bs.Interval, diff: bs.Interval) -> dict:
    """A deciding part's numbers, as the claim's table (and claim4.png) shows them."""
    return {name + suffix: value for name, iv in (("outcome rank", outcome),
                                                       ("per-token rank", per_token),
                                                       ("difference", diff))
            for suffix, value in (("", iv.estimate), (" low", iv.low), (" high", iv.high))}


def judge_pair(name: str, outcome: bs.Interval, per_token: bs.Interval, diff: bs.Interval,
               rules: Rules) -> Part:
    """One deciding part: per-token minus outcome >= margin and per-token >= target + margin
    (Rules.well_above), with its facts (words_falsifier.PairPart), flip probability and seeds
    that would settle it."""
    target, margin = rules.target, rules.margin
    level_below = rules.bonferroni(2)  # either interval wholly below contradicts: two tests
    wide = (bs.at_confidence(diff, level_below),
            bs.at_confidence(per_token, level_below, (0.0, math.inf)))  # a rank is >= 0
    verdict = rules.well_above((diff.low, diff.high), (per_token.low, per_token.high),
                               tuple((w.low, w.high) for w in wide))
    flip = math.nan
    if diff.replicates.size and per_token.replicates.size:
        above = (diff.replicates >= margin) & (per_token.replicates >= target + margin)
        point = diff.estimate >= margin and per_token.estimate >= target + margin
        flip = float(np.mean(above != point))
    seeds = None
    if verdict == INCONCLUSIVE:  # an interval below at `confidence` only must settle at the wider level
        needs = [x for x in (
            bs.seeds_to_settle(iv, [bound], rules.confidence) if not iv.high < bound
            else bs.seeds_to_settle(w, [bound], level_below)
            for iv, w, bound in ((diff, wide[0], margin), (per_token, wide[1], target + margin)))
            if x]
        seeds = max(needs) if needs else None
    facts = PairPart(name, verdict, outcome, per_token, diff, wide, target, margin,
                     rules.confidence, level_below, flip, seeds)
    below = bs.Contradiction(((diff, margin, "below"), (per_token, target + margin, "below")), 2)
    return Part("4", name, verdict, facts, flip, seeds, below)


def judge_difference(name: str, outcome: bs.Interval, per_token: bs.Interval, diff: bs.Interval,
                     distinct: float, rules: Rules) -> Part:
    """A deciding part where the per-token groups' `distinct` completions (their mean) leave no
    room for the absolute bar (diversity.bar_reachable): judged on the difference alone, one
    interval at `confidence`: supported iff it lies above the margin, contradicted iff wholly
    below it, with its facts (words_falsifier.DifferencePart), flip probability and seeds that
    would settle it."""
    margin = rules.margin
    verdict = three_way(diff.low, diff.high, margin, math.inf)
    flip = bs.flip_probability(diff.estimate, diff.replicates, lambda v: v >= margin)
    seeds = bs.seeds_to_settle(diff, [margin], rules.confidence) if verdict == INCONCLUSIVE else None
    facts = DifferencePart(name, verdict, outcome, per_token, diff, distinct, rules.target, margin,
                           flip, seeds)
    return Part("4", name, verdict, facts, flip, seeds,
                bs.Contradiction(((diff, margin, "below"),), 1))


def _families(runs: list[Run]) -> tuple[list[str], list[str], dict[str, str]]:
    """(outcome variants: zero-sum outcome credit; per-token variants; variant -> label)."""
    facts = {run.variant: run.estimator_facts for run in runs}
    outcome = sorted(v for v, f in facts.items() if estimator_family(f) == OUTCOME)
    per_token = sorted(v for v, f in facts.items() if estimator_family(f) == PER_TOKEN)
    return outcome, per_token, {v: v or str(f["name"]) for v, f in facts.items()}


def window_units(window: pd.DataFrame, variant: str, size: int, rules: Rules, key
                 ) -> tuple[bs.Interval, np.ndarray] | None:
    """A variant's interval at R=`size` from its runs' window means (claim 2's code)."""
    part = window[(window["variant"] == variant) & (window["group_size"] == size)]
    if part.empty:
        return None
    per_r = per_r_intervals(part, {}, False, rules, rng_for(rules, *key, variant),
                            lambda r: rank_bounds(rules.rank_matrix, "mean", r))
    return (per_r[size].interval, per_r[size].units) if size in per_r else None


def pair_intervals(outcome: tuple[bs.Interval, np.ndarray], per_token: tuple[bs.Interval, np.ndarray],
                   rules: Rules, key) -> tuple[bs.Interval, bs.Interval, bs.Interval]:
    """(outcome, per-token, per-token minus outcome): the two variants' runs are independent,
    so the difference gets Welch's interval of their window means (tests/test_calibration.py)."""
    (ia, ua), (ib, ub) = outcome, per_token
    diff = bs.welch_interval([ub, ua], [1.0, -1.0], rules.confidence,
                             rng_for(rules, *key, "difference"), rules.resamples)
    return ia, ib, diff


def _pair_at_diversity(name: str, intervals: tuple[bs.Interval, bs.Interval, bs.Interval],
                       groups: list[pd.DataFrame], rules: Rules, key
                       ) -> tuple[Part, dict, diversity.PerDistinct | None]:
    """One judged pair at one R: judge_pair where the per-token groups' distinct completions
    leave room for the bar (or are not recorded), else judge_difference; the table's columns
    on diversity and the per-distinct-completion reading (None without distinct completions).
    `groups`: the outcome's and the per-token side's diversity.group_frame rows there."""
    ia, ib, diff = intervals
    distinct = groups[1]["distinct"].groupby(groups[1]["run_id"]).mean().mean()
    bar = not np.isfinite(distinct) or diversity.bar_reachable(distinct, rules)
    part = (judge_pair(name, ia, ib, diff, rules) if bar
            else judge_difference(name, ia, ib, diff, distinct, rules))
    extra = {"distinct (per-token)": distinct, "bar judged": bar}
    if groups[0].empty or groups[1].empty:
        return part, extra, None
    reading = diversity.per_distinct_difference(*groups, rules, rng_for(rules, *key, "per distinct"))
    return part, extra | {"difference per distinct": reading.difference.text(3, sign=True)}, reading


def _stat_for(window: pd.DataFrame, base: str, other: str, size: int) -> str:
    """The same rows on both sides: multi-step problems where both record them, else
    informative groups (credit_compare.deciding_stat)."""
    have = [set(window.loc[(window["variant"] == v) & (window["group_size"] == size), "stat"])
            for v in (base, other)]
    return cc.deciding_stat(have[0] & have[1])


def training_parts(runs: list[Run], rules: Rules, same_rows: pd.DataFrame | None = None,
                   groups: pd.DataFrame | None = None
                   ) -> tuple[list[dict], list[Part], list[SideReading], list[PerDistinct]]:
    """Deciding parts from training runs (per pair of variants x judged R), the table rows, the
    side readings and the per-distinct-completion parts' facts (beside.per_distinct_part).
    `same_rows`: a `same_rows_table` of these runs or more, with `rules.rank_measure` among its
    measures; `groups`: their diversity.group_frame; each built here where the caller has none."""
    outcome, per_token, label = _families(runs)
    if groups is None:
        groups = diversity.group_frame(runs, rules)
    groups = diversity.window(groups[groups["run_id"].isin([str(run.path) for run in runs])],
                              rules)
    measure = rules.rank_measure
    if same_rows is None:
        table = cc.same_rows_table(runs, [measure], rules)
    else:
        table = cc.measure_rows(same_rows[same_rows["run_id"].isin([str(run.path) for run in runs])], [measure])
    window = last_part(table, rules.last_fraction)
    deciding = window[(window["matrix"] == rules.rank_matrix) & (window["measure"] == measure)]
    rows, parts, side, per_distinct = [], [], [], []
    for base in outcome:
        for other in per_token:
            name_pair, readings = pair_name(label[other], label[base]), []
            sizes = sorted({int(r) for r in deciding.loc[deciding["variant"].isin([base, other]),
                                                         "group_size"]})
            for size in sizes:
                name = at_r(name_pair, size)
                stat = _stat_for(deciding, base, other, size)
                rows_at = deciding[deciding["stat"] == stat]
                a = window_units(rows_at, base, size, rules, (base, other, size, stat))
                b = window_units(rows_at, other, size, rules, (base, other, size, stat))
                row = {"reading": reading_label(rules.rank_matrix, stat),
                       "outcome": label[base], "per-token": label[other], "R": size}
                if size not in judged_group_sizes([size], rules.target):
                    why = Capped(name, size, rules.target + rules.margin)
                elif a is None or b is None:
                    why = Missing(name, tuple(label[v] for v, x in ((base, a), (other, b)) if x is None),
                                  rules.rank_matrix, size)
                else:
                    why = None
                if why is not None:
                    rows.append(row | {"verdict": NOT_JUDGED})
                    parts.append(Part("4", name, NOT_JUDGED, why))
                    continue
                ia, ib, diff = pair_intervals(a, b, rules, (base, other, size))
                at = [groups[(groups["variant"] == v) & (groups["group_size"] == size)
                             & (groups["stat"] == stat)] for v in (base, other)]
                part, extra, reading = _pair_at_diversity(with_stat(name, stat), (ia, ib, diff), at,
                                                          rules, (base, other, size, stat))
                if reading is not None:
                    readings.append((size, reading))
                rows.append(row | interval_columns(ia, ib, diff) | extra
                            | {"verdict": part.verdict, "flip": part.flip})
                parts.append(part)
            side += _side_readings(window, base, other, name_pair, rules)
            if readings:
                per_distinct.append(beside.per_distinct_part(name_pair, stat, readings))
    return rows, parts, side, per_distinct


def _side_readings(window: pd.DataFrame, base: str, other: str, name: str, rules: Rules
                    ) -> list[SideReading]:
    """The whole-batch side reading: per-token minus outcome per R, whole matrix and per
    non-zero row, with Welch's intervals (descriptive)."""
    out = []
    for measure in (rules.rank_measure, rules.rank_measure + cc.PER_ROW):
        rows = window[(window["matrix"] == rules.falsifier_matrix) & (window["measure"] == measure)]
        readings = []
        for size in sorted({int(r) for r in rows.loc[rows["variant"] == base, "group_size"]}
                           & {int(r) for r in rows.loc[rows["variant"] == other, "group_size"]}):
            units = [rows.loc[(rows["variant"] == v) & (rows["group_size"] == size)]
                     .groupby("run_id")["value"].mean().to_numpy(float) for v in (other, base)]
            diff = bs.welch_interval(units, [1.0, -1.0], rules.confidence,
                                     rng_for(rules, base, other, size, measure), rules.resamples)
            readings.append((size, diff))
        if readings:
            out.append(SideReading(name, rules.falsifier_matrix, measure, tuple(readings),
                                   2 if measure == rules.rank_measure else 3))
    return out


def same_rollout_differences(runs: list[Run], rules: Rules) -> pd.DataFrame:
    """Per-group values of `grpo probe` runs, one row per (source, seed, step, R, group) with a
    column per variant that probed it: the same rollouts under each estimator. Groups kept by
    the same selection on every side (credit_compare: informative, multi-step where recorded), on
    the rule book's matrix and measure."""
    matrix, measure = rules.rank_matrix, rules.rank_measure
    frames = []
    for run in runs:
        if not is_probe(run) or run.ranks.empty or measure not in run.ranks:
            continue
        ranks = run.ranks[(run.ranks["matrix"] == matrix)
                          & run.ranks["group"].astype(str).str.startswith("g")]
        ranks = ranks.assign(value=pd.to_numeric(ranks[measure], errors="coerce"))
        selections = cc.group_selections(ranks, rules)
        picked = selections[cc.deciding_stat(set(selections))]
        frames.append(picked.assign(source=probe_source(run), seed=run.seed,
                                    group_size=run.group_size, variant=run.variant)[
            ["source", "seed", "step", "group_size", "group", "variant", "value"]])
    if not frames:
        return pd.DataFrame()
    long = pd.concat(frames, ignore_index=True)
    return long.pivot_table(index=["source", "seed", "step", "group_size", "group"],
                            columns="variant", values="value", aggfunc="first").reset_index()


def probe_parts(runs: list[Run], rules: Rules, groups: pd.DataFrame | None = None
                ) -> tuple[list[dict], list[Part]]:
    """Deciding parts from `grpo probe` pairs: the very same rollouts, group by group; the bar
    judged where the per-token probes' groups (`groups`: diversity.group_frame, None: not
    known) leave room for it, as for training runs."""
    paired = same_rollout_differences(runs, rules)
    if paired.empty:
        return [], []
    outcome, per_token, label = _families([r for r in runs if is_probe(r)])
    rows, parts = [], []
    for base in outcome:
        for other in per_token:
            both = paired.dropna(subset=[base, other]) if {base, other} <= set(paired) else paired[:0]
            # the latest checkpoint each source was probed at: the end of training
            last = both.groupby("source")["step"].transform("max")
            both = both[both["step"] == last]
            for size in sorted({int(r) for r in both["group_size"]}):
                at = both[both["group_size"] == size]
                name = at_r(pair_name(label[other], label[base]), size, same_rollouts=True)
                row = {"reading": reading_label(rules.rank_matrix, None),
                       "outcome": label[base], "per-token": label[other], "R": size}
                if size not in judged_group_sizes([size], rules.target):
                    rows.append(row | {"verdict": NOT_JUDGED})
                    parts.append(Part("4", name, NOT_JUDGED, Capped(name, size)))
                    continue
                # units: the groups of one seed, else each seed's mean (the independent runs)
                unit = ["seed"] if at["seed"].nunique() >= 2 else ["seed", "group", "step", "source"]
                per_unit = at.groupby(unit)[[base, other]].mean()
                rng = rng_for(rules, base, other, size, "same rollouts")
                bounds = rank_bounds(rules.rank_matrix, "mean", size)
                ia = bs.mean_interval(per_unit[base].to_numpy(float), rules.confidence, rng,
                                      rules.resamples, bounds)
                ib = bs.mean_interval(per_unit[other].to_numpy(float), rules.confidence, rng,
                                      rules.resamples, bounds)
                diff = bs.mean_interval((per_unit[other] - per_unit[base]).to_numpy(float),
                                        rules.confidence, rng, rules.resamples)
                distinct = _probe_distinct(groups, other, size, set(at["step"]))
                bar = not np.isfinite(distinct) or diversity.bar_reachable(distinct, rules)
                part = (judge_pair(name, ia, ib, diff, rules) if bar
                        else judge_difference(name, ia, ib, diff, distinct, rules))
                rows.append(row | interval_columns(ia, ib, diff)
                            | {"distinct (per-token)": distinct, "bar judged": bar,
                               "verdict": part.verdict, "flip": part.flip})
                parts.append(part)
    return rows, parts


def _probe_distinct(groups: pd.DataFrame | None, variant: str, size: int, steps: set) -> float:
    """Mean distinct completions of `variant`'s probed groups at R=`size` and `steps` (claim
    4's deciding rows, credit_compare.deciding_stat); NaN where not recorded."""
    if groups is None:
        return math.nan
    rows = groups[(groups["variant"] == variant) & (groups["group_size"] == size)
                  & groups["step"].isin(steps)]
    rows = rows[rows["stat"] == cc.deciding_stat(set(rows["stat"]))]
    return float(rows["distinct"].mean()) if len(rows) else math.nan


def falsifier_reading(runs: list[Run], rules: Rules, same_rows: pd.DataFrame | None = None,
                      groups: pd.DataFrame | None = None
                      ) -> tuple[str, Joined | str, pd.DataFrame, list[Part]]:
    """Claim 4 (module docstring): (verdict, evidence, table, parts): deciding parts from
    training runs and `grpo probe` pairs on claim 2's matrix and rows; the per-distinct-
    completion difference and the whole-batch side reading in the evidence. `same_rows`,
    `groups`: see `training_parts`."""
    outcome, per_token, _ = _families(runs)
    if not outcome or not per_token:
        families = Families.of(runs)
        return (NOT_MEASURED, no_families(families.named(families.zero_sum),
                                          families.named(families.per_token)), pd.DataFrame(), [])
    if groups is None:
        groups = diversity.group_frame(runs, rules)
    training = [r for r in runs if not is_probe(r)]
    rows, parts, side, per_distinct = (training_parts(training, rules, same_rows, groups)
                                       if training else ([], [], [], []))
    probe_rows, probe = probe_parts(runs, rules, groups)
    rows, parts = rows + probe_rows, parts + probe
    frame = pd.DataFrame(rows)
    if frame.empty:
        return NOT_JUDGED, no_ranks(rules.rank_matrix, rules.rank_measure), frame, parts
    read, together, parts = read_together(parts, [p.question for p in parts], rules, "pairs")
    verdict = combine(read)
    if together:
        parts.append(Part("4t", "the pairs read together", CONTRAST, together))
    parts += [Part("4d", "the rank per distinct completion", CONTRAST, facts)
              for facts in per_distinct]  # reported, never in the verdict
    if side:  # shown after the deciding parts, never in the verdict
        parts.append(Part("4s", side_question(rules.falsifier_matrix), CONTRAST,
                          SidePart(rules.falsifier_matrix, tuple(side))))
    return verdict, Joined(tuple(parts)), frame, parts
