"""A new estimator is one registered function (and, for users, one YAML file): registered here,
in a test module, it is selectable by config and recorded in run.json's estimator_facts, which
is what `grpo analyze` reads to judge it."""

from __future__ import annotations

import json

import pandas as pd
import pytest
import torch
from cli_helpers import grpo_run, run_dir

from grpo_cli.algorithm.advantages import ESTIMATORS, register_adv_est
from grpo_cli.analysis.claims import credit_claim
from grpo_cli.analysis.load import load_runs
from grpo_cli.analysis.rules import SUPPORTED, Rules

NAME = "half_centred"  # A_i = (r_i - mean_g r) / 2: outcome credit, a zero-sum group


@pytest.fixture
def half_centred():
    """Register the estimator for one test; `calls` counts the batches it scored."""
    calls = []

    @register_adv_est(NAME, credit="outcome", zero_sum_group=True)
    def estimator(token_level_rewards, response_mask, group_size, config, *, outcome_rewards, **_):
        groups = outcome_rewards.double().reshape(-1, group_size)  # [B, R]
        per_rollout = (groups - groups.mean(dim=1, keepdim=True)).reshape(-1) / 2  # [N]
        calls.append(per_rollout.numel())
        return (per_rollout[:, None] * response_mask).float(), None  # [N, L]

    try:
        yield calls
    finally:
        del ESTIMATORS[NAME]


@pytest.fixture
def new_estimator_run(half_centred, tmp_path, cache_dir):
    """A completed smoke run of the registered estimator, selected by `algorithm.name`."""
    result = grpo_run(tmp_path, cache_dir, f"algorithm.name={NAME}", "train.steps=2")
    assert result.exit_code == 0, result.output
    (out,) = run_dir(tmp_path).parent.glob(f"R4-{NAME}-s0*")  # the name adds train.steps=2
    return out, half_centred


def test_a_registered_estimator_is_selectable_and_recorded_in_run_json(new_estimator_run):
    out, calls = new_estimator_run
    assert calls == [16, 16]  # it scored both steps' 4 x 4 rollouts
    record = json.loads((out / "run.json").read_text())
    assert record["status"] == "completed" and record["estimator"] == NAME
    assert record["estimator_facts"] == {"name": NAME, "credit": "outcome", "zero_sum_group": True}
    metrics = pd.read_csv(out / "metrics.csv")
    assert metrics["credit_uniform_frac"].tolist() == [1.0, 1.0]  # outcome credit, as recorded
    assert torch.isfinite(torch.tensor(metrics["loss"].to_numpy())).all()


def test_the_analysis_judges_a_registered_estimator_from_run_json(new_estimator_run):
    """Claim 1 judges the new estimator as outcome credit: the facts come from run.json, since no
    table in the analysis knows its name."""
    out, _ = new_estimator_run
    (run,) = load_runs([out])
    assert run.estimator_facts == {"name": NAME, "credit": "outcome", "zero_sum_group": True}
    claim = credit_claim([run], Rules())
    (row,) = claim.table.to_dict("records")
    assert row["estimator"] == NAME and row["credit"] == "outcome"
    assert row["verdict"] == SUPPORTED  # outcome credit, uniform at both steps


def test_a_directory_without_estimator_facts_falls_back_to_the_frozen_table(new_estimator_run):
    """Results written before run.json recorded estimator_facts: known names use the frozen table
    (grpo_cli/algorithm/kinds.py), unknown names read as unknown credit (never guessed)."""
    out, _ = new_estimator_run
    record = json.loads((out / "run.json").read_text())
    del record["estimator_facts"]
    (out / "run.json").write_text(json.dumps(record))
    (run,) = load_runs([out])
    assert run.estimator_facts["credit"] == "unknown"
    run.config["algorithm.name"] = "dr_grpo"
    assert run.estimator_facts == {"name": "dr_grpo", "credit": "outcome", "zero_sum_group": True}


def test_the_frozen_table_says_what_the_registry_says_for_the_older_estimators():
    """The fallback for old directories must not contradict the owner (the registration)."""
    from grpo_cli.algorithm.advantages import get_estimator
    from grpo_cli.algorithm.kinds import LEGACY_ESTIMATOR_FACTS

    for name, facts in LEGACY_ESTIMATOR_FACTS.items():
        assert get_estimator(name).facts() == dict(facts), name
