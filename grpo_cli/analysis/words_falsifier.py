"""Claim 4's deciding parts in words: the renderer of falsifier.py's facts.

falsifier.judge_pair and falsifier.judge_difference compute a part's verdict, flip probability
and seeds that would settle it, and hand its numbers on as these records; the sentences are
written here (parts.Part.sentence renders them when a reader asks).
"""

from __future__ import annotations

from dataclasses import dataclass

from grpo_cli.analysis import bootstrap as bs
from grpo_cli.analysis.rules import CONTRADICTED, INCONCLUSIVE, NOT_JUDGED, SUPPORTED
from grpo_cli.analysis.words_over_r import settle_text


def _bounds(w: bs.Interval, signed: bool) -> str:
    """An interval's bounds as Interval.text shows them."""
    form = "{:+.2f}" if signed else "{:.2f}"
    return f"[{form.format(w.low)}, {form.format(w.high)}]"


@dataclass(frozen=True)
class PairPart:
    """A deciding part judged on both bars: per-token minus outcome >= margin and per-token >=
    target + margin, at `confidence`, each wholly below at `level_below` (`wide`) to contradict."""

    name: str
    verdict: str
    outcome: bs.Interval
    per_token: bs.Interval
    diff: bs.Interval
    wide: tuple[bs.Interval, bs.Interval]  # diff and per_token at level_below
    target: float
    margin: float
    confidence: float
    level_below: float  # the Bonferroni level over the two intervals
    flip: float
    seeds: int | None

    def decided(self) -> str:
        margin, target = self.margin, self.target
        sides = ((self.diff, self.wide[0], margin, "the difference"),
                 (self.per_token, self.wide[1], target + margin, "the per-token rank"))
        at_level = f" at {self.level_below:.0%}, the Bonferroni level over the two intervals"
        if self.verdict == SUPPORTED:
            return f"both intervals lie above {margin:g} and {target + margin:g}"
        if self.verdict == CONTRADICTED:
            return " and ".join(
                f"{what} {_bounds(w, what == 'the difference')} is wholly below {bound:g}"
                for _, w, bound, what in sides if w.high < bound) + at_level
        if self.verdict == INCONCLUSIVE:
            if any(iv.high < bound <= w.high for iv, w, bound, _ in sides):
                return "; ".join(
                    f"{what} is below {bound:g} at {self.confidence:.0%} but not{at_level}"
                    if iv.high < bound else f"{what} straddles {bound:g}"
                    for iv, w, bound, what in sides if iv.low <= bound <= w.high)
            return (f"an interval straddles {margin:g} (difference) or {target + margin:g} "
                    "(per-token rank)")
        return "no interval of the difference (one unit on a side)"

    def sentence(self) -> str:
        n = min(self.outcome.n, self.per_token.n)
        return (f"{self.name}: {self.verdict}; per-token {self.per_token.text(2)} vs outcome "
                f"{self.outcome.text(2)}, difference {self.diff.text(2, sign=True)}: "
                f"{self.decided()}" + settle_text(self.verdict, self.flip, self.seeds, n) + ".")


@dataclass(frozen=True)
class DifferencePart:
    """A deciding part judged on the difference alone: the per-token groups' `distinct`
    completions leave no room above the absolute bar (target + margin)."""

    name: str
    verdict: str
    outcome: bs.Interval
    per_token: bs.Interval
    diff: bs.Interval
    distinct: float  # the per-token groups' mean distinct completions
    target: float
    margin: float
    flip: float
    seeds: int | None

    def sentence(self) -> str:
        margin, bar = self.margin, self.target + self.margin
        decided = {
            SUPPORTED: f"the difference lies above {margin:g}",
            CONTRADICTED: f"the difference is wholly below {margin:g}",
            INCONCLUSIVE: f"the difference straddles {margin:g}",
            NOT_JUDGED: "no interval of the difference (one unit on a side)",
        }[self.verdict]
        why = (f"the absolute bar (per-token rank >= {bar:g}) is not judged here: the per-token "
               f"groups hold {self.distinct:.2f} distinct completions on average, a group's rank "
               f"is at most its number of distinct completions, and that leaves less than the "
               f"margin {margin:g} above {bar:g} (the bar is judged where they hold >= "
               f"{bar + margin:g})")
        n = min(self.outcome.n, self.per_token.n)
        return (f"{self.name}: {self.verdict}; per-token {self.per_token.text(2)} vs outcome "
                f"{self.outcome.text(2)}, difference {self.diff.text(2, sign=True)}: {decided}; "
                f"{why}" + settle_text(self.verdict, self.flip, self.seeds, n) + ".")


def pair_name(other: str, base: str) -> str:
    """An outcome / per-token pair, as its parts and the claim's table name it."""
    return f"{other} vs {base}"


def at_r(name: str, size: int, same_rollouts: bool = False) -> str:
    """A deciding part's name: its pair at R (grpo probe pairs: on the same rollouts)."""
    return f"{name} at R={size}" + (" (same rollouts)" if same_rollouts else "")


def with_stat(name: str, stat: str) -> str:
    return f"{name} ({stat})"


def reading_label(matrix: str, stat: str | None) -> str:
    """The claim's table `reading` column: training runs on `stat`'s rows, or same rollouts."""
    return f"{matrix}, {stat} (training runs)" if stat else f"{matrix}, same rollouts (grpo probe)"


@dataclass(frozen=True)
class Capped:
    """A deciding part not judged: a group of `size` rows has rank <= size (`bar`: the bar no
    estimator can reach there; None: said in short)."""

    name: str
    size: int
    bar: float | None = None

    def sentence(self) -> str:
        why = f"R={self.size} is capped"
        if self.bar is not None:
            why += (f": a group of {self.size} rows has rank <= {self.size}, so no estimator "
                    f"can reach {self.bar:g}")
        return f"{self.name}: not judged, {why}."


@dataclass(frozen=True)
class Missing:
    """A deciding part not judged: no ranks of `missing` (labels) on `matrix` at R=size."""

    name: str
    missing: tuple[str, ...]
    matrix: str
    size: int

    def sentence(self) -> str:
        return (f"{self.name}: not judged, no {' or '.join(self.missing)} {self.matrix} ranks at "
                f"R={self.size}.")


SIDE_WHY = ("not in the verdict: an estimator that gives zero-variance groups non-zero "
            "advantages (a learned critic) has more non-zero rows in the batch matrix, and more rows "
            "raise its rank without any per-token credit; per non-zero row, and on the per-group "
            "matrix's informative groups, those rows do not count")


@dataclass(frozen=True)
class SideReading:
    """One pair's whole-batch side reading on one measure: per-token minus outcome per R."""

    name: str
    matrix: str
    measure: str
    per_r: tuple[tuple[int, bs.Interval], ...]
    digits: int

    def sentence(self) -> str:
        return f"{self.name}, {self.matrix} / {self.measure}: " + ", ".join(
            f"R={r} {iv.text(self.digits, True)}" for r, iv in self.per_r)


@dataclass(frozen=True)
class SidePart:
    """Claim 4's part 4s: every pair's side reading on the whole-batch matrix."""

    matrix: str
    readings: tuple[SideReading, ...]

    def sentence(self) -> str:
        return (f"Side reading, {self.matrix} (per-token minus outcome, {SIDE_WHY}): "
                + "; ".join(r.sentence() for r in self.readings) + ".")


def side_question(matrix: str) -> str:
    return f"side reading: {matrix}"


def no_families(zero_sum: str, per_token: str) -> str:
    """Claim 4's evidence where the results lack an outcome or a per-token estimator."""
    return (f"the results do not hold both an outcome estimator (zero-sum outcome credit; "
            f"{zero_sum}) and a per-token one ({per_token}); `make reproduce-cpu` runs both")


def no_ranks(matrix: str, measure: str) -> str:
    return f"no {matrix} / {measure} ranks for these estimators"
