"""One sentence per claim that says what decided its verdict (<= HEADLINE_LIMIT characters):
the answer summary.md, report.html and the --write-docs blocks open with.

Every number comes from the readings the claims already hold (claim 2's verdict rows with
their intervals, claim 3's table of per-part trend tests, claim 4's parts and their
contradiction tests, claim 1's tables); nothing here computes a statistic, it only chooses
which reading decided and writes it.
"""

from __future__ import annotations

import math

import pandas as pd

from grpo_cli.analysis.claims import Claim
from grpo_cli.analysis.rules import (
    CONTRADICTED,
    INCONCLUSIVE,
    NOT_JUDGED,
    NOT_MEASURED,
    SUPPORTED,
    Rules,
    combine,
)
from grpo_cli.analysis.tables import LAYER_MEAN

HEADLINE_LIMIT = 300  # characters: a sentence a reader takes in at a glance
MORE = "; {n} more in details.md"


def fit(clauses: list[str], limit: int, tail: str = "") -> str:
    """`clauses` joined by "; " up to `limit` characters (with `tail`), naming how many were
    left out; at least the first clause."""
    kept: list[str] = []
    for k, clause in enumerate(clauses):
        left = len(clauses) - k - 1
        more = MORE.format(n=left) if left else ""
        if kept and len("; ".join([*kept, clause]) + more + tail) > limit:
            return "; ".join(kept) + MORE.format(n=len(clauses) - k) + tail
        kept.append(clause)
    return "; ".join(kept) + tail


def bounded(text: str, limit: int = HEADLINE_LIMIT) -> str:
    """`text` if it fits, else cut at the last clause boundary that does, pointing on."""
    if len(text) <= limit:
        return text
    tail = " (details.md)."
    cut = text[: limit - len(tail)]
    cut = cut[: max(cut.rfind("; "), cut.rfind(", "), cut.rfind(": "), 1)]
    return cut.rstrip(" ;,:.") + tail


def _named(variant: str, text: str) -> str:
    return f"{variant}: {text}" if variant else text


# ---- claim 1 ---------------------------------------------------------------------------------
def credit_headline(claim: Claim, weights: pd.DataFrame) -> str:
    """1a's worst uniform-credit fraction per outcome variant, and 1b's worst uniform-token-
    weight fraction where recorded (token_weights.token_weight_table)."""
    table = claim.table
    if table.empty or "credit" not in table:
        return bounded(claim.evidence)
    outcome = table[(table["credit"] == "outcome") & (table["steps"] > 0)]
    first = [f"{r['min uniform frac']:.3f} ({r['variant']}, {r['steps']} steps)"
             for r in outcome.to_dict("records")]
    text = fit(first, HEADLINE_LIMIT // 2, "")
    out = (f"1a {claim.parts[0].verdict}: a share of at worst {text} of rollouts gave every "
           "token one advantage (true by construction)")
    empirical = [p for p in claim.parts if p.name == "1b"]
    if empirical and not weights.empty:
        rows = weights[(weights["credit"] == "outcome") & (weights["steps"] > 0)]
        second = [f"{r['min uniform frac']:.3f} ({r['variant']})" for r in rows.to_dict("records")]
        out += (f"; 1b {combine(p.verdict for p in empirical)}: the loss gradient weighted "
                f"every token equally in a share of at worst {fit(second, HEADLINE_LIMIT // 3)} "
                "of informative rollouts")
    return bounded(out + ".")


# ---- claim 2 ---------------------------------------------------------------------------------
def _rank_clause(v, rules: Rules, points: bool) -> str:
    """One variant's deciding reading: its slope per doubling (2b) and its rank per judged R
    (2c), or only the largest judged R's where `points` is False."""
    if not math.isfinite(v.slope):
        return _named(v.variant, f"{NOT_JUDGED} ({v.judged or 'no judged R'})")
    judged = [int(r) for r in str(v.judged).split(", ") if r]
    slope = f"{v.slope:+.2f}"
    if math.isfinite(v.slope_low) and math.isfinite(v.slope_high):
        slope += f" [{v.slope_low:+.2f}, {v.slope_high:+.2f}]"
    shown = judged if points else judged[-1:]
    ranks = ", ".join(f"R={r} {v.intervals[r].text(2)}" for r in shown if r in v.intervals)
    return _named(v.variant, (
        f"slope {slope} per doubling over R={', '.join(map(str, judged))} (2b, within "
        f"+-{rules.growth_tolerance:g}: {v.verdict_growth}); rank {ranks} (2c, "
        f"{rules.target:g} +- {rules.band:g}: {v.verdict_level})"))


def rank_headline(claim: Claim, verdicts: pd.DataFrame, rules: Rules, variants: list[str]) -> str:
    """Claim 2's deciding slope with its interval and the rank at each judged R, per zero-sum
    variant (`verdicts`: rank_verdict.rank_verdicts; `variants`: claims.zero_sum_variants)."""
    if claim.verdict == NOT_MEASURED:
        return bounded(claim.evidence)
    primary = verdicts[verdicts["variant"].isin(variants)
                       & (verdicts["matrix"] == rules.rank_matrix)
                       & (verdicts["measure"] == rules.rank_measure)]
    head = f"{rules.rank_matrix} / {rules.rank_measure}: "
    rows = list(primary.itertuples(index=False))
    for points in (True, False):
        text = head + "; ".join(_rank_clause(v, rules, points) for v in rows) + "."
        if len(text) <= HEADLINE_LIMIT:
            return text
    return head + fit([_rank_clause(v, rules, False) for v in rows], HEADLINE_LIMIT - len(head),
                      ".")


LAYER_BESIDE = ("layer", "stable_rank")  # the weight-shaped gradient the paper's "SVD of GRPO gradients" most plausibly means


def layer_beside_headline(verdicts: pd.DataFrame, rules: Rules, variants: list[str]) -> str | None:
    """Claim 2's rule on the pooled `layer` stable rank (the verdict table's row, mean over the
    probed weights), shown beside the verdict; None where the results hold no such row."""
    matrix, measure = LAYER_BESIDE
    rows = verdicts[verdicts["variant"].isin(variants) & (verdicts["matrix"] == matrix)
                    & (verdicts["measure"] == measure) & (verdicts["layer"] == LAYER_MEAN)]
    if rows.empty:
        return None
    head = f"Beside it, not in the verdict: {matrix} / {measure} (mean over weights): "
    clauses = [_rank_clause(v, rules, False) for v in rows.itertuples(index=False)]
    return bounded(head + fit(clauses, HEADLINE_LIMIT - len(head), "."))


# ---- claim 3 ---------------------------------------------------------------------------------
def sparsity_headline(claim: Claim, rules: Rules) -> str:
    """How many sparsity parts (measure x R) grow, are inconclusive or decline, and the part
    that decided: the steepest decline where one declines, else the weakest growth."""
    table = claim.table
    if claim.verdict == NOT_MEASURED or table.empty or "slope per 100" not in table:
        return bounded(claim.evidence)
    parts = table[table["reading"] == "sparsity"]
    counts = parts["verdict"].value_counts()
    level = rules.one_sided_level
    declines = counts.get(CONTRADICTED, 0)
    p = "p (decline, Holm)" if declines else "p (growth)"
    tested = parts[parts[p].notna()] if len(parts) else parts
    text = (f"{counts.get(SUPPORTED, 0)} of {len(parts)} sparsity parts (measure x R) grow at the "
            f"one-sided {level:g} level, {counts.get(INCONCLUSIVE, 0)} inconclusive, "
            f"{declines} decline"
            + (f", {counts[NOT_JUDGED]} not judged" if counts.get(NOT_JUDGED, 0) else "")
            + " (every part must grow)")
    if len(tested):  # the part that decided: the steepest decline, else the weakest growth
        row = tested.loc[tested[p].idxmin() if declines else tested[p].idxmax()]
        text += (f"; {'steepest decline' if declines else 'weakest growth'}: {row['measure']} "
                 f"R={row['R']}, {row['slope per 100']:+.3f} [{row['slope per 100 low']:+.3f}, "
                 f"{row['slope per 100 high']:+.3f}] per 100 steps, p = {row[p]:.2g}")
    pooled = next((p_.verdict for p_ in claim.parts if p_.name == "3p"), None)
    return bounded(text + (f"; pooled test {pooled}." if pooled else "."))


# ---- claim 4 ---------------------------------------------------------------------------------
def falsifier_headline(claim: Claim, rules: Rules) -> str:
    """How many judged pairs read supported, contradicted (read together: Holm) or
    inconclusive, and the deciding pair's difference against the margin."""
    judged = [p for p in claim.parts if p.name == "4" and p.verdict != NOT_JUDGED]
    if claim.verdict == NOT_MEASURED or not judged:
        return bounded(claim.evidence)
    counted = [p.counted_as or p.verdict for p in judged]
    contradicted = [p for p, c in zip(judged, counted, strict=True) if c == CONTRADICTED]
    text = (f"of {len(judged)} judged pairs (per-token vs outcome at an R > {rules.target:g}), "
            f"{counted.count(SUPPORTED)} supported, {len(contradicted)} contradicted read "
            f"together (Holm, one-sided {rules.one_sided_level:g}), "
            f"{counted.count(INCONCLUSIVE)} inconclusive")
    with_tests = [p for p in judged if p.contradiction is not None]
    if contradicted:  # the strongest contradiction decided
        deciding = min((p for p in contradicted if p.contradiction is not None),
                       key=lambda p: p.p_contradict, default=None)
    else:  # the pair closest to its bound decided
        deciding = min(with_tests, key=lambda p: p.contradiction.tests[0][0].low, default=None)
    if deciding is not None:
        interval, bound, _ = deciding.contradiction.tests[0]
        text += (f"; deciding: {deciding.question}, per-token minus outcome "
                 f"{interval.text(2, sign=True)} against {bound:g}")
    return bounded(text[0].upper() + text[1:] + ".")


def headlines(claims: list[Claim], verdicts: pd.DataFrame, weights: pd.DataFrame, rules: Rules,
              variants: list[str]) -> dict[int, str]:
    """claim number -> its one sentence (`variants`: the zero-sum variants claim 2 reads)."""
    writers = {
        1: lambda c: credit_headline(c, weights),
        2: lambda c: rank_headline(c, verdicts, rules, variants),
        3: lambda c: sparsity_headline(c, rules),
        4: lambda c: falsifier_headline(c, rules),
    }
    return {c.number: writers[c.number](c) for c in claims}
