"""The paper's four claims, one verdict each, with the rule used and the numbers behind it.

1. Under outcome-only rewards every token of a rollout gets the same advantage.
2. The gradient matrix has effective rank ~2 whatever the group size R.
3. Gradient sparsity grows over training.
4. Per-token credit (the paper's falsifier) raises the rank well above 2.

Every rule and threshold lives in analysis/rules.py. A claim is judged in parts (per estimator,
per R, per measure, and for claim 2 the questions 2a / 2b / 2c); each part is supported,
contradicted or inconclusive from an interval (or "not judged", saying why), and
`rules.combine` turns the parts into the claim's verdict. "not measured": the results hold no
run the claim's rule can use (e.g. claim 4 needs an outcome and a per-token estimator side by
side, as `make reproduce-cpu` runs them).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

import numpy as np
import pandas as pd

from grpo_cli.analysis import beside, diversity, layer_gradient, token_weights, trend, units
from grpo_cli.analysis import bootstrap as bs
from grpo_cli.analysis.falsifier import falsifier_reading
from grpo_cli.analysis.load import Run
from grpo_cli.analysis.parts import Joined, Part, Words, say
from grpo_cli.analysis.rank_verdict import VERDICT_PARTS, read_together, rng_for
from grpo_cli.analysis.rules import (
    CONTRADICTED,
    CONTRAST,
    INCONCLUSIVE,
    NOT_JUDGED,
    NOT_MEASURED,
    OUTCOME,
    PER_TOKEN,
    SUPPORTED,
    Families,
    Rules,
    combine,
    estimator_family,
    holm,
)
from grpo_cli.analysis.same_checkpoint import is_probe, probe_source
from grpo_cli.analysis.tables import metric_table
from grpo_cli.analysis.words_credit import (
    PART_1A_LABEL,
    PART_1A_QUESTION,
    Advantages,
    CreditRow,
    credit_rule,
)
from grpo_cli.analysis.words_over_r import Together, VerdictCounts, no_zero_sum_ranks
from grpo_cli.analysis.words_trend import (
    NO_SPARSITY,
    POOLED_QUESTION,
    PooledPart,
    TrendPart,
    ZeroAdvantage,
    trend_name,
)

ESTIMATOR_KEY = "algorithm.name"
SPARSITY_METRICS = ("grad_sparsity", "grad_hoyer")
ZERO_ADVANTAGE_METRIC = "zero_variance_frac"  # claim 3's second reading: zero-advantage groups
STATEMENTS = {
    1: "Under outcome-only rewards every token of a rollout gets the same advantage.",
    2: "The gradient matrix has effective rank ~2 whatever the group size R.",
    3: "Gradient sparsity grows over training.",
    4: "Per-token credit raises the rank well above 2.",
}


@dataclass(frozen=True)
class Claim:
    number: int  # 1..4, see STATEMENTS
    verdict: str  # rules.VERDICT_WORDS
    facts: Words | str  # the numbers behind the verdict (its parts and readings; a str: said as is)
    table: pd.DataFrame = field(default_factory=pd.DataFrame)  # one row per judged part
    rule: str = ""  # the rule, in words (Rules.text)
    parts: list[Part] = field(default_factory=list)  # the headline parts, in order
    unit: units.Unit | None = None  # what its intervals' units are (None: claim 1, no interval)

    @property
    def statement(self) -> str:
        return STATEMENTS[self.number]

    @property
    def evidence(self) -> str:
        """The numbers behind the verdict in words, one sentence per part, rendered from its facts."""
        return say(self.facts)

    @property
    def parts_text(self) -> str:
        """Claim 2: e.g. "2a contradicted, 2b inconclusive, 2c supported"; claims 3 and 4:
        e.g. "6 inconclusive, 2 supported" (parts per verdict)."""
        text = self._parts_text(lambda p: p.verdict)
        together = self._parts_text(lambda p: p.counted_as or p.verdict)
        return text + (f"; read together: {together}" if together != text else "")

    def _parts_text(self, verdict_of) -> str:
        names = [p for p in self.parts if p.name in ("2a", "2b", "2c")]
        if not names:  # claims 3 and 4: how many parts read what
            counts = pd.Series([verdict_of(p) for p in self.parts if p.name in ("3", "4")])
            return ", ".join(f"{n} {v}" for v, n in counts.value_counts().items())
        by_name: dict[str, list[str]] = {}
        for p in names:
            by_name.setdefault(p.name, []).append(verdict_of(p))
        return ", ".join(f"{name} {combine(v)}" for name, v in by_name.items())


def _estimators(runs: list[Run]) -> dict[str, str | None]:
    """variant label -> estimator (algorithm.name) of its runs."""
    return {run.variant: run.config.get(ESTIMATOR_KEY) for run in runs}


def _facts(runs: list[Run]) -> dict[str, dict]:
    """variant label -> its runs' estimator facts (run.json's estimator_facts; Run.estimator_facts)."""
    return {run.variant: run.estimator_facts for run in runs}


def zero_sum_variants(runs: list[Run]) -> list[str]:
    """The variants of zero-sum outcome estimators (rules.estimator_family, recorded facts)."""
    return sorted(v for v, f in _facts(runs).items() if estimator_family(f) == OUTCOME)


def _label(variant: str, estimator: str | None) -> str:
    return variant or str(estimator)


# ---- claim 1: uniform credit -------------------------------------------------------------------
def credit_claim(runs: list[Run], rules: Rules, weights: pd.DataFrame | None = None,
                 families: Families | None = None) -> Claim:
    """Claim 1 in two parts: 1a, the advantages (true by construction for outcome estimators: a
    check of the wiring, not of the paper), and 1b, the loss gradient's token weights where the
    runs recorded them (`weights`: token_weights.token_weight_table; `families`: Families.of(runs);
    each computed when None); the verdict combines them."""
    if weights is None:
        weights = token_weights.token_weight_table(runs)
    verdict, evidence, frame = _advantages_reading(runs, rules)
    rule = rules.text(1, families or Families.of(runs))
    first = Part("1a", PART_1A_QUESTION, verdict, Joined((PART_1A_LABEL, evidence)))
    empirical = token_weights.empirical_parts(weights)
    if empirical:
        verdict = combine([first.verdict, *(p.verdict for p in empirical)])
        rule = credit_rule(rule, rules.token_weight_text())
    return Claim(1, verdict, evidence, frame, parts=[first, *empirical], rule=rule)


def _advantages_reading(runs: list[Run], rules: Rules) -> tuple[str, Advantages, pd.DataFrame]:
    """Claim 1a: (verdict, evidence, table) of credit_uniform_frac per variant."""
    table = metric_table(runs, ["credit_uniform_frac"])
    estimators = _estimators(runs)
    facts = _facts(runs)
    rows = []
    for variant, estimator in sorted(estimators.items()):
        values = table.loc[table["variant"] == variant, "value"]
        kind = facts[variant]["credit"]
        if values.empty:
            verdict = NOT_JUDGED
        elif kind == "outcome":
            verdict = SUPPORTED if values.min() >= 1 - rules.credit_tolerance else CONTRADICTED
        else:
            verdict = CONTRAST
        rows.append(
            {
                "variant": _label(variant, estimator),
                "estimator": estimator,
                "credit": kind,
                "runs": table.loc[table["variant"] == variant, "run_id"].nunique(),
                "steps": len(values),
                "mean uniform frac": values.mean() if len(values) else np.nan,
                "min uniform frac": values.min() if len(values) else np.nan,
                "verdict": verdict,
            }
        )
    frame = pd.DataFrame(rows)
    judged = [r["verdict"] for r in rows if r["credit"] == "outcome"]
    verdict = combine(judged) if judged else NOT_MEASURED
    evidence = Advantages(tuple(CreditRow(r["variant"], r["credit"], r["mean uniform frac"],
                                          r["min uniform frac"], r["steps"]) for r in rows),
                          bool(judged))
    return verdict, evidence, frame


# ---- claim 2: rank ~2 whatever R -------------------------------------------------------------
def rank_claim(
    runs: list[Run], verdicts: pd.DataFrame, matched: pd.DataFrame, rules: Rules,
    groups: pd.DataFrame | None = None, layers: list | None = None,
) -> Claim:
    """The headline rows of `verdicts` (rank_verdict.rank_verdicts) for the zero-sum variants,
    and beside them (analysis/beside.py) each variant at matched diversity (`groups`:
    diversity.group_frame of `runs`, built when None) and the `layer` gradient's readings
    (`layers`: layer_gradient.layer_readings; none when None)."""
    variants = zero_sum_variants(runs)
    if groups is None:
        groups = diversity.group_frame(runs, rules)
    labels = {v: _label(v, e) for v, e in _estimators(runs).items()}
    shown = beside.claim2_beside(variants, labels, groups, layers or [], rules,
                                 {str(r.path): probe_source(r) for r in runs if is_probe(r)})
    pick = verdicts["variant"].isin(variants)
    primary = verdicts[
        pick
        & (verdicts["matrix"] == rules.rank_matrix)
        & (verdicts["measure"] == rules.rank_measure)
    ]
    matched_by = {
        (m.variant, m.matrix, m.measure): m.reading for m in matched.itertuples(index=False)
    }
    rows = [_rank_row(v, labels.get(v.variant, _label(v.variant, None)), matched_by,
                      shown.columns.get(v.variant, {}))
            for v in primary.itertuples(index=False)]
    rows += shown.layer_rows
    if not rows:
        return Claim(
            2,
            NOT_MEASURED,
            no_zero_sum_ranks(rules.rank_matrix, rules.rank_measure),
            pd.DataFrame(),
        )
    verdicts_, together, counted = _rank_parts_together(primary, runs, rules)
    parts = [counted.get(id(p), p) for v in primary.itertuples(index=False) for p in v.parts]
    if together:
        parts.append(Part("2t", "the parts read together", CONTRAST, together))
    parts += shown.parts  # beside the verdict, not in it
    counts = verdicts[pick]["verdict"].value_counts()
    evidence = Joined((*primary["words"], *([together] if together else []), *shown.parts,
                       VerdictCounts(tuple((w, int(counts[w])) for w in counts.index))))
    verdict = NOT_JUDGED if all(v == NOT_JUDGED for v in verdicts_) else combine(verdicts_)
    return Claim(2, verdict, evidence, pd.DataFrame(rows), parts=parts)


def _rank_row(v, label: str, matched_by: dict, beside_columns: dict) -> dict:
    """Claim 2's table row of one verdict row `v` (rank_verdict.rank_verdicts): each R's
    interval, the slope with its interval, the parts' verdicts, the matched-progress reading and
    the columns shown beside it (beside.claim2_beside)."""
    return {
        "variant": label,
        "matrix": v.matrix,
        "measure": v.measure,
        **{f"R={r}": iv.text(2) + (" capped" if str(r) in v.capped.split(", ") else "")
           for r, iv in sorted(v.intervals.items())},
        "slope / doubling": (
            f"{v.slope:+.2f} [{v.slope_low:+.2f}, {v.slope_high:+.2f}]"
            if np.isfinite(v.slope_low) else ("-" if np.isnan(v.slope) else f"{v.slope:+.2f}")
        ),
        "2a slope = 0": v.verdict_slope_zero,
        "2b growth small": v.verdict_growth,
        "2c ~2": v.verdict_level,
        "verdict": v.verdict,
        "at matched progress (point)": matched_by.get((v.variant, v.matrix, v.measure), "-"),
        **beside_columns,
    }


def _rank_parts_together(primary: pd.DataFrame, runs: list[Run], rules: Rules
                         ) -> tuple[list[str], Together | None, dict[int, Part]]:
    """Claim 2's variants' verdicts as the claim reads them: their 2b and 2c parts together
    (rank_verdict.read_together; a variant with a part not judged stays not judged), what that
    did, and each part read (by id) with its `counted_as`."""
    judged = [v for v in primary.itertuples(index=False) if v.verdict != NOT_JUDGED]
    family = [(v, p) for v in judged for p in v.parts if p.name in VERDICT_PARTS]
    estimators = _estimators(runs)
    read, together, counted = read_together([p for _, p in family],
                                   [f"{p.name} ({_label(v.variant, estimators.get(v.variant))})"
                                    for v, p in family], rules, "parts")
    by_variant: dict[str, list[str]] = {}
    for (v, _), verdict in zip(family, read, strict=True):
        by_variant.setdefault(v.variant, []).append(verdict)
    return [combine(by_variant[v.variant]) if v.verdict != NOT_JUDGED else NOT_JUDGED
            for v in primary.itertuples(index=False)], together, {
        id(p): q for (_, p), q in zip(family, counted, strict=True)}


# ---- claim 3: sparsity grows -------------------------------------------------------------------
def _trend_verdict(test: dict, p_up: float, p_down: float, level: float) -> str:
    """A part's verdict: supported from its unadjusted growth p (the claim needs every part to
    grow, an intersection-union test: no correction, as rules.family_wise says for claims 2 and
    4), contradicted from its Holm-adjusted decline p (`p_down`: any part declining contradicts,
    a union of tests)."""
    if test["seeds"] < 2:
        return NOT_JUDGED
    if p_up <= level:
        return SUPPORTED
    if p_down <= level:
        return CONTRADICTED
    return INCONCLUSIVE


def _more_seeds(iv: bs.Interval, side: str, level: float) -> int | None:
    """Seeds in all at which the one-sided t-test of the mean slope against 0 (`side`: "above",
    growth; "below", decline) reaches `level`, the spread between seeds held fixed (None: beyond
    MAX_SEEDS_ADVICE). bs.Contradiction holds one-sided tests of an interval against a bound."""
    more = bs.Contradiction(((iv, 0.0, side),)).seeds_to_reach(level)
    return None if more is None else iv.n + more


def _trend_facts(row: dict, test: dict, verdict: str, rules: Rules) -> TrendPart:
    """A part's facts (its sentence: words_trend.TrendPart), flip probability and seeds that
    would settle it, at the level its verdict uses: growth at the one-sided level, decline at
    level / m (Holm's first step)."""
    name = trend_name(row["measure"], row["R"], row["variant"] if row["label"] else None)
    iv = test["slope"]
    level, m = rules.one_sided_level, row["family"]
    if verdict == NOT_JUDGED:
        return TrendPart(name, verdict, test["seeds"], level, m, math.nan, math.nan, math.nan,
                         "", math.nan, False, None, None)
    flip = bs.flip_probability(iv.estimate, iv.replicates, lambda v: v > 0)
    growing = bool(iv.estimate > 0)
    seeds = _more_seeds(iv, "above", level) if verdict == INCONCLUSIVE and growing else None
    decline = (_more_seeds(iv, "below", level / max(m, 1))
               if verdict == INCONCLUSIVE and iv.estimate < 0 else None)
    return TrendPart(name, verdict, test["seeds"], level, m, row["p (growth)"],
                     row.get("p (growth, Holm)", math.nan), row["p (decline, Holm)"],
                     row["slope / 100 steps"], flip, growing, seeds, decline)


def _pooled_part(table: pd.DataFrame, rules: Rules) -> Part | None:
    """Claim 3's one pre-registered pooled test of "sparsity grows", beside the parts: per seed,
    the mean over its sparsity parts (run x measure) of the relative slope (100 x slope / the
    run's mean level, % per 100 steps, so that the measures share a scale), one one-sided
    t-test over seeds (trend.pooled_seed_trend; no correction: one test). A seed's runs of every
    R and zero-sum variant are pooled by its seed label: they share its warm start, so the seed,
    not the run, is the independent unit. None without a part."""
    sparse = table[table["metric"].isin(SPARSITY_METRICS)]
    by_seed: dict = {}
    for (_, _), rows in sparse.groupby(["run_id", "metric"]):
        rows = rows.sort_values("step")
        values = rows["value"].to_numpy(float)
        level = abs(float(values.mean())) if len(values) else 0.0
        slope = trend.series_slope(rows["step"].to_numpy(float), values) if len(values) > 1 else math.nan
        if level > 0 and math.isfinite(slope):
            by_seed.setdefault(rows["seed"].iloc[0], []).append(1e4 * slope / level)
    if not by_seed:
        return None
    test = trend.pooled_seed_trend(by_seed, rules.confidence, rng_for(rules, "claim 3 pooled"),
                                   rules.resamples)
    level = rules.one_sided_level
    verdict = (NOT_JUDGED if test["seeds"] < 2
               else _trend_verdict(test, test["p_up"], test["p_down"], level))
    facts = PooledPart(sum(len(v) for v in by_seed.values()), verdict, test["seeds"],
                       test["slope"], test["p_up"], test["p_down"], level)
    return Part("3p", POOLED_QUESTION, verdict, facts)


def sparsity_claim(runs: list[Run], rules: Rules) -> Claim:
    """Claim 3: per variant x measure x R, the seed-level trend test (trend.seed_trend); the
    sparsity parts' p-values Holm-adjusted together, the zero-advantage reading beside them
    (its own family)."""
    table = _sparsity_table(runs)
    zero_at = table[table["metric"] == ZERO_ADVANTAGE_METRIC].set_index(["run_id", "step"])[
        "value"]
    zero_at = zero_at[~zero_at.index.duplicated()]
    estimators = _estimators(runs)
    rows, tests = [], []
    for (variant, metric, size), part in table.groupby(["variant", "metric", "group_size"]):
        row, test = _trend_row(variant, metric, size, part, zero_at, rules)
        rows.append({"variant": _label(variant, estimators.get(variant)), **row})
        tests.append(test)
    held_p = _holm_columns(rows)
    parts = []
    for row, test in zip(rows, tests, strict=True):
        verdict = _trend_verdict(test, row["p (growth)"], row["p (decline, Holm)"],
                                 rules.one_sided_level)
        facts = _trend_facts(row, test, verdict, rules)
        row |= {"verdict": verdict, "flip": facts.flip}
        parts.append(Part("3" if row["reading"] == "sparsity" else "3z", row["reading"],
                          verdict, facts, facts.flip, facts.more_seeds))
    frame = pd.DataFrame(rows).drop(columns=["label", "family"], errors="ignore")
    if frame.empty or not (frame["reading"] == "sparsity").any():
        return Claim(3, NOT_MEASURED, NO_SPARSITY, frame, parts=parts)
    judged = [p for p in parts if p.name == "3"]
    pooled = _pooled_part(table, rules)
    parts += [pooled] if pooled else []
    zero = _zero_advantage_reading([p for p in parts if p.name == "3z"], held_p, rules)
    evidence = Joined((*judged, *([pooled] if pooled else []), *([zero] if zero else [])))
    return Claim(3, combine(p.verdict for p in judged), evidence, frame, parts=parts)


def _sparsity_table(runs: list[Run]) -> pd.DataFrame:
    """metric_table of the sparsity measures and zero_variance_frac for the zero-sum variants;
    a step with a zero gradient (every group had equal rewards) is fully sparse by definition,
    so its sparsity is left out."""
    table = metric_table(runs, [*SPARSITY_METRICS, ZERO_ADVANTAGE_METRIC, "grad_norm"])
    table = table[table["variant"].isin(zero_sum_variants(runs))]
    zero = table.loc[(table["metric"] == "grad_norm") & (table["value"] == 0), ["run_id", "step"]]
    keep = ~table.set_index(["run_id", "step"]).index.isin(pd.MultiIndex.from_frame(zero))
    sparse = table[keep & table["metric"].isin(SPARSITY_METRICS)]
    return pd.concat([sparse, table[table["metric"] == ZERO_ADVANTAGE_METRIC]])


def _trend_row(variant, metric: str, size, part: pd.DataFrame, zero_at: pd.Series, rules: Rules
               ) -> tuple[dict, dict]:
    """One claim-3 part's row (without the variant label) and its seed-level trend test: the
    test, the trend left with zero_variance_frac as a covariate, Mann-Kendall and Sen."""
    by_run = {run_id: r.sort_values("step") for run_id, r in part.groupby("run_id")}
    series = [(r["step"].to_numpy(float), r["value"].to_numpy(float)) for r in by_run.values()]
    rng = rng_for(rules, variant, metric, size)
    test = trend.seed_trend(series, rules.confidence, rng, rules.resamples)
    controlled = {"slope": bs.no_interval(math.nan, 0), "p_up": math.nan}
    if metric != ZERO_ADVANTAGE_METRIC:  # the trend that zero-advantage groups leave
        with_zero = []  # (steps, values, zero_variance_frac at those steps) per run
        for (steps, values), (run_id, r) in zip(series, by_run.items(), strict=True):
            keys = [(run_id, step) for step in r["step"]]
            if all(k in zero_at.index for k in keys):
                with_zero.append((steps, values, zero_at.loc[keys].to_numpy(float)))
        controlled = trend.seed_trend(with_zero, rules.confidence, rng, rules.resamples)
    held = controlled["slope"]
    described = trend.mann_kendall(series, rules.one_sided_level)
    first, last = part["step"].min(), part["step"].max()
    iv = test["slope"]
    per_100 = bs.Interval(100 * iv.estimate, 100 * iv.low, 100 * iv.high, iv.n)
    sen = (f"{100 * described['sen']:+.3f} [{100 * described['sen_low']:+.3f}, "
           f"{100 * described['sen_high']:+.3f}]")
    row = {
        "label": bool(variant),
        "reading": "zero-advantage groups" if metric == ZERO_ADVANTAGE_METRIC else "sparsity",
        "measure": metric,
        "R": int(size),
        "seeds": test["seeds"],
        "points": described["n_points"],
        "first": part.loc[part["step"] == first, "value"].mean(),
        "last": part.loc[part["step"] == last, "value"].mean(),
        "slope / 100 steps": per_100.text(3, sign=True),
        # the same interval as numbers, for the headline sentence and claim 3's figure
        "slope per 100": per_100.estimate,
        "slope per 100 low": per_100.low,
        "slope per 100 high": per_100.high,
        "p (growth)": test["p_up"],
        "p (decline)": test["p_down"],
        "slope given zero-adv. / 100 steps": "-" if held.n == 0 else bs.Interval(
            100 * held.estimate, 100 * held.low, 100 * held.high, held.n).text(3, True),
        "p (growth given zero-adv.)": controlled["p_up"],
        "S": described["S"],
        "Sen slope / 100 steps": sen,
        "lag-1 autocorr.": described["lag1"],
        "test": "seed-level t on per-seed slopes",
    }
    return row, test


def _holm_columns(rows: list[dict]) -> list[float]:
    """Holm-adjusted p-values into `rows`, within each reading (sparsity; zero-advantage groups);
    returns the sparsity parts' Holm-adjusted p of growth given zero-advantage groups."""
    for reading in ("sparsity", "zero-advantage groups"):
        family = [i for i, r in enumerate(rows) if r["reading"] == reading]
        up = holm([rows[i]["p (growth)"] for i in family])
        down = holm([rows[i]["p (decline)"] for i in family])
        tested = sum(np.isfinite(rows[i]["p (growth)"]) for i in family)
        for i, u, d in zip(family, up, down, strict=True):
            rows[i] |= {"p (growth, Holm)": u, "p (decline, Holm)": d, "family": int(tested)}
    sparsity_rows = [r for r in rows if r["reading"] == "sparsity"]
    held_p = holm([r["p (growth given zero-adv.)"] for r in sparsity_rows])
    for r, p_held in zip(sparsity_rows, held_p, strict=True):
        r["p (growth given zero-adv., Holm)"] = p_held
    return held_p


def _zero_advantage_reading(zero_adv: list[Part], held_p: list[float], rules: Rules
                            ) -> ZeroAdvantage | None:
    """The zero-advantage reading and the trend left after it (None without it)."""
    if not zero_adv:
        return None
    tested = [p_held for p_held in held_p if np.isfinite(p_held)]
    return ZeroAdvantage(ZERO_ADVANTAGE_METRIC, combine(p.verdict for p in zero_adv), len(tested),
                         sum(p <= rules.one_sided_level for p in tested))


# ---- claim 4: per-token credit raises the rank -------------------------------------------------
def falsifier_claim(runs: list[Run], rules: Rules, same_rows: pd.DataFrame | None = None,
                    groups: pd.DataFrame | None = None) -> Claim:
    """Claim 4 on claim 2's matrix and rows, the batch matrix beside it (analysis/falsifier.py;
    `same_rows`: the runs' credit_compare.same_rows_table, `groups`: their
    diversity.group_frame, where the caller has them)."""
    verdict, evidence, table, parts = falsifier_reading(runs, rules, same_rows, groups)
    return Claim(4, verdict, evidence, table, parts=parts)


def judge_claims(runs: list[Run], verdicts: pd.DataFrame, matched: pd.DataFrame, rules: Rules,
                 weights: pd.DataFrame, same_rows: pd.DataFrame | None = None,
                 ranks: pd.DataFrame | None = None) -> list[Claim]:
    """The four claims, in order, each with its rule text filled in (`weights`: claim 1b's
    token_weights.token_weight_table; `same_rows`: claim 4's, see `falsifier_claim`; `ranks`:
    tables.rank_table, for the layer gradient beside claim 2, none when None)."""
    families = Families.of(runs)
    groups = diversity.group_frame(runs, rules)  # claims 2 and 4 at matched diversity
    layers = (layer_gradient.layer_readings(ranks, zero_sum_variants(runs), rules)
              if ranks is not None else None)
    claims = [
        credit_claim(runs, rules, weights, families),
        rank_claim(runs, verdicts, matched, rules, groups, layers),
        sparsity_claim(runs, rules),
        falsifier_claim(runs, rules, same_rows, groups),
    ]
    zero_sum = set(zero_sum_variants(runs))
    per_token = {v for v, f in _facts(runs).items() if estimator_family(f) == PER_TOKEN}
    read_by = {2: zero_sum, 3: zero_sum, 4: zero_sum | per_token}  # the variants each claim reads
    return [claims[0], *(
        replace(claim, rule=rules.text(claim.number, families),
                unit=claim.unit if claim.verdict == NOT_MEASURED  # no reading, no unit
                else units.unit_of(r for r in runs if r.variant in read_by[claim.number]))
        for claim in claims[1:]
    )]


def claims_table(claims: list[Claim]) -> pd.DataFrame:
    """claim, statement, verdict, parts, unit, evidence: the opening table of summary.md; the
    evidence ends with the unit's sentence (the population its intervals speak for)."""
    return pd.DataFrame(
        [
            {
                "claim": c.number,
                "statement": c.statement,
                "verdict": c.verdict,
                "parts": c.parts_text,
                "unit": c.unit.words if c.unit else "-",
                "evidence": c.evidence + (f" {c.unit.sentence()}" if c.unit else ""),
            }
            for c in claims
        ]
    )
