"""Claims 2 and 4's readings beside their verdicts, in words: the renderer of beside.py's facts.

beside.py computes claim 2's rank at matched diversity (diversity.py), on the same weights
(`grpo probe`), the `layer` gradient (layer_gradient.py) and claim 4's difference per distinct
completion, and hands them on as these records; every sentence about them is written here.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from grpo_cli.analysis import bootstrap as bs
from grpo_cli.analysis.diversity import DIVERSITY, GEOMETRY, NO_GROWTH, UNDECIDED

GROWTH_SOURCE = {  # diversity.growth_source -> what claim 2's sentence says of it
    DIVERSITY: "the growth with R is diversity: at equal distinct completions the rank "
                         "does not grow beyond +{tol:g} per doubling, so the raw slope measures "
                         "how many distinct completions each R samples from this policy (its "
                         "entropy), not GRPO's geometry",
    GEOMETRY: "the growth with R is geometry: the rank grows beyond +{tol:g} per "
                        "doubling at equal distinct completions too",
    NO_GROWTH: "there is no growth beyond +{tol:g} per doubling to explain",
    UNDECIDED: "which of the two moves with R is undecided (an interval straddles "
                         "+{tol:g}, or there is none)",
}
LAYER_WHY = (
    "Which matrix the paper's words point to: 'an SVD of GRPO gradients' on a 4B model most "
    "plausibly means this weight-shaped per-layer gradient, the batch gradient of a weight as "
    "the training loop holds it (d_out x d_in, what low-rank-gradient methods decompose); the "
    "per-rollout R x P matrix over ~4e9 parameters needs R separate whole-model gradients per "
    "group, which no training loop forms. Claim 2's verdict reads rollout_group, the matrix of "
    "the paper's zero-sum argument; the layer reading is shown beside it, not in the verdict."
)



def _r_list(sizes) -> str:
    return ", ".join(f"R={r}" for r in sizes)


@dataclass(frozen=True)
class MatchedDiversity:
    """Claim 2's part 2m on training runs: one variant's rank slope per doubling of R without
    and with its distinct completions as categories (diversity.slope_readings), the share of the
    orthogonal closed form, the early-stage slopes, and what moves with R (diversity.growth_source)."""

    label: str
    matrix: str
    measure: str
    stat: str  # the groups read (credit_compare.INFORMATIVE)
    raw: bs.Interval
    matched: bs.Interval
    units: str  # "seeds" | "groups"
    judged: tuple[int, ...]
    distinct: tuple[float, ...]  # mean distinct completions per group at each judged R
    share: tuple[tuple[int, bs.Interval], ...] | None  # (R, share of the closed form), judged R
    share_slope: bs.Interval | None
    early: tuple[bs.Interval, bs.Interval] | None  # (raw, matched) on each run's first half
    source: str  # diversity.growth_source
    tolerance: float  # Rules.growth_tolerance

    def sentence(self) -> str:
        shares = "" if self.share is None else (
            "; the rank is " + " / ".join(iv.text(3) for _, iv in self.share)
            + " of the orthogonal closed form at its composition and distinct completions at "
            + "/".join(f"R={r}" for r, _ in self.share)
            + (f" (slope {self.share_slope.text(3, sign=True)} per doubling)"
               if self.share_slope else ""))
        earlier = "" if self.early is None else (
            f"; early in training (each run's first half of probe steps) "
            f"{self.early[0].text(2, sign=True)} without control and "
            f"{self.early[1].text(2, sign=True)} with it")
        return (
            f"At matched diversity ({self.label}, {self.matrix} / {self.measure}, {self.stat}, "
            f"claim 2's window; descriptive, not in the verdict): a group's rank per doubling of "
            f"R is {self.raw.text(2, sign=True)} without control and "
            f"{self.matched.text(2, sign=True)} with its distinct completions as categories "
            f"(per-{self.units[:-1]} regressions over {_r_list(self.judged)}; distinct "
            "completions per group " + " / ".join(f"{d:.2f}" for d in self.distinct)
            + f"){shares}{earlier}: " + GROWTH_SOURCE[self.source].format(tol=self.tolerance) + ".")


@dataclass(frozen=True)
class SameWeights:
    """Claim 2's part 2m on `grpo probe` directories: every R on the same weights."""

    label: str
    source: str  # the probed source
    step: int
    units: str
    raw: bs.Interval
    matched: bs.Interval
    judged: tuple[int, ...]
    share: tuple[tuple[int, bs.Interval], ...] | None  # judged R only
    growth: str  # diversity.growth_source
    tolerance: float

    def sentence(self) -> str:
        shares = "" if self.share is None else "; share of the closed form " + ", ".join(
            f"R={r} {iv.text(3)}" for r, iv in self.share)
        return (
            f"On the same weights ({self.label}, grpo probe of {self.source} at step {self.step}, "
            f"its {self.units} as units): a group's rank per doubling of R is "
            f"{self.raw.text(2, sign=True)} without control and "
            f"{self.matched.text(2, sign=True)} with its distinct completions as categories "
            f"over {_r_list(self.judged)}{shares}: "
            + GROWTH_SOURCE[self.growth].format(tol=self.tolerance) + ".")


@dataclass(frozen=True)
class PerDistinct:
    """Claim 4's part 4d: one pair's per-token minus outcome difference of a group's rank per
    distinct completion, per judged R: (R, difference, distinct per-token, distinct outcome)."""

    name: str
    stat: str
    readings: tuple[tuple[int, bs.Interval, float, float], ...]
    paired: bool  # every R paired by seed (else Welch's interval)

    def sentence(self) -> str:
        ivs = [iv for _, iv, _, _ in self.readings]
        if all(iv.finite and iv.high < 0 for iv in ivs):
            what = ("per-token credit lowers the rank per distinct completion at every R: it "
                    "concentrates directions here; it does not add them")
        elif all(iv.finite and iv.low > 0 for iv in ivs):
            what = ("per-token credit raises the rank per distinct completion at every R: it adds "
                    "directions beyond what more distinct completions give")
        else:
            what = "no difference per distinct completion holds at every R"
        paired = "paired by seed" if self.paired else "Welch's interval"
        values = ", ".join(f"R={r} {iv.text(3, sign=True)} (distinct completions "
                           f"{a:.2f} vs {b:.2f})" for r, iv, a, b in self.readings)
        return (f"Per distinct completion ({self.name}, {self.stat}; per-token minus outcome of a "
                f"group's rank / its distinct completions, {paired}; reported, not in the "
                f"verdict): {values}: {what}.")


@dataclass(frozen=True)
class LayerPooled:
    """One variant's pooled layer-gradient reading (layer_gradient.LayerReading) and its
    weights' range at the largest R."""

    label: str
    measure: str
    per_r: tuple[tuple[int, bs.Interval], ...]
    slope: bs.Interval | None
    growth: str  # 2b's verdict on it
    level: str  # 2c's
    largest: int
    low: float  # the weights' range at R = largest (NaN: none)
    high: float

    def sentence(self) -> str:
        values = ", ".join(f"R={r} {iv.text(2)}" for r, iv in self.per_r)
        slope = "" if self.slope is None else f"; slope {self.slope.text(2, sign=True)} per doubling"
        weights = (f"; per weight at R={self.largest} from {self.low:.2f} to {self.high:.2f}"
                   if math.isfinite(self.low) else "")
        return (f"{self.label}, {self.measure} (mean over layers): {values}{slope} "
                f"(2b {self.growth}, 2c {self.level}){weights}")


@dataclass(frozen=True)
class LayerBeside:
    """Claim 2's part 2w: the layer gradient's pooled readings beside `matrix`, and which matrix
    the paper's words point to."""

    matrix: str
    readings: tuple[LayerPooled, ...]

    def sentence(self) -> str:
        return (f"Beside {self.matrix}, the layer gradient (each probed weight's batch gradient; "
                "claim 2's rule on it, table rows 'layer'): "
                + "; ".join(r.sentence() for r in self.readings) + ". " + LAYER_WHY)
