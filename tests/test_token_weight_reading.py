"""Claim 1's empirical reading in `grpo analyze` (grpo_cli/analysis/token_weights.py)."""

from __future__ import annotations

import pandas as pd
import pytest
from results_factory import write_run

from grpo_cli.analysis.load import load_runs
from grpo_cli.analysis.pipeline import analyze
from grpo_cli.analysis.token_weights import NOT_RECORDED, NOT_UNIFORM, UNIFORM, token_weight_table


@pytest.fixture
def sweep(tmp_path):
    root = tmp_path / "sweep"
    fractions = {"grpo": [1.0] * 20, "dr_grpo": [1.0] * 15 + [0.75] * 5, "ppo": [0.2] * 20}
    for estimator, values in fractions.items():
        run = write_run(root, group_size=4, seed=0, estimator=estimator, matrices=("rollout_group",))
        metrics = pd.read_csv(run / "metrics.csv")
        metrics["token_weight_uniform_frac"] = values
        metrics["token_weight_spread"] = [0.0 if v == 1.0 else 0.02 for v in values]
        metrics.to_csv(run / "metrics.csv", index=False)
    write_run(root, group_size=4, seed=0, estimator="rloo", matrices=("rollout_group",))  # old results
    return root


def test_reading_per_variant(sweep):
    runs = load_runs([sweep])
    for run in runs:
        run.variant = run.config["algorithm.name"]
    table = token_weight_table(runs).set_index("variant")
    assert table.loc["grpo", "reading"] == UNIFORM
    assert table.loc["dr_grpo", "reading"] == NOT_UNIFORM
    assert table.loc["dr_grpo", "steps not uniform"] == pytest.approx(0.25)
    assert table.loc["dr_grpo", "min uniform frac"] == pytest.approx(0.75)
    assert table.loc["dr_grpo", "mean spread"] == pytest.approx(0.005)  # 5 of 20 steps at 0.02
    assert table.loc["ppo", "credit"] == "per_token"
    assert table.loc["rloo", "reading"] == NOT_RECORDED


def test_report_labels_the_advantages_check_and_shows_the_reading(sweep):
    result = analyze([sweep], measure="erank_entropy", figures=False)
    claims = result.files["details_md"].read_text().split("## Runs")[0]
    assert "true by construction for outcome estimators" in claims
    assert "dr_grpo (outcome): the loss gradient's token weights varied within some rollout at 25%" in claims


def test_claim_1_gets_the_empirical_part(sweep):
    result = analyze([sweep], measure="erank_entropy", figures=False)
    claim = result.claims[0]
    parts = [(p.name, p.verdict) for p in claim.parts]
    # 1a: every outcome estimator's advantages are uniform (by construction); 1b per outcome
    # variant that recorded the weights: grpo uniform, dr_grpo not (ppo is per-token: contrast)
    assert parts == [("1a", "supported"), ("1b", "contradicted"), ("1b", "supported")]
    assert claim.verdict == "mixed"
    summary = result.files["details_md"].read_text()
    assert "dr_grpo (outcome): the loss gradient's token weights varied" in summary.split("## Runs")[0]
