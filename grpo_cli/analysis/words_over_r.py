"""Claim 2's reading over R in words: the renderer of rank_verdict.py's facts.

rank_verdict.py computes (per-R intervals, the slope, the parts' verdicts, reading them
together) and hands each part these records; every sentence about them is written here, when
a reader asks (parts.Part.sentence). Nothing here computes a reading: each record holds the
numbers it says, and the words say them.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from grpo_cli.analysis import bootstrap as bs
from grpo_cli.analysis.rules import CONTRADICTED, INCONCLUSIVE, NOT_JUDGED, SUPPORTED


def settle_text(part_verdict: str, flip: float, seeds: int | None, n: int) -> str:
    """The flip probability and, for an inconclusive part, how many seeds would settle it."""
    out = ""
    if math.isfinite(flip):
        out += f"; flips in {flip:.0%} of draws"
    if n < 2 and part_verdict in (INCONCLUSIVE, NOT_JUDGED):
        out += "; at least 2 seeds per R are needed for an interval"
    elif part_verdict == INCONCLUSIVE:
        if seeds is not None:
            out += f"; about {seeds} seeds in all ({seeds - n} more) would settle it"
        else:
            out += "; the estimate sits on a boundary: more seeds may not settle it"
    return out


def r_list(sizes: Sequence[int]) -> str:
    return ", ".join(f"R={r}" for r in sizes)


def subject(variant: str, matrix: str, measure: str) -> str:
    return f"{matrix} / {measure}" + (f" ({variant})" if variant else "")


SLOPE_ZERO_QUESTION = "does the rank depend on R at all (slope = 0)?"


def growth_question(tol: float) -> str:
    return f"is the growth small (|slope| <= {tol:g} per doubling)?"


def level_question(target: float, band: float) -> str:
    return f"is the rank ~{target:g} (within {band:g}) at every judged R?"


@dataclass(frozen=True)
class SlopeNotJudged:
    """2a or 2b with fewer than two judged R: no slope."""

    name: str  # "2a" | "2b"
    judged: tuple[int, ...]
    capped: tuple[int, ...]
    target: float

    def sentence(self) -> str:
        judged, capped = self.judged, self.capped
        if capped:
            why = (f"cannot judge beyond the cap: {r_list(capped)} capped (a group of R rows "
                   f"has rank <= R) and {'only ' + r_list(judged) if judged else 'no R'} above "
                   f"{self.target:g}")
        else:
            why = f"only one value of R ({r_list(judged)})" if judged else "no value of R"
        return f"{self.name}: not judged, {why}: a slope needs two."


@dataclass(frozen=True)
class SlopePart:
    """2a (slope = 0, descriptive) or 2b (|slope| <= tol): the slope's interval and its reading."""

    name: str  # "2a" | "2b"
    verdict: str
    judged: tuple[int, ...]
    capped: tuple[int, ...]
    slope: bs.Interval
    tol: float
    flip: float
    seeds: int | None

    def sentence(self) -> str:
        iv, tol, verdict = self.slope, self.tol, self.verdict
        note = f" ({', '.join(f'R={r}' for r in self.capped)} capped, left out)" if self.capped else ""
        text = f"the slope over {r_list(self.judged)}{note} is {iv.text(2, sign=True)} per doubling"
        sign = "+" if iv.estimate > 0 else "-"
        if self.name == "2a":
            why = {CONTRADICTED: "which excludes 0: the rank depends on R",
                   SUPPORTED: f"which contains 0 and lies within +-{tol:g}",
                   INCONCLUSIVE: f"which contains 0 but reaches beyond +-{tol:g}"}
            head = ("2a (rank independent of R, the literal claim; descriptive, not in the "
                    f"verdict): {verdict}")
        else:
            why = {SUPPORTED: f"inside +-{tol:g}", CONTRADICTED: f"wholly beyond {sign}{tol:g}",
                   INCONCLUSIVE: f"straddling {sign}{tol:g}"}
            head = f"2b (growth within +-{tol:g} per doubling): {verdict}"
        return (f"{head}; {text}, {why.get(verdict, 'with no interval')}"
                + settle_text(verdict, self.flip, self.seeds, iv.n) + ".")


def outside(low: float, high: float, lo: float, hi: float) -> bool:
    """An interval [low, high] wholly outside the band [lo, hi]."""
    return high < lo or low > hi


@dataclass(frozen=True)
class LevelPart:
    """2c: each judged R's interval (at `confidence`, and at the Bonferroni level `wide`)
    against the band target +- band."""

    verdict: str
    target: float
    band: float
    confidence: float
    level_out: float  # the Bonferroni level over the judged R
    judged: tuple[int, ...]
    intervals: tuple[bs.Interval, ...]
    wide: tuple[bs.Interval, ...]
    flip: float
    seeds: int | None

    def sentence(self) -> str:
        if not self.judged:
            return "2c: not judged, no value of R."
        lo, hi = self.target - self.band, self.target + self.band
        rows = list(zip(self.judged, self.intervals, self.wide, strict=True))
        bonferroni = (f" at {self.level_out:.1%}, the Bonferroni level over the "
                      f"{len(self.judged)} judged R" if len(self.judged) > 1 else "")
        values = ", ".join(f"R={r} {iv.text(2)}" for r, iv, _ in rows)
        verdict = self.verdict
        if verdict == SUPPORTED:
            decided = f"every interval inside [{lo:g}, {hi:g}]"
        elif verdict == CONTRADICTED:
            decided = ", ".join(f"R={r} [{w.low:.2f}, {w.high:.2f}]" for r, _, w in rows
                                if outside(w.low, w.high, lo, hi)) + (
                f" wholly outside [{lo:g}, {hi:g}]{bonferroni}")
        elif verdict == INCONCLUSIVE:
            decided = "; ".join(
                (f"R={r} outside [{lo:g}, {hi:g}] at {self.confidence:.0%} but not{bonferroni} "
                 f"([{w.low:.2f}, {w.high:.2f}])" if outside(iv.low, iv.high, lo, hi)
                 else f"R={r} straddles {lo:g} or {hi:g}") if iv.finite else f"R={r} has no interval"
                for r, iv, w in rows if not (lo <= iv.low and iv.high <= hi))
        else:
            decided = ", ".join(f"R={r}" for r, iv, _ in rows if not iv.finite) + " with no interval"
        n = min(iv.n for iv in self.intervals)
        return (f"2c (rank within {self.target:g} +- {self.band:g}): {verdict}; {values}: "
                f"{decided}" + settle_text(verdict, self.flip, self.seeds, n) + ".")


@dataclass(frozen=True)
class Together:
    """What reading a claim's parts together (Holm over their contradiction p-values) did:
    `alone` the parts contradicted on their own, `kept` those that stay contradicted,
    `adjusted` every part's adjusted p, `more` the seeds a side that would let the closest
    count (none kept), at `level / tested`."""

    what: str  # the parts, in the plural
    level: float
    tested: int
    labels: tuple[str, ...]
    adjusted: tuple[float, ...]
    alone: tuple[int, ...]
    kept: tuple[int, ...]
    more: int | None = None

    def named(self, ks: Sequence[int]) -> str:
        shown = ", ".join(f"{self.labels[k]} {self.adjusted[k]:.2g}" for k in ks[:3])
        return shown + (f" and {len(ks) - 3} more" if len(ks) > 3 else "")

    def sentence(self) -> str:
        what, level, alone, kept, adjusted = self.what, self.level, self.alone, self.kept, self.adjusted
        dropped = len(alone) - len(kept)
        head = (f"Read together (Holm over the {self.tested} tested {what}' contradiction "
                f"p-values, at the one-sided {level:g} level): ")
        if not dropped:
            body = (f"every one of the {len(alone)} contradicted {what} stays contradicted "
                    f"(adjusted p: {self.named(sorted(kept, key=lambda k: -adjusted[k]))})")
        elif kept:
            body = (f"{len(kept)} of the {len(alone)} contradicted {what} "
                    f"{'stays' if len(kept) == 1 else 'stay'} contradicted (adjusted p: "
                    f"{self.named(sorted(kept, key=lambda k: adjusted[k]))}); the other {dropped} "
                    f"{'counts' if dropped == 1 else 'count'} as inconclusive in the claim's verdict")
        else:
            closest = closest_part(alone, adjusted)
            body = (f"none of the {len(alone)} contradicted {what} stays contradicted (smallest "
                    f"adjusted p {adjusted[closest]:.2g}): they count as inconclusive in the "
                    "claim's verdict")
            if self.more:
                body += (f"; about {self.more} more seed{'s' if self.more > 1 else ''} a side "
                         f"would let {self.labels[closest]} count (its p at {level:g} / "
                         f"{self.tested}, the spread between seeds held fixed)")
        return head + body + "."


def closest_part(alone: Sequence[int], adjusted: Sequence[float]) -> int:
    """Of the parts contradicted alone, the one with the smallest adjusted p."""
    return min(alone, key=lambda k: adjusted[k] if math.isfinite(adjusted[k]) else math.inf)


@dataclass(frozen=True)
class VerdictWords:
    """A verdict row of rank_verdict.rank_verdicts (its `words` column): subject, verdict and
    each part, said as one sentence when a reader asks."""

    variant: str
    matrix: str
    measure: str
    verdict: str
    parts: tuple  # of parts.Part
    n_incomplete: int

    def sentence(self) -> str:
        sentence = f"{subject(self.variant, self.matrix, self.measure)}: {self.verdict}. " + " ".join(
            p.sentence for p in self.parts)
        return sentence + (" Provisional: includes incomplete runs." if self.n_incomplete else "")


@dataclass(frozen=True)
class MatchedWords:
    """A reading at matched progress (rank_verdict.point_reading rows, their `words` column)."""

    variant: str
    matrix: str
    measure: str
    progress: str
    reading: str
    means: tuple[tuple[int, float], ...]  # (R, mean over the common bins), by R
    slope: float
    judged: bool  # some progress bin is reached by every R

    def sentence(self) -> str:
        name = f"{subject(self.variant, self.matrix, self.measure)} at matched {self.progress}"
        if not self.judged:
            return f"{name}: not judged, no progress bin is reached by every R."
        values = ", ".join(f"{m:.2f} at R={r}" for r, m in self.means)
        return (f"{name}: point estimates {self.reading} the rule ({values}; slope "
                f"{self.slope:+.2f} per doubling; no interval, descriptive only).")


def common_span(progress: str, common: Sequence[float]) -> str:
    """The span of the progress bins every R reaches (the `common_bins` cell)."""
    return f"{progress} bins centred {common[0]:.3g}..{common[-1]:.3g}" if common else "none"


@dataclass(frozen=True)
class Outlier:
    """One run whose window mean of `measure` collapsed apart from its variant's other seeds
    (outliers.py finds them)."""

    variant: str
    seed: int
    group_size: int
    measure: str  # outliers.COLLAPSE_MEASURES
    value: float  # the run's window mean
    median: float  # the seeds' median at that variant and R
    z: float  # its modified z-score
    seeds: int  # seeds at that variant and R

    def named(self) -> str:
        return (f"{self.variant + ' ' if self.variant else ''}seed {self.seed} at "
                f"R={self.group_size} ({self.measure} {self.value:.2f} against the {self.seeds} "
                f"seeds' median {self.median:.2f}, modified z {self.z:.1f})")


@dataclass(frozen=True)
class Without:
    """Claim 2's reading of one variant's seeds without its outlying ones."""

    variant: str
    left_out: tuple[int, ...]
    verdict: str
    intervals: tuple[tuple[int, bs.Interval], ...]  # (R, its interval), by R
    slope: float  # the slope per doubling and its interval (NaN: none)
    slope_low: float
    slope_high: float

    def sentence(self) -> str:
        per_r = ", ".join(f"R={r} {iv.text(2)}" for r, iv in self.intervals)
        n = min(iv.n for _, iv in self.intervals) if self.intervals else 0
        slope = (f"; slope {self.slope:+.2f} [{self.slope_low:+.2f}, {self.slope_high:+.2f}] "
                 "per doubling" if math.isfinite(self.slope_low) else "")
        left = self.left_out
        return (f"Without seed{'s' if len(left) > 1 else ''} {', '.join(map(str, left))}"
                f"{' of ' + self.variant if self.variant else ''} ({n} seeds that did not "
                f"collapse): {self.verdict}; {per_r}{slope}.")


@dataclass(frozen=True)
class OutlyingSeeds:
    """Claim 2's part 2o: the outlying seeds found (the rule's `outlier_z`, `distinct_fall`)
    and the reading of each variant without them."""

    found: tuple[Outlier, ...]
    outlier_z: float
    distinct_fall: float
    without: tuple[Without, ...]

    def sentence(self) -> str:
        named = "; ".join(o.named() for o in self.found)
        head = (f"Outlying seed (its sampling collapsed apart from the others: modified z <= "
                f"-{self.outlier_z:g} on the seeds' window means and >= "
                f"{self.distinct_fall:.0%} below their median): {named}. The intervals above "
                "keep every seed, so they rest on it.")
        return " ".join([head, *(w.sentence() for w in self.without)])


@dataclass(frozen=True)
class ModeCollapse:
    """One variant and R whose per-group rank falls towards the target as distinct completions
    fall (collapse.collapse_warnings): the early and late stages' means."""

    variant: str
    group_size: int
    target: float
    early_rank: float
    late_rank: float
    early_steps: str  # the stage's probe steps, "first-last"
    late_steps: str
    early_distinct: float
    late_distinct: float
    early_entropy: float  # NaN: not measured
    late_entropy: float

    def sentence(self) -> str:
        entropy = (f", token entropy from {self.early_entropy:.3f} to {self.late_entropy:.3f} "
                   "nats" if math.isfinite(self.early_entropy) and math.isfinite(self.late_entropy)
                   else "")
        who = f"{self.variant}, " if self.variant else ""
        return (f"Mode collapse ({who}R={self.group_size}): the per-group rank falls from "
                f"{self.early_rank:.2f} (probe steps {self.early_steps}) to {self.late_rank:.2f} "
                f"(steps {self.late_steps}) while distinct completions per informative group fall "
                f"from {self.early_distinct:.2f} to {self.late_distinct:.2f}{entropy}. A group "
                f"has at most as many independent rows as distinct completions, so a rank near "
                f"{self.target:g} here can be sampling collapse, not the zero-sum structure: read "
                "claim 2 on the early stage, or measure every R on the same weights with "
                "`grpo probe`.")


@dataclass(frozen=True)
class VerdictCounts:
    """How many of claim 2's variants' matrix x measure pairs read each verdict."""

    counts: tuple[tuple[str, int], ...]

    def sentence(self) -> str:
        words = ", ".join(f"{n} {w}" for w, n in self.counts)
        return f"Over every matrix x measure pair of these variants: {words} (table 'Verdicts')."


def no_zero_sum_ranks(matrix: str, measure: str) -> str:
    """Claim 2's evidence where no zero-sum outcome estimator's run has its ranks."""
    return (f"no {matrix} / {measure} ranks from a zero-sum outcome estimator's run (no such "
            "run, no probe step, or no informative group)")
