"""The four claim verdicts on constructed results directories whose answer is known."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
import yaml
from results_factory import write_run, write_sweep

from grpo_cli.analysis import analyze
from grpo_cli.analysis.claims import credit_claim, sparsity_claim
from grpo_cli.analysis.grouping import GroupingError, group_runs
from grpo_cli.analysis.load import load_runs
from grpo_cli.analysis.rules import Rules, combine
from grpo_cli.analysis.trend import mann_kendall

MATRICES = ("rollout_group", "rollout_batch")


def _claims(root, **kwargs) -> dict[int, object]:
    """Every claim through `grpo analyze` (tables only)."""
    result = analyze([root], figures=False, **kwargs)
    return {claim.number: claim for claim in result.claims}


def _direct(root, judge):
    """One metrics-based claim straight from the loaded runs (no rank tables: fast)."""
    runs = load_runs([root])
    group_runs(runs)
    return judge(runs, Rules())


def _sweep(root, estimators=("grpo",), **kwargs):
    kwargs.setdefault("matrices", ("rollout_group",))
    return write_sweep(root, estimators=estimators, **kwargs)


def test_combine_rule():
    assert combine(["supported", "supported"]) == "supported"
    assert combine(["contradicted", "not judged"]) == "contradicted"
    assert combine(["contradicted", "inconclusive"]) == "contradicted"
    assert combine(["supported", "contradicted"]) == "mixed"
    assert combine(["supported", "inconclusive"]) == "inconclusive"
    assert combine(["supported", "not judged"]) == "supported"
    assert combine(["not judged"]) == "not judged"
    assert combine([]) == "not judged"
    # a part that is itself mixed stays mixed (issue 42: it was dropped -> "not judged")
    assert combine(["mixed"]) == "mixed"
    assert combine(["mixed", "supported"]) == "mixed"
    assert combine(["mixed", "inconclusive", "not judged"]) == "mixed"


def _series(*values):
    return [(np.arange(len(v), dtype=float), np.array(v, dtype=float)) for v in values]


def test_mann_kendall_exact_null_closed_form():
    # one increasing series of 3: S = 3 pairs; of the 3! orders only this one has S = 3
    test = mann_kendall(_series([1.0, 2.0, 3.0]), level=0.05)
    assert test["S"] == 3 and test["method"] == "exact"
    assert test["p_up"] == pytest.approx(1 / 6) and test["p_down"] == pytest.approx(1.0)
    assert test["min_p"] == pytest.approx(1 / 6)
    assert test["z"] == pytest.approx(2 / math.sqrt(11 / 3))  # Var = 3*2*11/18
    # S = 1 for n = 3 (orders 1 3 2 and 2 1 3 have one inversion): P(S >= 1) = 3/6
    assert mann_kendall(_series([1.0, 3.0, 2.0]), 0.05)["p_up"] == pytest.approx(0.5)
    # pooled over two increasing series of 4: P = (1/24)^2
    assert mann_kendall(_series([1, 2, 3, 4], [0, 1, 2, 3]), 0.05)["p_up"] == pytest.approx(
        1 / 576)
    # pooling: a rising and a falling series cancel
    pooled = mann_kendall(_series([1.0, 2.0, 3.0], [3.0, 2.0, 1.0]), 0.05)
    assert pooled["S"] == 0 and pooled["z"] == 0
    assert np.isnan(mann_kendall(_series([1.0]), 0.05)["z"])


def test_mann_kendall_exact_null_matches_enumeration():
    """P(S >= s) from the Mahonian recursion equals the count over all 5! orderings."""
    from itertools import permutations

    values = [0.3, 0.1, 0.7, 0.5, 0.9]
    observed = mann_kendall(_series(values), 0.05)
    def s_of(order):
        return sum(np.sign(order[j] - order[i]) for i in range(5) for j in range(i + 1, 5))
    count = sum(s_of(p) >= observed["S"] for p in permutations(range(5)))
    assert observed["p_up"] == pytest.approx(count / 120)


def test_mann_kendall_long_series_use_hamed_rao_and_sen_slope():
    steps = np.arange(40, dtype=float)
    test = mann_kendall([(steps, 0.5 * steps)], 0.05)  # a straight line: Sen's slope is exact
    assert test["method"] == "normal, Hamed-Rao"
    assert test["sen"] == pytest.approx(0.5)
    assert test["sen_low"] == pytest.approx(0.5) and test["sen_high"] == pytest.approx(0.5)


def test_no_trend_series_read_supported_no_more_often_than_the_level():
    """Claim 3's false-positive rate over simulated no-trend sparsity series, 2-4 seeds of 3-8
    probe steps (the CPU presets' range) stays at or below the test level."""
    rng = np.random.default_rng(0)
    level = Rules().one_sided_level
    for seeds, points in ((2, 4), (4, 6), (3, 8)):
        hits = sum(
            mann_kendall(_series(*rng.normal(size=(seeds, points))), level)["p_up"] <= level
            for _ in range(1500)
        )
        assert hits / 1500 <= level + 2 * math.sqrt(level * (1 - level) / 1500), (seeds, points)


# ---- claim 1 -----------------------------------------------------------------------------------
def test_claim1_holds_with_per_token_estimator_shown_as_contrast(tmp_path):
    _sweep(tmp_path, estimators=("grpo",), credit_uniform=1.0)
    _sweep(tmp_path, estimators=("ppo",), credit_uniform=0.25)
    claim = _direct(tmp_path, credit_claim)
    assert claim.verdict == "supported"
    verdicts = dict(zip(claim.table["estimator"], claim.table["verdict"], strict=True))
    assert verdicts == {"grpo": "supported", "ppo": "contrast"}
    assert "by construction" in claim.evidence
    assert "0.250" in claim.evidence


def test_claim1_fails_on_one_non_uniform_step(tmp_path):
    _sweep(
        tmp_path, credit_uniform=lambda r, seed, step: 0.9 if (r, seed, step) == (4, 1, 7) else 1
    )
    claim = _direct(tmp_path, credit_claim)
    assert claim.verdict == "contradicted"
    assert claim.table["min uniform frac"].iloc[0] == pytest.approx(0.9)


def test_claim1_undetermined_and_not_measured(tmp_path):
    _sweep(tmp_path / "a", credit_uniform=np.nan)  # the column is empty
    assert _direct(tmp_path / "a", credit_claim).verdict == "not judged"
    _sweep(tmp_path / "b", estimators=("process",), credit_uniform=0.5)
    assert _direct(tmp_path / "b", credit_claim).verdict == "not measured"


# ---- claim 2 -----------------------------------------------------------------------------------
def test_claim2_supported_contradicted_not_judged(tmp_path):
    # every seed equal: the intervals have no width
    _sweep(tmp_path / "flat", rank=2.1, seeds=(0, 1), group_spread=0.0)
    claim = _claims(tmp_path / "flat")[2]
    assert claim.verdict == "supported"
    assert list(claim.table["matrix"]) == ["rollout_group"]
    assert claim.parts_text == "2a supported, 2b supported, 2c supported"
    _sweep(tmp_path / "grows", rank=lambda r, seed, step: float(r), seeds=(0, 1),
           group_spread=0.0)
    assert _claims(tmp_path / "grows")[2].verdict == "contradicted"
    _sweep(tmp_path / "one_r", group_sizes=(4,), rank=2.0, seeds=(0, 1))
    one_r = _claims(tmp_path / "one_r")[2]
    assert one_r.verdict == "not judged"
    assert "only one value of R (R=4): a slope needs two" in one_r.evidence
    _sweep(tmp_path / "ppo_only", estimators=("ppo",), rank=2.0, seeds=(0,))
    assert _claims(tmp_path / "ppo_only")[2].verdict == "not measured"


# ---- claim 3 -----------------------------------------------------------------------------------
def test_claim3_holds_when_sparsity_and_hoyer_rise(tmp_path):
    _sweep(tmp_path)  # factory defaults rise with the step
    claim = _direct(tmp_path, sparsity_claim)
    assert claim.verdict == "supported"
    sparsity = claim.table[claim.table["reading"] == "sparsity"]
    assert set(sparsity["measure"]) == {"grad_sparsity", "grad_hoyer"}
    assert list(claim.table["seeds"].unique()) == [2]
    assert (sparsity["points"] == 8).all()  # probe steps 0, 5, 10, 15 x 2 seeds
    # two seeds rising by the same slope: no spread between seeds, the sign decides
    assert np.allclose(sparsity["p (growth)"], 0.0)
    assert (sparsity["slope / 100 steps"].str.startswith("+1.000")
            | sparsity["slope / 100 steps"].str.startswith("+0.500")).all()
    # descriptive: the pooled Mann-Kendall S of two strictly increasing series of 4 points
    assert (sparsity["S"] == 12).all()
    # the zero-advantage reading is shown beside it, over every step
    zero = claim.table[claim.table["reading"] == "zero-advantage groups"]
    assert set(zero["measure"]) == {"zero_variance_frac"} and (zero["points"] == 40).all()
    assert "zero-advantage reading" in claim.evidence


def test_claim3_flat_is_inconclusive_falling_contradicted_and_mixed_when_r_disagree(tmp_path):
    _sweep(tmp_path / "flat", sparsity=lambda r, seed, step: 0.3, hoyer=lambda r, s, t: 0.5 - t)
    claim = _direct(tmp_path / "flat", sparsity_claim)
    verdicts = claim.table.groupby("measure")["verdict"].unique().to_dict()
    assert list(verdicts["grad_sparsity"]) == ["inconclusive"]  # not significant: never "fails"
    assert list(verdicts["grad_hoyer"]) == ["contradicted"]
    assert claim.verdict == "contradicted"
    _sweep(
        tmp_path / "mixed",
        sparsity=lambda r, seed, step: step if r < 8 else -step,
    )
    claim = _direct(tmp_path / "mixed", sparsity_claim)
    assert claim.verdict == "mixed"
    falling = claim.table[(claim.table["measure"] == "grad_sparsity") & (claim.table["R"] == 8)]
    assert falling["verdict"].item() == "contradicted" and falling["S"].item() < 0


def test_claim3_not_judged_with_one_seed(tmp_path):
    # one seed: the test compares slopes between seeds (issue 42: a between-seed reading)
    _sweep(tmp_path, seeds=(0,), steps=10)
    claim = _direct(tmp_path, sparsity_claim)
    assert claim.verdict == "not judged"
    sparsity = claim.table[claim.table["reading"] == "sparsity"]
    assert (sparsity["verdict"] == "not judged").all()
    assert "needs at least 2 seeds" in claim.parts[0].sentence


def test_claim3_parts_are_holm_adjusted(tmp_path):
    """Two seeds whose slopes differ: the parts' growth p-values are Holm-adjusted over the
    sparsity parts (2 measures x 3 R = 6), so the smallest is multiplied by 6."""
    _sweep(tmp_path, sparsity=lambda r, seed, step: 0.2 + (0.01 + 0.002 * seed) * step,
           hoyer=lambda r, seed, step: 0.3 + (0.005 + 0.004 * seed) * step)
    claim = _direct(tmp_path, sparsity_claim)
    sparsity = claim.table[claim.table["reading"] == "sparsity"]
    assert len(sparsity) == 6
    raw, adjusted = sparsity["p (growth)"], sparsity["p (growth, Holm)"]
    assert adjusted.min() == pytest.approx(min(1.0, 6 * raw.min()))
    assert (adjusted >= raw).all() and "Holm over 6 parts" in claim.evidence


# ---- claim 4 -----------------------------------------------------------------------------------
def _settle(root, ppo_rank: float):
    """grpo at rank 2 and ppo at `ppo_rank` on every matrix row, two equal seeds each (per-group
    rows equal to the aggregate: group_spread 0). tests/test_falsifier.py has the known-answer
    sweeps of the same-rows reading."""
    common = {"matrices": ("rollout_group", "rollout_batch"), "seeds": (0, 1), "group_spread": 0.0}
    _sweep(root, estimators=("grpo",), rank=2.0, **common)
    _sweep(root, estimators=("ppo",), rank=ppo_rank, **common)


def test_claim4_holds_when_per_token_rank_is_well_above(tmp_path):
    _settle(tmp_path, ppo_rank=4.0)
    claim = _claims(tmp_path)[4]
    assert claim.verdict == "supported"
    table = claim.table
    assert list(table["R"]) == [2, 4, 8]
    assert list(table["verdict"]) == ["not judged", "supported", "supported"]  # R=2 capped
    assert np.allclose(table["difference"].dropna(), 2.0)
    assert (table["reading"] == "rollout_group, informative groups (training runs)").all()


def test_claim4_fails_when_per_token_rank_stays_near_2(tmp_path):
    _settle(tmp_path, ppo_rank=2.2)
    assert _claims(tmp_path)[4].verdict == "contradicted"


def test_claim4_not_measured_without_both_kinds(tmp_path):
    _sweep(tmp_path, rank=2.0, seeds=(0,))
    claim = _claims(tmp_path)[4]
    assert claim.verdict == "not measured"
    assert "make reproduce-cpu" in claim.evidence


# ---- outputs -----------------------------------------------------------------------------------
def test_summary_opens_with_the_four_claims(tmp_path):
    _settle(tmp_path, ppo_rank=4.0)
    result = analyze([tmp_path], figures=False)
    markdown = result.files["summary_md"].read_text()
    lines = [line for line in markdown.splitlines() if line.startswith("#")]
    assert lines[1] == "## The paper's four claims"
    assert [line.split(":")[0] for line in lines[2:6]] == [f"### Claim {n}" for n in (1, 2, 3, 4)]
    assert result.files["details_md"].read_text().count("> Rule: ") == 4
    html = result.files["report"].read_text()
    assert html.index("The paper&#x27;s four claims") < html.index("<summary>Runs</summary>")
    csv = pd.read_csv(result.files["summary_csv"])
    claims = csv[csv["kind"] == "claim"]
    assert list(claims["claim"]) == [1, 2, 3, 4]
    assert list(claims["verdict"]) == [c.verdict for c in result.claims]


def test_incomplete_claim_rows_do_not_break_analysis(tmp_path):
    write_run(tmp_path, group_size=2, seed=0, status="running", steps_done=3, matrices=MATRICES)
    result = analyze([tmp_path], figures=False)
    assert [c.verdict for c in result.claims][3] == "not measured"


# ---- keys that follow R ----------------------------------------------------------------------------
def _budget_sweep(root, seeds=(0, 1)):
    """R = 2, 4, 8 at a fixed 32 rollouts per step: prompts_per_step = 32 / R."""
    _sweep(root, rank=lambda r, seed, step: float(r), seeds=seeds)
    for path in root.glob("**/config.yaml"):
        config = yaml.safe_load(path.read_text())
        config["rollout"]["prompts_per_step"] = 32 // config["rollout"]["group_size"]
        path.write_text(yaml.safe_dump(config))


def test_a_key_that_follows_r_joins_the_r_axis_instead_of_splitting_variants(tmp_path):
    _budget_sweep(tmp_path)
    assert _claims(tmp_path)[2].verdict == "not judged"  # three variants, one R each
    result = analyze([tmp_path], figures=False, follows_r=["rollout.prompts_per_step"])
    claims = {claim.number: claim for claim in result.claims}
    assert claims[2].verdict == "contradicted"  # rank = R across the one variant
    assert "rollout.prompts_per_step (follows R: R=2: 16, R=4: 8, R=8: 4)" in result.grouping.describe()
    assert result.grouping.variant_keys == []


def test_a_key_with_two_values_at_one_r_cannot_follow_r(tmp_path):
    _budget_sweep(tmp_path, seeds=(0, 1))
    path = next(p for p in tmp_path.glob("**/config.yaml") if "R4" in str(p) and "s1" in str(p))
    config = yaml.safe_load(path.read_text())
    config["rollout"]["prompts_per_step"] = 5
    path.write_text(yaml.safe_dump(config))
    with pytest.raises(GroupingError, match=r"--follows-r rollout.prompts_per_step: runs with R=4 "
                                            r"have several values \(5, 8\)"):
        analyze([tmp_path], figures=False, follows_r=["rollout.prompts_per_step"])
    with pytest.raises(GroupingError, match="no run's config has this key"):
        analyze([tmp_path], figures=False, follows_r=["rollout.no_such_key"])


def test_hamed_rao_inflates_the_variance_of_an_autocorrelated_series():
    from grpo_cli.analysis.trend import hamed_rao_factor

    rng = np.random.default_rng(0)
    steps = np.arange(60, dtype=float)
    blocks = np.repeat(rng.normal(size=12), 5) + 0.01 * rng.normal(size=60)  # runs of 5 alike
    assert hamed_rao_factor(steps, blocks) > 1.5
    assert hamed_rao_factor(steps[:9], blocks[:9]) == 1.0  # too few points to estimate rho_k


def test_settings_that_change_no_number_do_not_split_variants(tmp_path):
    """Runs that differ only in how the probes chunk their work (probes.gram_row_chunk) or in
    threads are one variant: grpo probe reruns of one R with a smaller chunk join their sweep."""
    import pandas as pd

    from grpo_cli.analysis.grouping import differing_keys
    from grpo_cli.analysis.load import Run

    def run(name, **config):
        empty = pd.DataFrame()
        return Run(tmp_path / name, "completed", None, {}, {"rollout.group_size": 4, **config},
                   empty, empty, empty, empty, None)

    runs = [run("a", **{"probes.gram_row_chunk": 0, "threads": 1}),
            run("b", **{"probes.gram_row_chunk": 16, "threads": 2})]
    assert differing_keys(runs) == []
    runs.append(run("c", **{"probes.gram_row_chunk": 0, "algorithm.name": "otb"}))
    assert differing_keys(runs) == ["algorithm.name"]


def test_claim3_on_short_no_trend_series_never_crashes(tmp_path):
    """The issue's crash: 17 probe points of iid noise per seed (the Hamed-Rao factor of such a
    series can go negative; `grpo analyze` then died with 'math domain error')."""
    def noise(r, seed, step):
        return float(np.random.default_rng([r, seed, step]).normal(0.3, 0.05))

    _sweep(tmp_path, seeds=(0, 1, 2), steps=85, sparsity=noise, hoyer=noise)
    claim = _direct(tmp_path, sparsity_claim)
    sparsity = claim.table[claim.table["reading"] == "sparsity"]
    assert (sparsity["points"] == 3 * 17).all()
    assert claim.verdict in ("inconclusive", "supported", "contradicted", "mixed")


def test_claim3_sparsity_explained_by_zero_advantage_groups_is_told_apart(tmp_path):
    """Sparsity that only follows the fraction of zero-advantage groups (a cubic rise of the
    success rate, so that fraction is not a line in the step): the claim reads growth, and the
    reading controlled for zero_variance_frac finds none left (issue 42's confounding)."""
    def reward(r, seed, step, steps):
        return 0.5 + 0.45 * (step / (steps - 1)) ** 3

    def zero_frac(r, seed, step, steps=40):  # results_factory: p^R + (1 - p)^R + 0.07
        p = min(max(reward(r, seed, step, steps), 0.0), 1.0)
        return p**r + (1 - p) ** r + 0.07

    def sparsity(r, seed, step):
        noise = np.random.default_rng([r, seed, step]).normal(0, 0.002)
        return 0.2 + 0.5 * zero_frac(r, seed, step) + noise

    _sweep(tmp_path, seeds=(0, 1, 2), steps=40, reward=reward, sparsity=sparsity,
           hoyer=sparsity)
    claim = _direct(tmp_path, sparsity_claim)
    sparsity_rows = claim.table[claim.table["reading"] == "sparsity"]
    assert claim.verdict == "supported"
    assert (sparsity_rows["p (growth given zero-adv., Holm)"] > Rules().one_sided_level).all()
    assert "growth stays significant in 0 of" in claim.evidence


def test_parts_text_adds_the_counts_read_together_where_they_differ():
    """A claim whose contradicted part does not survive Holm says so in its parts column."""
    from grpo_cli.analysis import bootstrap as bs
    from grpo_cli.analysis.claims import Claim
    from grpo_cli.analysis.parts import Part
    from grpo_cli.analysis.rank_verdict import read_together

    def below(p):  # one test whose p-value is p (estimate 0, se 1, 1000 df)
        return bs.Contradiction(((bs.Interval(0.0, -2.0, 2.0, 1001, se=1.0, df=1000),
                                  bs.t_quantile(1 - p, 1000), "below"),))
    parts = [Part("4", "a", "contradicted", "", contradiction=below(0.03)),
             Part("4", "b", "contradicted", "", contradiction=below(0.04)),
             Part("4", "c", "supported", "", contradiction=below(0.9))]
    read, _, counted = read_together(parts, ["a", "b", "c"], Rules(), "pairs")
    claim = Claim(4, "mixed", "", parts=counted)
    assert claim.parts_text == ("2 contradicted, 1 supported; read together: "
                                "2 inconclusive, 1 supported")
    assert read == ["inconclusive", "inconclusive", "supported"]
    kept = [Part("4", "a", "contradicted", "", contradiction=below(0.001))]
    counted = read_together(kept + parts[2:], ["a", "c"], Rules(), "pairs")[2]
    assert Claim(4, "mixed", "", parts=counted).parts_text == "1 contradicted, 1 supported"
