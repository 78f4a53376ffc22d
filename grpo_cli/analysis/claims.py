"""The paper's four claims, one verdict each, with the rule used and the numbers behind it.

1. Under outcome-only rewards every token of a rollout gets the same advantage.
2. The gradient matrix has effective rank ~2 whatever the group size R.
3. Gradient sparsity grows over training.
4. Per-token credit (the paper's falsifier) raises the rank well above 2.

A claim is judged in parts (per estimator, per R, per measure); the parts' verdicts are "holds",
"fails" or "undetermined" (too little data to tell), and `combine` turns them into the claim's
verdict: "holds" when every part holds, "fails" when every part that could be judged fails,
"mixed" when some hold and others fail or cannot be judged, "undetermined" when no part could
be judged, and "not measured" when the results hold no run the claim's rule can use (e.g. claim 4
needs an outcome and a per-token estimator side by side, as in `make settle`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from grpo_cli.analysis.load import Run
from grpo_cli.analysis.summary import Rule, verdict_rows
from grpo_cli.analysis.tables import metric_table, progress_edges, with_x

HOLDS, FAILS, MIXED = "holds", "fails", "mixed"
UNDETERMINED, NOT_MEASURED = "undetermined", "not measured"
ESTIMATOR_KEY = "algorithm.name"
SPARSITY_METRICS = ("grad_sparsity", "grad_hoyer")
STATEMENTS = {
    1: "Under outcome-only rewards every token of a rollout gets the same advantage.",
    2: "The gradient matrix has effective rank ~2 whatever the group size R.",
    3: "Gradient sparsity grows over training.",
    4: "Per-token credit raises the rank well above 2.",
}


@dataclass(frozen=True)
class ClaimRules:
    """Thresholds of the four rules; `rank` is claim 2's rule (the `grpo analyze` verdict rule)."""

    rank: Rule = field(default_factory=Rule)
    credit_tolerance: float = 1e-9  # claim 1: credit_uniform_frac >= 1 - tolerance at every step
    trend_z: float = 1.96  # claim 3: Mann-Kendall z above this (one-sided 2.5% level)
    margin: float = 0.5  # claim 4: per-token rank >= outcome rank + margin and >= 2 + margin
    rank_matrix: str = "rollout_group"  # claim 2's headline matrix ...
    rank_measure: str = "erank_entropy"  # ... and measure (also claim 4's measure)
    falsifier_matrix: str = "rollout_batch"  # claim 4's matrix (not capped at R rows)

    def text(self, claim: int, last_fraction: float) -> str:
        target = f"{self.rank.target:g}"
        if claim == 1:
            return (
                "Per estimator, credit_uniform_frac (metrics.csv: the fraction of rollouts whose "
                "completion tokens all got the same advantage) is read at every step of every "
                f"run. An outcome estimator holds iff it is >= 1 - {self.credit_tolerance:g} at "
                "every step; ppo and process (per-token credit) are shown for contrast, not "
                "judged."
            )
        if claim == 2:
            return (
                f"The rank verdict below ({self.rank_matrix} / {self.rank_measure}, the group's "
                "R x P gradient that the paper's zero-sum argument is about), for every grpo, "
                "dr_grpo or rloo variant: " + self.rank.text(last_fraction)
            )
        if claim == 3:
            return (
                "Per variant, R and measure (grad_sparsity, grad_hoyer on probe steps), a "
                "Mann-Kendall trend test over steps, pooled over seeds: S = sum over seeds of "
                "sum_{i<j} sign(x_j - x_i), Var = sum n(n-1)(2n+5)/18 (no tie correction, "
                f"which is conservative), z = (S - sign S) / sqrt(Var); steps with a zero "
                "gradient (grad_norm 0: every group had equal rewards) are left out, being fully "
                "sparse by definition. Holds iff z > "
                f"{self.trend_z:g} (growth at the one-sided 2.5% level), fails otherwise; "
                "undetermined when even a strictly increasing series could not reach that z "
                "(too few probe steps). Judged on grpo, dr_grpo and rloo variants."
            )
        return (
            f"{self.falsifier_matrix} / {self.rank_measure} at matched training reward: per R, "
            "the rank is averaged within training-reward bins (first within a run, then over "
            "seeds), then over the bins that both the outcome variant (grpo, dr_grpo, rloo) and "
            "the per-token variant (ppo, process) reach. Holds iff the per-token rank is >= the "
            f"outcome rank + {self.margin:g} and >= {target} + {self.margin:g}; undetermined "
            f"without a common bin. {self.falsifier_matrix} is used because a group matrix has "
            "only R rows, so at R = 2 no estimator can raise its rank above 2."
        )


@dataclass
class Claim:
    number: int  # 1..4, see STATEMENTS
    verdict: str  # holds | fails | mixed | undetermined | not measured
    evidence: str  # the numbers behind the verdict, in one or two sentences
    table: pd.DataFrame = field(default_factory=pd.DataFrame)  # one row per judged part
    rule: str = ""  # the rule, in words (ClaimRules.text)

    @property
    def statement(self) -> str:
        return STATEMENTS[self.number]


def combine(parts: list[str]) -> str:
    """A claim's verdict from its parts' verdicts (module docstring)."""
    determined = [v for v in parts if v in (HOLDS, FAILS)]
    if not determined:
        return UNDETERMINED
    if all(v == HOLDS for v in parts):
        return HOLDS
    if all(v == FAILS for v in determined):
        return FAILS
    return MIXED


def _estimators(runs: list[Run]) -> dict[str, str | None]:
    """variant label -> estimator (algorithm.name) of its runs."""
    return {run.variant: run.config.get(ESTIMATOR_KEY) for run in runs}


def _facts(runs: list[Run]) -> dict[str, dict]:
    """variant label -> its runs' estimator facts (run.json's estimator_facts; Run.estimator_facts)."""
    return {run.variant: run.estimator_facts for run in runs}


def _zero_sum_variants(runs: list[Run]) -> list[str]:
    return sorted(v for v, f in _facts(runs).items() if f["zero_sum_group"])


def _label(variant: str, estimator: str | None) -> str:
    return variant or str(estimator)


# ---- claim 1: uniform credit -------------------------------------------------------------------
def credit_claim(runs: list[Run], rules: ClaimRules) -> Claim:
    table = metric_table(runs, ["credit_uniform_frac"])
    estimators = _estimators(runs)
    facts = _facts(runs)
    rows = []
    for variant, estimator in sorted(estimators.items()):
        values = table.loc[table["variant"] == variant, "value"]
        kind = facts[variant]["credit"]
        if values.empty:
            verdict = UNDETERMINED
        elif kind == "outcome":
            verdict = HOLDS if values.min() >= 1 - rules.credit_tolerance else FAILS
        else:
            verdict = "contrast"
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
    evidence = "; ".join(
        f"{r['variant']} ({r['credit']}): uniform credit in {r['mean uniform frac']:.3f} of "
        f"rollouts on average, {r['min uniform frac']:.3f} at worst, over {r['steps']} steps"
        for r in rows
        if r["steps"]
    )
    return Claim(1, verdict, evidence or "no credit_uniform_frac recorded", frame)


# ---- claim 2: rank ~2 whatever R -------------------------------------------------------------
def rank_claim(
    runs: list[Run], verdicts: pd.DataFrame, matched: pd.DataFrame, rules: ClaimRules
) -> Claim:
    variants = _zero_sum_variants(runs)
    pick = verdicts["variant"].isin(variants)
    primary = verdicts[
        pick
        & (verdicts["matrix"] == rules.rank_matrix)
        & (verdicts["measure"] == rules.rank_measure)
    ]
    matched_by = {
        (m.variant, m.matrix, m.measure): m.verdict for m in matched.itertuples(index=False)
    }
    rows = [
        {
            "variant": _label(v.variant, _estimators(runs).get(v.variant)),
            "matrix": v.matrix,
            "measure": v.measure,
            **{f"R={r}": m for r, m in sorted(v.means.items())},
            "slope / doubling": v.slope,
            "max dev. from 2": v.max_deviation,
            "verdict": v.verdict,
            "at matched progress": matched_by.get((v.variant, v.matrix, v.measure), "-"),
        }
        for v in primary.itertuples(index=False)
    ]
    if not rows:
        return Claim(
            2,
            NOT_MEASURED,
            f"no {rules.rank_matrix} / {rules.rank_measure} ranks from a grpo, dr_grpo or rloo run",
            pd.DataFrame(),
        )
    counts = verdicts[pick]["verdict"].value_counts()
    evidence = " ".join(primary["sentence"]) + (
        f" Over every matrix x measure pair of these variants: {counts.get(HOLDS, 0)} hold, "
        f"{counts.get(FAILS, 0)} fail, {counts.get(UNDETERMINED, 0)} undetermined "
        "(table 'Verdicts' below)."
    )
    return Claim(2, combine(list(primary["verdict"])), evidence, pd.DataFrame(rows))


# ---- claim 3: sparsity grows -------------------------------------------------------------------
def mann_kendall(series: list[np.ndarray]) -> dict:
    """Pooled Mann-Kendall statistic over independent series (each ordered in time).

    Returns S, Var, z (continuity-corrected) and max_z, the z of strictly increasing series of
    the same lengths (the most the data could show).
    """
    s, var, pairs = 0.0, 0.0, 0
    for x in series:
        n = len(x)
        if n < 2:
            continue
        diff = x[None, :] - x[:, None]  # [n, n]: x_j - x_i
        s += float(np.sign(diff[np.triu_indices(n, k=1)]).sum())
        var += n * (n - 1) * (2 * n + 5) / 18
        pairs += n * (n - 1) // 2
    if var <= 0:
        return {"S": s, "var": var, "z": np.nan, "max_z": np.nan}
    z = (s - math.copysign(1.0, s)) / math.sqrt(var) if s else 0.0
    return {"S": s, "var": var, "z": z, "max_z": (pairs - 1) / math.sqrt(var)}


def sparsity_claim(runs: list[Run], rules: ClaimRules) -> Claim:
    variants = _zero_sum_variants(runs)
    table = metric_table(runs, [*SPARSITY_METRICS, "grad_norm"])
    table = table[table["variant"].isin(variants)]
    # a zero gradient (every group had equal rewards) is fully sparse by definition: left out
    zero = table.loc[(table["metric"] == "grad_norm") & (table["value"] == 0), ["run_id", "step"]]
    keep = ~table.set_index(["run_id", "step"]).index.isin(pd.MultiIndex.from_frame(zero))
    table = table[keep & table["metric"].isin(SPARSITY_METRICS)]
    rows = []
    for (variant, metric, size), part in table.groupby(["variant", "metric", "group_size"]):
        series = [
            rows_.sort_values("step")["value"].to_numpy(float)
            for _, rows_ in part.groupby("run_id")
        ]
        test = mann_kendall(series)
        if not np.isfinite(test["max_z"]) or test["max_z"] <= rules.trend_z:
            verdict = UNDETERMINED
        else:
            verdict = HOLDS if test["z"] > rules.trend_z else FAILS
        first, last = part["step"].min(), part["step"].max()
        rows.append(
            {
                "variant": _label(variant, _estimators(runs).get(variant)),
                "measure": metric,
                "R": int(size),
                "seeds": len(series),
                "points": int(sum(len(x) for x in series)),
                "first": part.loc[part["step"] == first, "value"].mean(),
                "last": part.loc[part["step"] == last, "value"].mean(),
                "S": test["S"],
                "z": test["z"],
                "verdict": verdict,
            }
        )
    frame = pd.DataFrame(rows)
    if frame.empty:
        return Claim(
            3,
            NOT_MEASURED,
            "no grad_sparsity / grad_hoyer on probe steps of a grpo, dr_grpo or rloo run",
            frame,
        )
    evidence = "; ".join(
        f"{metric}: "
        + ", ".join(
            f"R={r.R} {r.first:.3f} -> {r.last:.3f} (z {r.z:+.2f}, {r.verdict})"
            for r in part.itertuples(index=False)
        )
        for metric, part in frame.groupby("measure", sort=False)
    )
    return Claim(3, combine(list(frame["verdict"])), evidence, frame)


# ---- claim 4: per-token credit raises the rank -------------------------------------------------
def falsifier_claim(
    runs: list[Run], ranks: pd.DataFrame, rules: ClaimRules, progress_bins: int
) -> Claim:
    """`ranks`: tables.rank_table; compared within `progress_bins` training-reward bins."""
    estimators = _estimators(runs)
    outcome = _zero_sum_variants(runs)
    per_token = [v for v, f in _facts(runs).items() if f["credit"] == "per_token"]
    if not outcome or not per_token:
        return Claim(
            4,
            NOT_MEASURED,
            "the results do not hold both an outcome estimator (grpo, dr_grpo, rloo) and a "
            "per-token one (ppo, process); run `make settle` for the comparison",
            pd.DataFrame(),
        )
    table = verdict_rows(ranks) if not ranks.empty else ranks
    if not table.empty:
        table = table[
            (table["matrix"] == rules.falsifier_matrix) & (table["measure"] == rules.rank_measure)
        ]
        table = with_x(table, runs, "reward", progress_edges(runs, "reward", progress_bins))
    per_bin = (
        table.groupby(["variant", "group_size", "run_id", "x"], as_index=False)["value"]
        .mean()
        .groupby(["variant", "group_size", "x"])["value"]
        .mean()
        if not table.empty
        else pd.Series(dtype=float)
    )
    target = rules.rank.target
    rows = []
    for base in sorted(outcome):
        for other in sorted(per_token):
            sizes = sorted({int(r) for (v, r, _) in per_bin.index if v in (base, other)})
            for size in sizes:
                a = per_bin.get((base, size), pd.Series(dtype=float))
                b = per_bin.get((other, size), pd.Series(dtype=float))
                common = sorted(set(a.index) & set(b.index))
                mean_a = float(a[common].mean()) if common else np.nan
                mean_b = float(b[common].mean()) if common else np.nan
                if not common:
                    verdict = UNDETERMINED
                elif mean_b >= mean_a + rules.margin and mean_b >= target + rules.margin:
                    verdict = HOLDS
                else:
                    verdict = FAILS
                rows.append(
                    {
                        "outcome": _label(base, estimators[base]),
                        "per-token": _label(other, estimators[other]),
                        "R": size,
                        "common reward bins": len(common),
                        "outcome rank": mean_a,
                        "per-token rank": mean_b,
                        "difference": mean_b - mean_a,
                        "verdict": verdict,
                    }
                )
    frame = pd.DataFrame(rows)
    if frame.empty:
        return Claim(
            4,
            UNDETERMINED,
            f"no {rules.falsifier_matrix} / {rules.rank_measure} ranks for these estimators",
            frame,
        )
    evidence = "; ".join(
        f"{r['per-token']} vs {r['outcome']} at R={r['R']}: {r['per-token rank']:.2f} vs "
        f"{r['outcome rank']:.2f} ({r['verdict']})"
        if r["common reward bins"]
        else f"{r['per-token']} vs {r['outcome']} at R={r['R']}: no common reward bin"
        for r in frame.to_dict("records")
    )
    return Claim(4, combine(list(frame["verdict"])), evidence, frame)


def judge_claims(
    runs: list[Run],
    verdicts: pd.DataFrame,
    matched: pd.DataFrame,
    ranks: pd.DataFrame,
    rules: ClaimRules,
    last_fraction: float,
    progress_bins: int,
) -> list[Claim]:
    """The four claims, in order, each with its rule text filled in."""
    claims = [
        credit_claim(runs, rules),
        rank_claim(runs, verdicts, matched, rules),
        sparsity_claim(runs, rules),
        falsifier_claim(runs, ranks, rules, progress_bins),
    ]
    for claim in claims:
        claim.rule = rules.text(claim.number, last_fraction)
    return claims


def claims_table(claims: list[Claim]) -> pd.DataFrame:
    """claim, statement, verdict, evidence: the opening table of summary.md."""
    return pd.DataFrame(
        [
            {
                "claim": c.number,
                "statement": c.statement,
                "verdict": c.verdict,
                "evidence": c.evidence,
            }
            for c in claims
        ]
    )
