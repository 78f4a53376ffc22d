"""Every verdict rule of `grpo analyze` and every threshold it uses, in one place.

A judged number comes with an interval (analysis/bootstrap.py); its verdict is three-way:
- supported: the whole interval lies inside the rule's region,
- contradicted: the whole interval lies outside it,
- inconclusive: the interval straddles a boundary of the region.
A part with no data for an interval is "not judged" (and says why); a claim with no run its rule
can use is "not measured". None of the thresholds below is in the paper: they are this tool's
reading of "~2", "independent of R" and "well above 2", printed with every verdict.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

SUPPORTED, CONTRADICTED, INCONCLUSIVE = "supported", "contradicted", "inconclusive"
MIXED = "mixed"  # a claim whose parts are supported and contradicted
NOT_JUDGED, NOT_MEASURED = "not judged", "not measured"
CONTRAST = "contrast"  # shown beside a claim, not judged (claim 1's per-token estimators)
VERDICT_WORDS = (SUPPORTED, CONTRADICTED, INCONCLUSIVE, MIXED, NOT_JUDGED, NOT_MEASURED)

CONFIDENCE = 0.9  # two-sided level of every interval (`grpo analyze --confidence`)
RANK_TARGET = 2.0  # claim 2: the claimed effective rank
RANK_BAND = 0.5  # claim 2 (level): each judged R's rank within RANK_TARGET +- RANK_BAND
GROWTH_TOLERANCE = 0.25  # claim 2b: |slope| of rank vs log2(R), rank units per doubling of R
CREDIT_TOLERANCE = 1e-9  # claim 1: credit_uniform_frac >= 1 - CREDIT_TOLERANCE at every step
MARGIN = 0.5  # claim 4: "well above": per-token rank >= outcome + MARGIN and >= target + MARGIN
LAST_FRACTION = 0.25  # part of each run's probe steps averaged (steps >= (1 - f) * last step)
RESAMPLES = 1000  # draws of each judged number's sampling distribution (flip probabilities)
BOOTSTRAP_SEED = 0  # the draws' RNG seed: `grpo analyze` is deterministic
HAMED_RAO_MIN_POINTS = 10  # claim 3: autocorrelation is estimated (and corrected) from 10 points
MAX_SEEDS_ADVICE = 1000  # "about N seeds would settle it" is not computed beyond this
DISTINCT_FALL = 0.1  # collapse warning: distinct completions fall by >= 10% (relative) early -> late
MATCH_COMMON_SHARE = 0.9  # matching "reweights only": every R has >= 90% of probe steps in common bins
MIN_CHECKED_STEPS = 2  # claim 4: only problems with >= 2 checked steps (else step credit is uniform)
OUTLIER_Z = 3.5  # outlying seed: modified z-score <= -3.5 (Iglewicz & Hoaglin), analysis/outliers.py


def capped_group_sizes(group_sizes: Iterable[int], target: float = RANK_TARGET) -> list[int]:
    """Group sizes whose per-group rank cannot exceed `target`: a group matrix has R rows, so
    for R <= target its rank is forced (an informative R=2 group has rank <= 2, entropy rank in
    [1, 2]) and says nothing about whether the rank grows with R."""
    return sorted(int(r) for r in set(group_sizes) if r <= target)


def judged_group_sizes(group_sizes: Iterable[int], target: float = RANK_TARGET) -> list[int]:
    """The R values claim 2 is judged on: the uncapped ones. A capped R cannot tell whether the
    rank grows with R, so with fewer than two uncapped R the slope is not judged (keeping R = 2
    would read "the rank depends on R" only because R = 2 is capped; issue 42)."""
    capped = set(capped_group_sizes(group_sizes, target))
    return sorted({int(r) for r in group_sizes} - capped)


def three_way(low: float, high: float, region_low: float, region_high: float) -> str:
    """supported / contradicted / inconclusive for the interval [low, high] against a region;
    not judged with no interval (one seed: a between-seed reading cannot be made)."""
    if not (math.isfinite(low) and math.isfinite(high)):
        return NOT_JUDGED
    if region_low <= low and high <= region_high:
        return SUPPORTED
    if high < region_low or low > region_high:
        return CONTRADICTED
    return INCONCLUSIVE


def combine(parts: Iterable[str]) -> str:
    """A claim's verdict from its parts': supported when every judged part is, mixed when some
    part is mixed or some are supported and others contradicted, contradicted when some are and
    none is supported, inconclusive otherwise; not judged when no part could be judged. A part
    that is itself a combination keeps its "mixed" (issue 42: it was dropped, so a sweep of
    mixed variants read "not judged")."""
    judged = [v for v in parts if v in (SUPPORTED, CONTRADICTED, INCONCLUSIVE, MIXED)]
    if not judged:
        return NOT_JUDGED
    if all(v == SUPPORTED for v in judged):
        return SUPPORTED
    if MIXED in judged or (SUPPORTED in judged and CONTRADICTED in judged):
        return MIXED
    if CONTRADICTED in judged:
        return CONTRADICTED
    return INCONCLUSIVE


def holm(p_values: Sequence[float]) -> list[float]:
    """Holm's (1979) step-down adjusted p-values: the family-wise error rate over the parts is
    at most the level at which any adjusted p is read. NaN (untested) stays NaN and does not
    count in the family."""
    p = np.asarray(p_values, float)
    tested = np.flatnonzero(np.isfinite(p))
    out = np.full(p.shape, np.nan)
    order = tested[np.argsort(p[tested], kind="stable")]
    m, running = len(order), 0.0
    for i, k in enumerate(order):
        running = max(running, min(1.0, (m - i) * p[k]))
        out[k] = running
    return out.tolist()


def family_wise(verdicts: Sequence[str], p_contradict: Sequence[float], level: float
                ) -> tuple[list[str], list[float]]:
    """A claim's parts read together, and their Holm-adjusted contradiction p-values.

    Each part reads "contradicted" at its own level (one interval, or the Bonferroni level
    within the part); a claim that reads contradicted when any of m parts does is a union of m
    tests, so with every part on its region's edge it would read contradicted up to m times as
    often as one part (claim 4 on `make settle`'s shape, 27 parts: 29.5% of simulated sweeps
    contradicted and 10% mixed, against 5%; tests/test_calibration.py). Read together, a part counts as contradicted only where its Holm-adjusted
    `p_contradict` (`holm`, over the parts that have one) is <= `level`; otherwise it counts as
    inconclusive. "Supported" needs every part supported (an intersection of tests, no
    correction), so it is left as it is. With one part, this is the part's own reading."""
    adjusted = holm(p_contradict)
    read = [INCONCLUSIVE if v == CONTRADICTED and not adjusted[k] <= level else v
            for k, v in enumerate(verdicts)]
    return read, adjusted


OUTCOME, PER_TOKEN = "outcome", "per_token"  # estimator families (run.json estimator_facts)


def estimator_family(facts: Mapping[str, object]) -> str | None:
    """OUTCOME for a zero-sum outcome estimator (one advantage per rollout, summing to zero over
    its group: the paper's setting, claims 2-4), PER_TOKEN for credit that varies along a
    completion (claim 4's falsifier), None for the rest (e.g. a batch-mean baseline). Read from
    the facts a run recorded, never from the estimator's name."""
    if facts.get("credit") == "outcome" and facts.get("zero_sum_group"):
        return OUTCOME
    return PER_TOKEN if facts.get("credit") == "per_token" else None


@dataclass(frozen=True)
class Families:
    """The estimators the analysed results hold, by family (`estimator_family`), as the rule
    texts name them."""

    zero_sum: tuple[str, ...] = ()  # zero-sum outcome estimators (claims 2, 3, 4's outcome side)
    per_token: tuple[str, ...] = ()  # per-token credit (claim 4; claim 1's contrast)
    outcome: tuple[str, ...] = ()  # every outcome-credit estimator (claim 1 judges them)

    @classmethod
    def of(cls, runs: Iterable) -> Families:
        """From runs' recorded facts (anything with `estimator_facts`: analysis/load.Run)."""
        facts = [run.estimator_facts for run in runs]

        def names(keep) -> tuple[str, ...]:
            return tuple(sorted({str(f["name"]) for f in facts if keep(f)}))

        return cls(zero_sum=names(lambda f: estimator_family(f) == OUTCOME),
                   per_token=names(lambda f: estimator_family(f) == PER_TOKEN),
                   outcome=names(lambda f: f.get("credit") == "outcome"))

    @staticmethod
    def named(names: tuple[str, ...]) -> str:
        return "here: " + ", ".join(names) if names else "none in these results"


@dataclass(frozen=True)
class Rules:
    """The thresholds of the four claims' rules (defaults above); `grpo analyze` options set
    some of them and every rule text is written from them."""

    confidence: float = CONFIDENCE  # two-sided level of every interval
    target: float = RANK_TARGET  # claim 2: the claimed rank
    band: float = RANK_BAND  # claim 2c: |rank - target| allowed at each judged R
    growth_tolerance: float = GROWTH_TOLERANCE  # claim 2b: |slope| per doubling of R allowed
    credit_tolerance: float = CREDIT_TOLERANCE  # claim 1
    margin: float = MARGIN  # claim 4
    last_fraction: float = LAST_FRACTION  # part of each run's probe steps averaged
    resamples: int = RESAMPLES  # draws per judged number (flip probabilities)
    seed: int = BOOTSTRAP_SEED  # the draws' RNG seed
    rank_matrix: str = "rollout_group"  # claim 2's headline matrix ...
    rank_measure: str = "erank_entropy"  # ... and measure (also claim 4's measure)
    falsifier_matrix: str = "rollout_batch"  # claim 4's side reading (claim 4 decides on rank_matrix)
    distinct_fall: float = DISTINCT_FALL  # collapse warning: relative fall of distinct completions
    match_common_share: float = MATCH_COMMON_SHARE  # matching "reweights only"
    min_checked_steps: int = MIN_CHECKED_STEPS  # claim 4: problems with at least this many steps
    outlier_z: float = OUTLIER_Z  # outlying seed: modified z-score of its collapse (outliers.py)

    def __post_init__(self) -> None:
        if not 0.5 <= self.confidence < 1:
            raise ValueError(f"confidence must be in [0.5, 1), not {self.confidence}")
        if not 0 < self.last_fraction <= 1:
            raise ValueError(f"last_fraction must be in (0, 1], not {self.last_fraction}")
        for name, option in (("band", "--tolerance"), ("growth_tolerance", "--trend")):
            value = getattr(self, name)
            if not value >= 0:  # a negative allowance would make claim 2 unprovable whatever the data
                raise ValueError(f"{name} (grpo analyze {option}) must be >= 0, not {value}")
        if self.resamples < 100:
            raise ValueError(f"resamples must be at least 100, not {self.resamples}")

    @property
    def one_sided_level(self) -> float:
        """The one-sided level of every test: (1 - confidence) / 2, so that a verdict agrees
        with a two-sided interval at `confidence` (0.05 at the default 0.9). Claim 3's trend
        tests and the family-wise readings of claims 2 and 4 (`family_wise`) are read at it."""
        return (1 - self.confidence) / 2

    # ---- claim 2 -----------------------------------------------------------------------------
    def slope_zero(self, low: float, high: float) -> str:
        """2a, the literal claim "rank does not depend on R" (slope = 0), descriptive: no
        interval fits inside a point, so supported needs 0 inside an interval no wider than the
        tolerance; contradicted when the interval excludes 0. Not in claim 2's verdict."""
        if math.isfinite(low) and math.isfinite(high) and (low > 0 or high < 0):
            return CONTRADICTED
        return three_way(low, high, -self.growth_tolerance, self.growth_tolerance)

    def growth_small(self, low: float, high: float) -> str:
        """2b: is the growth small, |slope| <= growth_tolerance per doubling of R?"""
        return three_way(low, high, -self.growth_tolerance, self.growth_tolerance)

    def bonferroni(self, tests: int) -> float:
        """The two-sided level of each of `tests` intervals of which any one wholly outside
        contradicts a part (2c: one per judged R; claim 4: the difference and the per-token
        rank), so that the part reads contradicted on its region's edge at most (1 -
        confidence) / 2 of the time, as one interval would (tests/test_calibration.py)."""
        return 1 - (1 - self.confidence) / max(tests, 1)

    def level(self, intervals: Iterable[tuple[float, float]],
              outside: Iterable[tuple[float, float]] | None = None) -> str:
        """2c: is every judged R's rank within target +- band? Supported if every R's interval
        (at `confidence`) is inside: an intersection-union test, which needs no correction.
        Contradicted if some R's interval at `bonferroni(k)` (`outside`, one per R; default
        `intervals`) is wholly outside: one R wholly outside out of k is a union, and with
        k = 3 90% intervals it read a rank on the band's edge as outside in 12.5-13.8% of
        simulated sweeps against the stated 5%."""
        intervals = list(intervals)
        lo, hi = self.target - self.band, self.target + self.band
        parts = [three_way(low, high, lo, hi) for low, high in intervals]
        if not parts or NOT_JUDGED in parts:
            return NOT_JUDGED
        if any(three_way(low, high, lo, hi) == CONTRADICTED
               for low, high in (intervals if outside is None else outside)):
            return CONTRADICTED
        return SUPPORTED if all(p == SUPPORTED for p in parts) else INCONCLUSIVE

    # ---- claim 4 -----------------------------------------------------------------------------
    def well_above(self, difference: tuple[float, float], per_token: tuple[float, float],
                   below: tuple[tuple[float, float], tuple[float, float]] | None = None) -> str:
        """Claim 4 on one pair at one R: per-token minus outcome >= margin and per-token rank
        >= target + margin. Supported if both intervals (at `confidence`) lie above, an
        intersection of tests. Contradicted if either lies wholly below at `bonferroni(2)`
        (`below`: the difference's and the per-token rank's intervals at that level; default
        the same two): with 90% intervals, a pair on both edges read contradicted in 7.1% of
        simulated sweeps against the stated 5%."""
        a = three_way(*difference, self.margin, math.inf)
        b = three_way(*per_token, self.target + self.margin, math.inf)
        if NOT_JUDGED in (a, b):
            return NOT_JUDGED
        wide_difference, wide_per_token = below or (difference, per_token)
        if CONTRADICTED in (three_way(*wide_difference, self.margin, math.inf),
                            three_way(*wide_per_token, self.target + self.margin, math.inf)):
            return CONTRADICTED
        return SUPPORTED if a == b == SUPPORTED else INCONCLUSIVE

    # ---- the rules in words ------------------------------------------------------------------
    def interval_text(self) -> str:
        return (
            f"Intervals are {self.confidence:.0%} seed-level Student-t intervals: each run "
            "keeps its window mean, and the seeds (independent runs) are the units; a per-R "
            "mean gets mean +- t_(n-1) s/sqrt(n); the slope over R the t-interval of per-seed "
            "slopes when every seed ran every judged R, else Welch's; a difference of two "
            "variants Welch's (one seed: no interval, except for a `grpo probe` run, one set "
            "of weights, whose prompt groups are the units instead). The seeds replicate the "
            "whole experiment only where each trained from its own initial model (run.json "
            "initial_model); where one model was shared by every seed (a pinned warm start, a "
            "pretrained model, a probed checkpoint) the intervals are conditional on it, as "
            "the 'unit' column says. Intervals are clipped to "
            "the range the measure can take (a rank >= 0; a per-group rank <= R). "
            "Supported: the whole interval lies inside the rule's region; contradicted: the whole "
            "interval lies outside; inconclusive: it straddles a boundary; mixed: a claim whose "
            "parts (or variants) read supported and contradicted, or a part that is itself "
            f"mixed. The flip probability (every claim) is the share of {self.resamples} draws "
            "of the estimate's sampling distribution (estimate + se T_df, clipped like the "
            "interval; seed "
            f"{self.seed}) whose reading differs from the estimate's."
        )

    def rank_text(self) -> str:
        """Claim 2's rule (the `grpo analyze` verdict rule for every matrix x measure)."""
        target, band, tol = f"{self.target:g}", f"{self.band:g}", f"{self.growth_tolerance:g}"
        return (
            f"Per run, the mean over its last {self.last_fraction:.0%} of probe steps; per R, "
            f"the mean over seeds. R <= {target} is capped (a group of R rows has rank <= R), so "
            "the rule is judged on the uncapped R values only; with fewer than two of them the "
            "slope is not judged (it cannot be judged beyond the cap). "
            f"2b (is the growth small? an equivalence reading): supported when the interval "
            f"of the least-squares slope of rank against log2(R) lies within +-{tol} rank units "
            f"per doubling of R, contradicted when it lies outside. 2c (~{target}): supported "
            f"when every judged R's interval lies within {target} +- {band}, contradicted when "
            "one lies wholly outside even at the Bonferroni level over the judged R (1 - (1 - "
            "confidence) / k for k of them, so that a rank on the band's edge reads outside at "
            "most as often as one interval would). The verdict combines 2b and 2c. 2a (the "
            "literal claim, slope "
            "exactly 0) is shown as a descriptive test, not in the verdict: contradicted when "
            f"the slope's interval excludes 0, supported when it contains 0 and lies within "
            f"+-{tol}. " + self.interval_text()
        )

    def token_weight_text(self) -> str:
        """Claim 1's part 1b (analysis/token_weights.py)."""
        return ("per outcome variant, metrics.csv token_weight_uniform_frac (informative "
                "rollouts whose d loss / d log pi(y_t) is uniform to a relative 1e-6); supported "
                "iff it is 1 at every step with an informative rollout, contradicted otherwise. "
                "The claim's verdict combines 1a and 1b.")

    def text(self, claim: int, families: Families) -> str:
        """Claim `claim`'s rule in words, from the thresholds above; `families` names the
        estimators of the analysed results (recorded facts)."""
        if claim == 3:
            return self._sparsity_text()
        return {1: self._credit_text, 2: self._rank_claim_text, 4: self._falsifier_text}[claim](families)

    def _credit_text(self, families: Families) -> str:
        return (
            "Per estimator, credit_uniform_frac (metrics.csv: the fraction of rollouts whose "
            "completion tokens all got the same advantage) at every step of every run. "
            "For outcome estimators this is true by construction (one scalar advantage is "
            "broadcast over the tokens): it checks the wiring, not the paper. Supported iff "
            f">= 1 - {self.credit_tolerance:g} at every step, contradicted otherwise. Judged: "
            f"every outcome-credit estimator ({families.named(families.outcome)}); per-token "
            f"estimators ({families.named(families.per_token)}) are shown for contrast, not "
            "judged."
        )

    def _together_text(self, what: str) -> str:
        """How claims 2 and 4 read their `what` (parts, pairs) together (`family_wise`)."""
        return (
            f"The claim reads its {what} together: each {what[:-1]}'s contradicted reading has a "
            "one-sided p-value (the level at which its interval would just reach the region's "
            f"bound, Bonferroni within the {what[:-1]} included), and a {what[:-1]} contradicted "
            "on its own counts as contradicted in the claim's verdict only where Holm's "
            f"adjustment over the claim's tested {what} keeps it at or below "
            f"{self.one_sided_level:g}, else as inconclusive; so the claim reads a contradiction "
            f"falsely at most {self.one_sided_level:.0%} of the time however many {what} it has. "
        )

    def _rank_claim_text(self, families: Families) -> str:
        return (
            f"{self.rank_matrix} / {self.rank_measure} (the group's R x P gradient that the "
            "paper's zero-sum argument is about), for every variant of a zero-sum outcome "
            f"estimator ({families.named(families.zero_sum)}); the claim's parts are each "
            "variant's 2b and 2c. " + self._together_text("parts") + self.rank_text()
        )

    def _sparsity_text(self) -> str:
        return (
            "Per variant, R and measure (grad_sparsity, grad_hoyer on every step, or on probe steps "
            "in results written before probes.sparsity_every; steps "
            "with a zero gradient left out): per seed, the least-squares slope of the "
            "measure against the step; a one-sided Student t-test of the mean per-seed "
            "slope (n - 1 df: the seeds are the independent units, so the test holds its "
            "level whatever the autocorrelation within a run; one seed: not judged). A part "
            "is supported iff its growth is significant at the one-sided "
            f"{self.one_sided_level:.1%} level ((1 - confidence) / 2), unadjusted: the claim "
            "reads supported only when every part is, an intersection-union test, which needs "
            "no correction; contradicted iff its decline is significant after Holm over the "
            "parts (any part declining contradicts the claim, a union of tests), so the claim "
            f"reads either falsely at most {self.one_sided_level:.1%} of the time however many "
            "parts it has; inconclusive otherwise (never 'fails' for want of significance), "
            "with about how many seeds would settle it at the level its verdict uses (growth "
            "at the one-sided level, decline at that level / m, Holm's first step). Beside the "
            "parts, one pooled test fixed before the data: per seed, the mean over its parts "
            "(run x measure) of the relative slope (100 x slope / the run's mean level), "
            "one one-sided t-test over seeds, uncorrected (one test). "
            "The slope is shown per 100 steps with its t-interval; the "
            "pooled Mann-Kendall S and Sen's slope are shown as descriptions (Hamed-Rao "
            "factor floored at 1). Beside it, the reading 'the fraction of zero-advantage "
            "groups grows' (zero_variance_frac over every step), judged the same way (its "
            "own Holm family): more zero-advantage groups mean fewer informative "
            "rollouts, which alone can make the gradient sparser, so each sparsity part is "
            "also read with zero_variance_frac as a covariate of each seed's regression on "
            "the step (descriptive: the trend it leaves, Holm over the parts)."
        )

    def _falsifier_text(self, families: Families) -> str:
        target = f"{self.target:g}"
        return (
            f"Decided on claim 2's own matrix, {self.rank_matrix} / {self.rank_measure}, with "
            "the same rows on both sides: informative groups only (the rewards differ), and "
            f"where ranks.csv records checked steps only problems with >= {self.min_checked_steps} "
            "of them, for every estimator alike (a step-reward estimator gives a one-step "
            "problem uniform credit). This is the matrix the paper's zero-sum argument is "
            "about, and on the same rows a higher rank can only come from different credit. "
            f"Per run, the mean over its last {self.last_fraction:.0%} of probe steps; per R, "
            "the mean over seeds. Per pair of an outcome variant (zero-sum outcome credit; "
            f"{families.named(families.zero_sum)}) and a per-token variant "
            f"({families.named(families.per_token)}) at each R > "
            f"{target} (R <= {target} is capped: a group of R rows has rank <= R): supported iff "
            f"the intervals of per-token minus outcome and of the per-token rank lie above "
            f"{self.margin:g} and {target} + {self.margin:g}; contradicted iff either lies "
            "wholly below even at the Bonferroni level over the two (1 - (1 - confidence) / 2). "
            f"The per-token rank's bar is read only where the per-token groups average at least "
            f"{self.target + 2 * self.margin:g} distinct completions ({target} + 2 x "
            f"{self.margin:g}: a group's rank is at most its distinct completions, so below that "
            "no credit could clear the bar); there the pair is judged on the difference alone, "
            "and the sentence says so. Beside it, not in the verdict: the difference per distinct "
            "completion. "
            + self._together_text("pairs") +
            "Where `grpo probe` directories of both estimators probed the same source, "
            "checkpoint, seed and R (the very same rollouts), their latest checkpoint is read "
            "group by group (paired differences) and decides too. "
            f"{self.falsifier_matrix} is a side reading, not in the verdict: an estimator "
            "that gives zero-variance groups non-zero advantages (a learned critic) has more "
            "non-zero rows there, and more rows raise a rank without any per-token credit; "
            "its rank per non-zero row is shown beside it. " + self.interval_text()
        )
