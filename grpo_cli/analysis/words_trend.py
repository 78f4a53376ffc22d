"""Claim 3's parts in words: the renderer of claims.py's sparsity-trend facts.

claims.sparsity_claim computes each part's trend test (trend.seed_trend, Holm over the parts)
and the pooled test (trend.pooled_seed_trend), and hands their numbers on as these records; the
sentences are written here (parts.Part.sentence renders them when a reader asks).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from grpo_cli.analysis import bootstrap as bs
from grpo_cli.analysis.rules import CONTRADICTED, INCONCLUSIVE, NOT_JUDGED, SUPPORTED
from grpo_cli.analysis.words_over_r import settle_text


def trend_name(measure: str, size: int, variant: str | None = None) -> str:
    """A claim-3 part's name: its measure and R (and its variant where the sweep has several)."""
    return f"{measure}, R={size}" + (f" ({variant})" if variant is not None else "")


@dataclass(frozen=True)
class TrendPart:
    """One claim-3 part: the trend test of its per-seed slopes, growth at the one-sided `level`
    (unadjusted: an intersection-union test), decline at level / m (Holm over the m parts)."""

    name: str
    verdict: str
    seeds: int  # seeds with a slope
    level: float
    m: int  # parts in the Holm family
    p_growth: float
    p_growth_holm: float
    p_decline_holm: float
    slope_text: str  # the mean per-seed slope per 100 steps, as the claim's table shows it
    flip: float
    growing: bool  # the mean slope is > 0
    more_seeds: int | None  # seeds in all that would settle an inconclusive growing part
    decline_seeds: int | None  # ... that would make a declining part's decline significant

    def decided(self) -> str:
        level, m = self.level, self.m
        holm = f" (Holm over {m} parts)" if m > 1 else ""
        held = f"; Holm over {m} parts p = {self.p_growth_holm:.3g}" if m > 1 else ""
        return {
            SUPPORTED: f"growth significant (p = {self.p_growth:.3g} <= {level:g}, unadjusted: "
                       f"the claim needs every part to grow, an intersection-union test{held})",
            CONTRADICTED: f"decline significant (p = {self.p_decline_holm:.3g}{holm} <= {level:g})",
            INCONCLUSIVE: f"neither growth (p = {self.p_growth:.3g}, unadjusted) nor decline "
                          f"(p = {self.p_decline_holm:.3g}{holm}) significant at {level:g}",
        }[self.verdict]

    def sentence(self) -> str:
        if self.verdict == NOT_JUDGED:
            return (f"{self.name}: not judged; {self.seeds} seed(s) with a slope: the trend test "
                    "compares per-seed slopes, so it needs at least 2 seeds.")
        extra = settle_text(self.verdict, self.flip, self.more_seeds, self.seeds)
        if self.verdict == INCONCLUSIVE and not self.growing:
            extra = f"; flips in {self.flip:.0%} of draws" if math.isfinite(self.flip) else ""
            extra += "; no sign of growth, so more seeds would not make it supported"
            if self.decline_seeds is not None:
                extra += (f"; about {self.decline_seeds} seeds in all would make its decline "
                          f"significant at {self.level:g} / {max(self.m, 1)}")
        return (f"{self.name}: {self.verdict}; {self.decided()}; mean per-seed slope "
                f"{self.slope_text} per 100 steps over {self.seeds} seeds{extra}.")


POOLED_QUESTION = "does the mean relative slope over every sparsity part grow (one pooled test)?"


@dataclass(frozen=True)
class PooledPart:
    """Claim 3's one pre-registered pooled test (part 3p): per seed the mean relative slope of
    its `series` run x measure series, one one-sided t-test over the seeds."""

    series: int
    verdict: str
    seeds: int
    slope: bs.Interval  # % per 100 steps
    p_up: float
    p_down: float
    level: float

    def sentence(self) -> str:
        head = (f"Pooled (one pre-registered test of 'sparsity grows', beside the parts): per "
                f"seed the mean relative slope of its parts ({self.series} run x measure series; "
                "100 x slope / the run's mean level)")
        if self.verdict == NOT_JUDGED:
            return f"{head}: not judged, {self.seeds} seed."
        return (f"{head}: {self.verdict}; {self.slope.text(2, sign=True)}% per 100 steps over "
                f"{self.seeds} seeds, p (growth) = {self.p_up:.3g}, p (decline) = "
                f"{self.p_down:.3g}, one-sided at {self.level:g} with no correction (one test).")


@dataclass(frozen=True)
class ZeroAdvantage:
    """Claim 3's zero-advantage reading (its parts' combined verdict) and, where tested, in how
    many of the sparsity parts growth stays significant with it as a covariate (after Holm)."""

    metric: str
    verdict: str
    tested: int
    significant: int

    def sentence(self) -> str:
        out = (f"The zero-advantage reading ({self.metric}, every step; more zero-advantage "
               "groups means fewer informative rollouts, which alone can make the gradient "
               f"sparser): {self.verdict}.")
        if self.tested:
            out += (f" Controlling for them ({self.metric} as a covariate of each seed's "
                    "regression on the step; descriptive): growth stays significant in "
                    f"{self.significant} of {self.tested} parts after Holm (column 'slope given "
                    "zero-adv.').")
        return out


NO_SPARSITY = "no grad_sparsity / grad_hoyer in a zero-sum outcome estimator's run"
