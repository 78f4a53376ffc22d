"""Issue 29: verdicts a referee would accept, on constructed results with a known answer, and
the intervals against independent computations written here (issue 42: seed-level intervals;
their coverage is simulated in tests/test_calibration.py)."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from results_factory import write_run, write_sweep

from grpo_cli.analysis import analyze
from grpo_cli.analysis import bootstrap as bs
from grpo_cli.analysis.docs_blocks import DocsBlockError, markers, replace_block
from grpo_cli.analysis.rules import Rules, capped_group_sizes, judged_group_sizes, three_way

SIZES = (2, 4, 8, 16)


def _noisy(sd: float, per_doubling: float = 0.0, step_sd: float = 0.02):
    """rank = 2 + per_doubling * log2(R / 2) + a seed x R effect (sd) + step noise."""
    def rank(r, seed, step):
        effect = np.random.default_rng([seed, r]).normal(0, sd)
        noise = np.random.default_rng([seed, r, step]).normal(0, step_sd)
        return 2.0 + per_doubling * math.log2(r / 2) + effect + noise
    return rank


def _claim2(root, rank, seeds, sizes=SIZES, **kwargs):
    write_sweep(root, group_sizes=sizes, seeds=seeds, matrices=("rollout_group",), rank=rank,
                group_spread=0.2, **kwargs)
    result = analyze([root], measure="erank_entropy", figures=False)
    return next(c for c in result.claims if c.number == 2), result


# ---- claim 2 on known answers -------------------------------------------------------------------
def test_flat_rank_is_supported_with_enough_seeds_and_not_judged_with_one(tmp_path):
    claim, result = _claim2(tmp_path / "many", _noisy(0.05), seeds=range(8))
    assert claim.verdict == "supported", claim.evidence
    row = result.verdicts.iloc[0]
    assert row["judged"] == "4, 8, 16" and row["capped"] == "2"  # R=2 is forced: left out
    assert row["slope_low"] < 0 < row["slope_high"]
    claim, _ = _claim2(tmp_path / "one", _noisy(0.05), seeds=(0,))
    assert claim.verdict == "not judged"  # a between-seed reading (issue 42: was inconclusive)
    assert "at least 2 seeds per R are needed" in claim.evidence


def test_rank_growing_by_one_per_doubling_is_contradicted(tmp_path):
    claim, result = _claim2(tmp_path, _noisy(0.1, per_doubling=1.0), seeds=(0, 1, 2))
    assert claim.verdict == "contradicted"
    assert claim.parts_text == "2a contradicted, 2b contradicted, 2c contradicted"
    row = result.verdicts.iloc[0]
    assert row["slope_low"] < 1.0 < row["slope_high"]


def test_flat_but_noisy_two_seeds_is_inconclusive(tmp_path):
    claim, result = _claim2(tmp_path, _noisy(0.45), seeds=(0, 1))
    assert claim.verdict == "inconclusive"
    part = next(p for p in claim.parts if p.name == "2b")
    assert part.verdict == "inconclusive"
    assert 0 < part.flip < 1 and "flips in" in part.sentence
    assert part.seeds is None or part.seeds > 2  # "about N seeds in all would settle it"


def test_practically_flat_rank_reads_supported(tmp_path):
    """Issue 42's known answer: 2.00 / 2.05 / 2.10 at R = 4 / 8 / 16 with 4 seeds is within the
    tolerance (2b, an equivalence reading) and the band (2c): supported, even though the slope
    is not exactly 0 (2a, descriptive, may read contradicted)."""
    noisy = _noisy(0.03)

    def rank(r, seed, step):
        return noisy(r, seed, step) + 0.05 * math.log2(r / 4) if r > 2 else noisy(r, seed, step)

    claim, result = _claim2(tmp_path, rank, seeds=range(4))
    assert claim.verdict == "supported", claim.evidence
    row = result.verdicts.iloc[0]
    assert row["verdict_growth"] == "supported" and row["verdict_level"] == "supported"
    assert 0 < row["slope_low"] and row["slope_high"] < 0.25  # excludes 0: 2a contradicted
    assert row["verdict_slope_zero"] == "contradicted"
    assert "descriptive, not in the verdict" in claim.evidence


def test_flat_rank_above_the_band_reads_mixed_and_the_claim_keeps_it(tmp_path):
    """A flat rank of 3: 2b supported, 2c contradicted, so the pair reads mixed, and the claim
    keeps "mixed" (combine dropped it: the claim read "not judged")."""
    claim, result = _claim2(tmp_path, lambda r, seed, step: _noisy(0.03)(r, seed, step) + 1.0,
                            seeds=range(4))
    assert result.verdicts.iloc[0]["verdict"] == "mixed"
    assert claim.verdict == "mixed" and claim.parts_text.startswith("2a")


def test_only_one_r_above_the_cap_cannot_be_judged(tmp_path):
    """R = {2, 4}: R = 2 is capped, so no slope is judged (keeping R = 2 would read a slope
    that only the cap makes)."""
    claim, result = _claim2(tmp_path, _noisy(0.05), seeds=range(3), sizes=(2, 4))
    assert claim.verdict == "not judged"
    assert "cannot judge beyond the cap: R=2 capped" in claim.evidence
    assert result.verdicts.iloc[0]["judged"] == "4"


def test_analysis_is_deterministic(tmp_path):
    _, first = _claim2(tmp_path / "a", _noisy(0.3), seeds=(0, 1, 2))
    again = analyze([tmp_path / "a"], measure="erank_entropy", figures=False)
    columns = ["slope_low", "slope_high", "flip_growth"]
    pd.testing.assert_frame_equal(first.verdicts[columns], again.verdicts[columns])


def test_confidence_sets_the_interval_width(tmp_path):
    write_sweep(tmp_path, group_sizes=SIZES, seeds=(0, 1, 2), matrices=("rollout_batch",),
                rank=_noisy(0.2))
    wide = analyze([tmp_path], measure="stable_rank", confidence=0.99, figures=False).verdicts
    narrow = analyze([tmp_path], measure="stable_rank", confidence=0.8, figures=False).verdicts
    assert (wide["slope_high"] - wide["slope_low"]).item() > (
        narrow["slope_high"] - narrow["slope_low"]).item()
    assert "80% seed-level Student-t intervals" in (tmp_path / "analysis" / "details.md").read_text()


# ---- the rules ----------------------------------------------------------------------------------
def test_capped_sizes_and_three_way():
    assert capped_group_sizes([2, 4, 8, 16]) == [2]
    assert judged_group_sizes([2, 4, 8]) == [4, 8]
    assert judged_group_sizes([2, 4]) == [4]  # one uncapped R: no slope (issue 42)
    assert three_way(1.6, 2.4, 1.5, 2.5) == "supported"
    assert three_way(2.6, 3.0, 1.5, 2.5) == "contradicted"
    assert three_way(2.4, 2.6, 1.5, 2.5) == "inconclusive"
    assert three_way(-math.inf, math.inf, 1.5, 2.5) == "not judged"  # no interval: one seed
    rules = Rules()
    assert rules.slope_zero(0.13, 0.58) == "contradicted"  # excludes 0: the literal claim fails
    assert rules.growth_small(0.13, 0.58) == "inconclusive"  # the CPU example
    assert rules.slope_zero(-0.1, 0.2) == "supported"
    assert rules.one_sided_level == pytest.approx(0.05)


# ---- intervals against independent computations -------------------------------------------------
def test_t_quantile_matches_tables():
    assert bs.t_quantile(0.95, 1) == pytest.approx(6.3138, abs=1e-4)
    assert bs.t_quantile(0.95, 2) == pytest.approx(2.9200, abs=1e-4)
    assert bs.t_quantile(0.975, 5) == pytest.approx(2.5706, abs=1e-4)
    assert bs.t_quantile(0.975, 40) == pytest.approx(2.0211, abs=1e-4)
    assert bs.t_upper_tail(6.3138, 1) == pytest.approx(0.05, abs=1e-5)
    assert bs.t_upper_tail(-2.9200, 2) == pytest.approx(0.95, abs=1e-5)


def test_mean_interval_is_the_student_t_interval_of_the_seed_values():
    """mean +- t_{n-1} s / sqrt(n) (closed form); one value: no interval."""
    values = np.random.default_rng(3).normal(2.0, 0.4, 6)
    iv = bs.mean_interval(values, 0.9, np.random.default_rng(0))
    half = 2.0150 * values.std(ddof=1) / math.sqrt(6)  # t_{0.95, 5} from tables
    assert iv.estimate == pytest.approx(values.mean())
    assert (iv.low, iv.high) == pytest.approx((values.mean() - half, values.mean() + half),
                                              abs=1e-4)
    assert iv.replicates.std() == pytest.approx(iv.se * math.sqrt(5 / 3), rel=0.15)  # Var T_5
    assert not bs.mean_interval([2.0], 0.9, np.random.default_rng(0)).finite


def test_welch_interval_closed_form():
    """Difference of means 3 - 1 with variances 1 and 4 over 2 and 5 units: se^2 = 1/2 + 4/5,
    Welch-Satterthwaite df = 1.69 / (0.25 + 0.16) = 4.12 -> 4 (floored)."""
    a, b = np.array([2.5, 3.5]), 1 + np.array([-2, -1, 0, 1, 2]) * math.sqrt(4 / 2.5)
    iv = bs.welch_interval([a, b], [1.0, -1.0], 0.9, np.random.default_rng(0))
    se = math.sqrt(0.5 / 2 + 4 / 5)
    assert iv.estimate == pytest.approx(2.0) and iv.se == pytest.approx(se) and iv.df == 4
    assert iv.high - iv.estimate == pytest.approx(2.1318 * se, abs=1e-3)  # t_{0.95, 4}


def test_paired_slope_is_the_t_interval_of_per_seed_slopes(tmp_path):
    """Every seed ran every R: the slope's interval is that of the per-seed slopes."""
    from grpo_cli.analysis.over_r import PerR, slope_interval

    rng = np.random.default_rng(0)
    table = np.array([[2.0, 2.3, 2.5], [2.2, 2.4, 2.9], [1.9, 2.1, 2.6]])  # [seed, R]
    per_r = {r: PerR(bs.mean_interval(table[:, j], 0.9, rng), table[:, j], (0, 1, 2))
             for j, r in enumerate((4, 8, 16))}
    iv = slope_interval(per_r, [4, 8, 16], Rules(), rng)
    slopes = bs.slope(np.log2([4.0, 8.0, 16.0]), table)  # per seed
    expected = bs.mean_interval(slopes, 0.9, rng)
    assert (iv.estimate, iv.low, iv.high) == pytest.approx(
        (expected.estimate, expected.low, expected.high))


def test_seeds_to_settle_follows_one_over_sqrt_n():
    # estimate 0.4, interval [0.1, 0.7] at n = 4, boundary 0.25: half-width 0.3 must drop below
    # 0.15, i.e. t_{n-1}/sqrt(n) <= t_3/2 / 2
    iv = bs.Interval(0.4, 0.1, 0.7, 4)
    n = bs.seeds_to_settle(iv, [0.25], 0.9)
    scale = lambda m: bs.t_quantile(0.95, m - 1) / math.sqrt(m)  # noqa: E731
    ratio = lambda m: scale(m) / scale(4)  # noqa: E731
    assert ratio(n) * 0.3 < 0.15 <= ratio(n - 1) * 0.3
    assert bs.seeds_to_settle(bs.Interval(0.25, 0.1, 0.4, 4), [0.25], 0.9) is None


# ---- bad input ----------------------------------------------------------------------------------
def test_one_seed_one_r_no_probe_steps_say_what_they_cannot_judge(tmp_path):
    write_run(tmp_path / "one", group_size=4, seed=0, matrices=("rollout_group",))
    result = analyze([tmp_path / "one"], figures=False)
    claims = {c.number: c for c in result.claims}
    assert claims[2].verdict == "not judged" and "a slope needs two" in claims[2].evidence
    write_run(tmp_path / "none", group_size=4, seed=0, skip=("ranks.csv", "spectra.parquet"))
    result = analyze([tmp_path / "none"], figures=False)
    claims = {c.number: c for c in result.claims}
    assert claims[2].verdict == "not measured" and "no probe step" in claims[2].evidence
    assert any("claims 2 and 4 cannot be judged" in note for note in result.notes)


def test_a_non_numeric_rank_cell_is_reported(tmp_path):
    run = write_run(tmp_path, group_size=4, seed=0, matrices=("rollout_batch",))
    ranks = pd.read_csv(run / "ranks.csv")
    ranks["erank_entropy"] = ranks["erank_entropy"].astype(object)
    ranks.loc[2, "erank_entropy"] = "n/a?"
    ranks.to_csv(run / "ranks.csv", index=False)
    result = analyze([tmp_path], figures=False)
    expected = "ranks.csv line 4, column erank_entropy: 'n/a?' is not a number (left out)"
    assert any(expected in note for note in result.notes)
    assert expected in (tmp_path / "analysis" / "details.md").read_text()


# ---- docs generated from results ----------------------------------------------------------------
def test_write_docs_replaces_only_the_marked_block(tmp_path):
    start, end = markers("cpu")
    text = f"intro\n{start}\nold numbers\n{end}\noutro\n"
    assert replace_block(text, "cpu", "new") == f"intro\n{start}\nnew\n{end}\noutro\n"
    with pytest.raises(DocsBlockError, match="expected one"):
        replace_block("no markers", "cpu", "new")


def test_cli_write_docs_and_confidence(tmp_path):
    from typer.testing import CliRunner

    from grpo_cli.cli import app

    write_sweep(tmp_path / "res", group_sizes=(2, 4, 8), seeds=(0, 1), matrices=("rollout_group",),
                rank=2.0, group_spread=0.0)
    page = tmp_path / "page.md"
    start, end = markers("toy")
    page.write_text(f"# page\n{start}\nstale\n{end}\n")
    done = CliRunner().invoke(app, ["analyze", str(tmp_path / "res"), "--confidence", "0.8",
                                    "--write-docs", "toy", "--docs-page", str(page)])
    assert done.exit_code == 0, done.output
    text = page.read_text()
    assert "stale" not in text and "80% intervals" in text
    assert "| 2. The gradient matrix has effective rank ~2 whatever the group size R. | supported |" in text
    assert max(len(line) for line in text.splitlines()) <= 500
    bad = CliRunner().invoke(app, ["analyze", str(tmp_path / "res"), "--write-docs", "nope",
                                   "--docs-page", str(page)])
    assert bad.exit_code == 2 and "expected one" in bad.output
    for option, name in (("--tolerance", "band"), ("--trend", "growth_tolerance")):
        negative = CliRunner().invoke(app, ["analyze", str(tmp_path / "res"), option, "-0.1"])
        assert negative.exit_code != 0, negative.output
        assert f"{name} (grpo analyze {option}) must be >= 0, not -0.1" in negative.output


def test_a_probe_run_resamples_its_groups_instead_of_seeds(tmp_path):
    """`grpo probe` (run.json kind "probe"): one set of weights and one seed per R, so the prompt
    groups are the resampled units; a training run with one seed gets no interval."""
    import json

    for r in (4, 8):
        run = write_run(tmp_path, group_size=r, seed=0, matrices=("rollout_group",), groups=12,
                        rank=2.0, group_spread=0.01)
        info = json.loads((run / "run.json").read_text())
        (run / "run.json").write_text(json.dumps(info | {"kind": "probe"}))
    result = analyze([tmp_path], measure="erank_entropy", figures=False)
    row = result.verdicts.iloc[0]
    assert np.isfinite(row["slope_low"]) and row["verdict_level"] == "supported"
