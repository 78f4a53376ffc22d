"""Claim 1's empirical reading: is the loss gradient's weight uniform over a rollout's tokens?

`credit_uniform_frac` (the advantages tensor) is true by construction for outcome estimators,
which broadcast one scalar over the tokens. What can fail is the loss: after clipping, importance
ratios, a KL term and token aggregation, the effective weight d loss / d log pi(y_t) that each
token's score gets need not be uniform within a rollout. metrics.csv
`token_weight_uniform_frac` records, per step, the fraction of informative rollouts whose
weights are uniform to a relative 1e-6 (grpo_cli/algorithm/loss.py `token_loss_weights`).

Per variant: the steps recorded, the mean and the smallest fraction, and a reading: "uniform"
when every informative rollout of every step had uniform weights, "not uniform" otherwise, with
the share of steps where some rollout's weights varied. `empirical_parts` are claim 1's part 1b
beside the advantages check (1a; analysis/claims.py credit_claim).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from grpo_cli.analysis.load import Run
from grpo_cli.analysis.parts import Joined, Part
from grpo_cli.analysis.rules import CONTRADICTED, SUPPORTED
from grpo_cli.analysis.tables import metric_table
from grpo_cli.analysis.words_credit import (
    COLUMN,
    NOT_RECORDED,
    NOT_UNIFORM,
    PART_1B_LABEL,
    PART_1B_QUESTION,
    UNIFORM,
    TokenWeights,
)

SPREAD = "token_weight_spread"  # mean relative spread max|w - mean w| / max|w| (0: uniform)


def token_weight_table(runs: list[Run]) -> pd.DataFrame:
    """variant, estimator, credit, runs, steps, mean and min uniform fraction, the share of
    steps with a non-uniform rollout, and the reading (module docstring)."""
    facts = {run.variant: run.estimator_facts for run in runs}
    table = metric_table(runs, [COLUMN, SPREAD])
    spreads = table[table["metric"] == SPREAD]
    table = table[table["metric"] == COLUMN]
    rows = []
    for variant, fact in sorted(facts.items(), key=lambda item: str(item[0])):
        values = table.loc[table["variant"] == variant, "value"]
        spread = spreads.loc[spreads["variant"] == variant, "value"]
        rows.append({
            "variant": variant or str(fact["name"]), "estimator": fact["name"],
            "credit": fact["credit"],
            "runs": table.loc[table["variant"] == variant, "run_id"].nunique(),
            "steps": len(values),
            "mean uniform frac": values.mean() if len(values) else np.nan,
            "min uniform frac": values.min() if len(values) else np.nan,
            "steps not uniform": float((values < 1).mean()) if len(values) else np.nan,
            "mean spread": spread.mean() if len(spread) else np.nan,
            "reading": NOT_RECORDED if values.empty else UNIFORM if (values >= 1).all() else NOT_UNIFORM,
        })
    return pd.DataFrame(rows)


def readings(table: pd.DataFrame) -> list[TokenWeights]:
    """Each variant's reading as a record (its sentence: words_credit.TokenWeights)."""
    return [TokenWeights(r["variant"], r["credit"], r["reading"], r["steps"], r["steps not uniform"],
                         r["mean uniform frac"], r["min uniform frac"], r["mean spread"])
            for r in table.to_dict("records")]


def empirical_parts(table: pd.DataFrame) -> list[Part]:
    """Claim 1's part 1b for each outcome variant that recorded this reading (supported: uniform
    at every step; contradicted: not); none without a recorded reading."""
    return [Part("1b", PART_1B_QUESTION, SUPPORTED if r.reading == UNIFORM else CONTRADICTED,
                 Joined((PART_1B_LABEL, r)))
            for r in readings(table) if r.credit == "outcome" and r.reading != NOT_RECORDED]
