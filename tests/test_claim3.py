"""Claim 3 (issue 61): seeds-to-settle at the level its verdict uses, the "supported" side
unadjusted (every part must hold: an intersection-union test), and one pooled test beside the
parts. Closed forms: Student t tails (bootstrap.t_upper_tail, exact for integer df)."""

from __future__ import annotations

import math

import pytest
from results_factory import write_sweep

from grpo_cli.analysis import bootstrap as bs
from grpo_cli.analysis.claims import _more_seeds, sparsity_claim
from grpo_cli.analysis.grouping import group_runs
from grpo_cli.analysis.load import load_runs
from grpo_cli.analysis.rules import Rules


def _claim(root, **kwargs):
    write_sweep(root, estimators=("grpo",), matrices=("rollout_group",), **kwargs)
    runs = load_runs([root])
    group_runs(runs)
    return sparsity_claim(runs, Rules())


def _p_with_more(estimate: float, se: float, n: int, more: int) -> float:
    """P(T > t) with `more` more seeds, the spread held fixed: se sqrt(n / (n + more)), n + more - 1 df."""
    return bs.t_upper_tail(estimate / (se * math.sqrt(n / (n + more))), n + more - 1)


def test_more_seeds_closed_form():
    """Mean slope 1, se 0.5 over 4 seeds: t = 2 on 3 df, p 0.0697 > 0.05; one more seed gives
    t = 2.236 on 4 df, p 0.0445, so 5 in all. At 0.05 / 4 (Holm's first step over 4 parts) it
    takes 5 more: p 0.0127 with 4 more, 0.0085 with 5."""
    iv = bs.Interval(1.0, 1.0 - 1.1767, 1.0 + 1.1767, 4, se=0.5, df=3)
    assert _p_with_more(1.0, 0.5, 4, 0) > 0.05 >= _p_with_more(1.0, 0.5, 4, 1)
    assert _more_seeds(iv, "above", 0.05) == 5
    assert _p_with_more(1.0, 0.5, 4, 4) > 0.0125 >= _p_with_more(1.0, 0.5, 4, 5)
    assert _more_seeds(iv, "above", 0.0125) == 9
    mirrored = bs.Interval(-1.0, -2.1767, 0.1767, 4, se=0.5, df=3)
    assert _more_seeds(mirrored, "below", 0.05) == 5 and _more_seeds(mirrored, "above", 0.05) is None


def test_growth_excluding_zero_is_supported_unadjusted_and_says_holm_beside(tmp_path):
    """Two seeds whose slopes differ (0.010 and 0.012 per step on grad_sparsity: t = 11 on 1 df,
    p = 0.0289 per part; 0.0050 and 0.0055 on grad_hoyer: t = 21, p 0.0152): every Holm-adjusted
    p over the 6 parts is > 0.05 (0.061-0.091). The claim needs every part to grow, so each part
    reads its growth unadjusted: supported (it read inconclusive with 'the estimate sits on a
    boundary: more seeds may not settle it' when Holm decided it)."""
    claim = _claim(tmp_path, sparsity=lambda r, seed, step: 0.2 + (0.01 + 0.002 * seed) * step,
                   hoyer=lambda r, seed, step: 0.3 + (0.005 + 0.0005 * seed) * step)
    sparsity = claim.table[(claim.table["reading"] == "sparsity")
                           & (claim.table["measure"] == "grad_sparsity")]
    assert sparsity["p (growth)"].to_numpy() == pytest.approx(0.5 - math.atan(11) / math.pi)
    assert (sparsity["p (growth, Holm)"] > 0.05).all() and (sparsity["verdict"] == "supported").all()
    assert claim.verdict == "supported"
    part = next(p for p in claim.parts if p.name == "3")
    assert "unadjusted: the claim needs every part to grow" in part.sentence
    assert "Holm over 6 parts p =" in part.sentence and "sits on a boundary" not in claim.evidence


def test_an_inconclusive_part_says_the_seeds_at_its_verdicts_level(tmp_path):
    """Three seeds with slopes 0.010, -0.005, 0.020 per step on every part: mean 0.00833, se
    0.00726 (t = 1.147 on 2 df, p 0.185): inconclusive, and about as many seeds in all as make
    the unadjusted growth p <= 0.05 with the spread held fixed."""
    slopes = {0: 0.010, 1: -0.005, 2: 0.020}
    claim = _claim(tmp_path, seeds=(0, 1, 2), sparsity=lambda r, seed, step: 0.2 + slopes[seed] * step,
                   hoyer=lambda r, seed, step: 0.3 + slopes[seed] * step)
    mean = sum(slopes.values()) / 3
    se = math.sqrt(sum((s - mean) ** 2 for s in slopes.values()) / 2 / 3)
    more = next(k for k in range(1000) if _p_with_more(mean, se, 3, k) <= 0.05)
    part = next(p for p in claim.parts if p.name == "3")
    assert part.verdict == "inconclusive" and part.seeds == 3 + more
    assert f"about {3 + more} seeds in all ({more} more) would settle it" in part.sentence


def test_the_pooled_test_reads_the_mean_relative_slope_per_seed(tmp_path):
    """The factory's sparsity 0.2 + 0.01 step and Hoyer 0.3 + 0.005 step on probe steps 0, 5,
    10, 15 (mean step 7.5): relative slopes 1e4 x 0.01 / 0.275 = 363.64% and 1e4 x 0.005 /
    0.3375 = 148.15% per 100 steps, so each seed's mean over its 6 parts is 255.89%; two equal
    seeds (no spread): the sign decides, p (growth) 0."""
    claim = _claim(tmp_path)
    pooled = next(p for p in claim.parts if p.name == "3p")
    assert pooled.verdict == "supported"
    assert "+255.89 [+255.89, +255.89]% per 100 steps over 2 seeds, p (growth) = 0," in pooled.sentence
    assert "12 run x measure series" in pooled.sentence and pooled.sentence in claim.evidence
    assert "3p" not in claim.parts_text  # the parts' counts are the per-part readings
