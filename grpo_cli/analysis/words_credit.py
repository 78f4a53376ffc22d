"""Claim 1's empirical reading in words: the renderer of token_weights.py's facts.

token_weights.py reads metrics.csv `token_weight_uniform_frac` per variant and hands each
variant's reading on as a `TokenWeights` record; its sentence, and part 1b's, are written here.
The readings' labels (the `reading` column of token_weights.csv) are owned here too: they are
words.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

COLUMN = "token_weight_uniform_frac"  # metrics.csv: uniform-weight share of informative rollouts
UNIFORM, NOT_UNIFORM, NOT_RECORDED = "uniform", "not uniform", "not recorded"


@dataclass(frozen=True)
class TokenWeights:
    """One variant's reading of the loss gradient's token weights (token_weights.token_weight_table)."""

    variant: str
    credit: str
    reading: str  # UNIFORM | NOT_UNIFORM | NOT_RECORDED
    steps: int
    steps_not_uniform: float  # share of steps with some non-uniform rollout
    mean_uniform: float  # mean uniform fraction
    min_uniform: float
    mean_spread: float  # mean relative spread max|w - mean w| / max|w| (NaN: not recorded)

    def sentence(self) -> str:
        if self.reading == NOT_RECORDED:
            return f"{self.variant}: no {COLUMN} in metrics.csv (results written before it)."
        if self.reading == UNIFORM:
            return (f"{self.variant} ({self.credit}): the loss gradient weighted every token of "
                    f"every informative rollout equally, at all {self.steps} steps.")
        spread = (f"; relative spread max|w - mean w| / max|w| {self.mean_spread:.2g} on "
                  "average" if math.isfinite(self.mean_spread) else "")
        return (f"{self.variant} ({self.credit}): the loss gradient's token weights varied "
                f"within some rollout at {self.steps_not_uniform:.0%} of {self.steps} steps "
                f"(uniform in {self.mean_uniform:.3f} of informative rollouts on average, "
                f"{self.min_uniform:.3f} at worst{spread}).")


PART_1B_QUESTION = ("is the loss gradient's weight d loss / d log pi(y_t) uniform over each "
                    "rollout's tokens?")


PART_1B_LABEL = "1b (the loss gradient's token weights, can fail):"  # said before its reading


@dataclass(frozen=True)
class CreditRow:
    """One variant's advantages reading: credit_uniform_frac's mean and minimum over its steps."""

    variant: str
    credit: str
    mean: float
    worst: float
    steps: int


@dataclass(frozen=True)
class Advantages:
    """Claim 1a's evidence: every variant that recorded credit_uniform_frac (`judged`: some of
    them are outcome estimators, for which it holds by construction)."""

    rows: tuple[CreditRow, ...]
    judged: bool

    def sentence(self) -> str:
        said = "; ".join(f"{r.variant} ({r.credit}): uniform credit in {r.mean:.3f} of rollouts "
                         f"on average, {r.worst:.3f} at worst, over {r.steps} steps"
                         for r in self.rows if r.steps)
        return (said or "no credit_uniform_frac recorded") + (
            ". For outcome estimators this holds by construction (one advantage per rollout)."
            if self.judged else "")


PART_1A_QUESTION = ("does every token of a rollout get the same advantage? (true by "
                    "construction for outcome estimators)")


PART_1A_LABEL = "1a (the advantages; true by construction for outcome estimators):"


def credit_rule(advantages_rule: str, token_weight_rule: str) -> str:
    """Claim 1's rule where it has both parts."""
    return f"1a: {advantages_rule} 1b: {token_weight_rule}"
