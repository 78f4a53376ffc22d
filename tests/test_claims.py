"""The four claim verdicts on constructed results directories whose answer is known."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
import yaml
from results_factory import write_run, write_sweep

from grpo_cli.analysis import analyze
from grpo_cli.analysis.claims import ClaimRules, combine, credit_claim, mann_kendall, sparsity_claim
from grpo_cli.analysis.grouping import GroupingError, group_runs
from grpo_cli.analysis.load import load_runs

MATRICES = ("rollout_group", "rollout_batch")


def _claims(root, **kwargs) -> dict[int, object]:
    """Every claim through `grpo analyze` (tables only)."""
    result = analyze([root], figures=False, **kwargs)
    return {claim.number: claim for claim in result.claims}


def _direct(root, judge):
    """One metrics-based claim straight from the loaded runs (no rank tables: fast)."""
    runs = load_runs([root])
    group_runs(runs)
    return judge(runs, ClaimRules())


def _sweep(root, estimators=("grpo",), **kwargs):
    kwargs.setdefault("matrices", ("rollout_group",))
    return write_sweep(root, estimators=estimators, **kwargs)


def test_combine_rule():
    assert combine(["holds", "holds"]) == "holds"
    assert combine(["fails", "undetermined"]) == "fails"
    assert combine(["holds", "fails"]) == "mixed"
    assert combine(["holds", "undetermined"]) == "mixed"
    assert combine(["undetermined"]) == "undetermined"
    assert combine([]) == "undetermined"


def test_mann_kendall_closed_form():
    # one increasing series of 3: S = 3 pairs, Var = 3*2*11/18, z = (3 - 1) / sqrt(Var)
    test = mann_kendall([np.array([1.0, 2.0, 3.0])])
    assert test["S"] == 3
    assert test["var"] == pytest.approx(11 / 3)
    assert test["z"] == pytest.approx(2 / math.sqrt(11 / 3))
    assert test["max_z"] == pytest.approx(test["z"])
    # pooling: a rising and a falling series cancel
    pooled = mann_kendall([np.array([1.0, 2.0, 3.0]), np.array([3.0, 2.0, 1.0])])
    assert pooled["S"] == 0 and pooled["z"] == 0
    assert np.isnan(mann_kendall([np.array([1.0])])["z"])


# ---- claim 1 -----------------------------------------------------------------------------------
def test_claim1_holds_with_per_token_estimator_shown_as_contrast(tmp_path):
    _sweep(tmp_path, estimators=("grpo",), credit_uniform=1.0)
    _sweep(tmp_path, estimators=("ppo",), credit_uniform=0.25)
    claim = _direct(tmp_path, credit_claim)
    assert claim.verdict == "holds"
    verdicts = dict(zip(claim.table["estimator"], claim.table["verdict"], strict=True))
    assert verdicts == {"grpo": "holds", "ppo": "contrast"}
    assert "0.250" in claim.evidence


def test_claim1_fails_on_one_non_uniform_step(tmp_path):
    _sweep(
        tmp_path, credit_uniform=lambda r, seed, step: 0.9 if (r, seed, step) == (4, 1, 7) else 1
    )
    claim = _direct(tmp_path, credit_claim)
    assert claim.verdict == "fails"
    assert claim.table["min uniform frac"].iloc[0] == pytest.approx(0.9)


def test_claim1_undetermined_and_not_measured(tmp_path):
    _sweep(tmp_path / "a", credit_uniform=np.nan)  # the column is empty
    assert _direct(tmp_path / "a", credit_claim).verdict == "undetermined"
    _sweep(tmp_path / "b", estimators=("process",), credit_uniform=0.5)
    assert _direct(tmp_path / "b", credit_claim).verdict == "not measured"


# ---- claim 2 -----------------------------------------------------------------------------------
def test_claim2_holds_fails_undetermined(tmp_path):
    _sweep(tmp_path / "flat", rank=2.1, seeds=(0,))
    claim = _claims(tmp_path / "flat")[2]
    assert claim.verdict == "holds"
    assert list(claim.table["matrix"]) == ["rollout_group"]
    _sweep(tmp_path / "grows", rank=lambda r, seed, step: float(r), seeds=(0,))
    assert _claims(tmp_path / "grows")[2].verdict == "fails"
    _sweep(tmp_path / "one_r", group_sizes=(4,), rank=2.0, seeds=(0,))
    assert _claims(tmp_path / "one_r")[2].verdict == "undetermined"
    _sweep(tmp_path / "ppo_only", estimators=("ppo",), rank=2.0, seeds=(0,))
    assert _claims(tmp_path / "ppo_only")[2].verdict == "not measured"


# ---- claim 3 -----------------------------------------------------------------------------------
def test_claim3_holds_when_sparsity_and_hoyer_rise(tmp_path):
    _sweep(tmp_path)  # factory defaults rise with the step
    claim = _direct(tmp_path, sparsity_claim)
    assert claim.verdict == "holds"
    assert set(claim.table["measure"]) == {"grad_sparsity", "grad_hoyer"}
    assert list(claim.table["seeds"].unique()) == [2]
    assert (claim.table["points"] == 8).all()  # probe steps 0, 5, 10, 15 x 2 seeds


def test_claim3_fails_when_flat_or_falling_and_mixed_when_r_disagree(tmp_path):
    _sweep(tmp_path / "flat", sparsity=lambda r, seed, step: 0.3, hoyer=lambda r, s, t: 0.5 - t)
    claim = _direct(tmp_path / "flat", sparsity_claim)
    assert claim.verdict == "fails"
    _sweep(
        tmp_path / "mixed",
        sparsity=lambda r, seed, step: step if r < 8 else -step,
    )
    claim = _direct(tmp_path / "mixed", sparsity_claim)
    assert claim.verdict == "mixed"
    falling = claim.table[(claim.table["measure"] == "grad_sparsity") & (claim.table["R"] == 8)]
    assert falling["verdict"].item() == "fails" and falling["z"].item() < 0


def test_claim3_undetermined_with_too_few_probe_steps(tmp_path):
    # one seed, probe steps 0 and 5: even a perfect rise has z = 0
    _sweep(tmp_path, seeds=(0,), steps=10)
    claim = _direct(tmp_path, sparsity_claim)
    assert claim.verdict == "undetermined"
    assert (claim.table["verdict"] == "undetermined").all()


# ---- claim 4 -----------------------------------------------------------------------------------
def _settle(root, ppo_rank: float, ppo_reward=None):
    """grpo at rank 2 and ppo at `ppo_rank`, one seed each (rollout_batch only)."""
    common = {"matrices": ("rollout_batch",), "seeds": (0,)}
    _sweep(root, estimators=("grpo",), rank=2.0, **common)
    extra = {"reward": ppo_reward} if ppo_reward else {}
    _sweep(root, estimators=("ppo",), rank=ppo_rank, **common, **extra)


def test_claim4_holds_when_per_token_rank_is_well_above(tmp_path):
    _settle(tmp_path, ppo_rank=4.0)
    claim = _claims(tmp_path)[4]
    assert claim.verdict == "holds"
    table = claim.table
    assert list(table["R"]) == [2, 4, 8]
    assert np.allclose(table["difference"], 2.0)
    assert (table["common reward bins"] > 0).all()


def test_claim4_fails_when_per_token_rank_stays_near_2(tmp_path):
    _settle(tmp_path, ppo_rank=2.2)
    assert _claims(tmp_path)[4].verdict == "fails"


def test_claim4_undetermined_without_matched_reward(tmp_path):
    _settle(tmp_path, ppo_rank=4.0, ppo_reward=lambda r, seed, step, steps: 0.95)
    claim = _claims(tmp_path)[4]
    assert claim.verdict == "undetermined"
    assert (claim.table["common reward bins"] == 0).all()


def test_claim4_not_measured_without_both_kinds(tmp_path):
    _sweep(tmp_path, rank=2.0, seeds=(0,))
    claim = _claims(tmp_path)[4]
    assert claim.verdict == "not measured"
    assert "make settle" in claim.evidence


# ---- outputs -----------------------------------------------------------------------------------
def test_summary_opens_with_the_four_claims(tmp_path):
    _settle(tmp_path, ppo_rank=4.0)
    result = analyze([tmp_path], figures=False)
    markdown = result.files["summary_md"].read_text()
    lines = [line for line in markdown.splitlines() if line.startswith("#")]
    assert lines[1] == "## The paper's four claims"
    assert [line.split(":")[0] for line in lines[2:6]] == [f"### Claim {n}" for n in (1, 2, 3, 4)]
    assert markdown.count("> Rule: ") == 4
    html = result.files["report"].read_text()
    assert html.index("The paper&#x27;s four claims") < html.index("<h2>Runs</h2>")
    csv = pd.read_csv(result.files["summary_csv"])
    claims = csv[csv["kind"] == "claim"]
    assert list(claims["claim"]) == [1, 2, 3, 4]
    assert list(claims["verdict"]) == [c.verdict for c in result.claims]


def test_incomplete_claim_rows_do_not_break_analysis(tmp_path):
    write_run(tmp_path, group_size=2, seed=0, status="running", steps_done=3, matrices=MATRICES)
    result = analyze([tmp_path], figures=False)
    assert [c.verdict for c in result.claims][3] == "not measured"


# ---- keys that follow R ----------------------------------------------------------------------------
def _budget_sweep(root, seeds=(0,)):
    """R = 2, 4, 8 at a fixed 32 rollouts per step: prompts_per_step = 32 / R."""
    _sweep(root, rank=lambda r, seed, step: float(r), seeds=seeds)
    for path in root.glob("**/config.yaml"):
        config = yaml.safe_load(path.read_text())
        config["rollout"]["prompts_per_step"] = 32 // config["rollout"]["group_size"]
        path.write_text(yaml.safe_dump(config))


def test_a_key_that_follows_r_joins_the_r_axis_instead_of_splitting_variants(tmp_path):
    _budget_sweep(tmp_path)
    assert _claims(tmp_path)[2].verdict == "undetermined"  # three variants, one R each
    result = analyze([tmp_path], figures=False, follows_r=["rollout.prompts_per_step"])
    claims = {claim.number: claim for claim in result.claims}
    assert claims[2].verdict == "fails"  # rank = R across the one variant
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
