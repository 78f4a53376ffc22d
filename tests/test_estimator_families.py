"""Estimator families come from what each run recorded (run.json estimator_facts), never from a
list of names (issue 43): a per-token estimator registered after the analysis was written is
judged in claim 4, shown in claim 1's contrast, and named in the rule texts, and the texts name
no estimator the results do not hold."""

from __future__ import annotations

import json
import re

import pytest
from results_factory import write_run

from grpo_cli.analysis.load import load_runs
from grpo_cli.analysis.pipeline import analyze
from grpo_cli.analysis.rules import Families, estimator_family

NEW = {"name": "stepwise", "credit": "per_token", "zero_sum_group": False}


@pytest.fixture
def sweep(tmp_path):
    root = tmp_path / "sweep"
    for estimator, offset in (("rloo", 0.0), ("stepwise", 1.5)):
        for group_size in (4, 8):
            for seed in (0, 1, 2):
                run = write_run(root, group_size=group_size, seed=seed, estimator=estimator,
                                composition_offset=offset + 0.01 * seed, steps=10,
                                matrices=("rollout_group", "rollout_batch"))
                if estimator == NEW["name"]:
                    record = json.loads((run / "run.json").read_text())
                    (run / "run.json").write_text(json.dumps(record | {"estimator_facts": NEW}))
    return root


def test_families_are_read_from_the_recorded_facts(sweep):
    runs = load_runs([sweep])
    families = Families.of(runs)
    assert families.zero_sum == ("rloo",) and families.per_token == ("stepwise",)
    assert families.outcome == ("rloo",)
    assert estimator_family(NEW) == "per_token"
    assert estimator_family({"name": "reinforce", "credit": "outcome", "zero_sum_group": False}) is None
    assert estimator_family({"name": "x", "credit": "unknown", "zero_sum_group": False}) is None


def test_rule_texts_name_the_estimators_the_results_hold(sweep, tmp_path):
    result = analyze([sweep], out=tmp_path / "out", measure="erank_entropy", figures=False)
    credit, rank, _, falsifier = result.claims
    assert "stepwise" in credit.rule and "stepwise" in falsifier.rule
    assert "rloo" in rank.rule and "rloo" in falsifier.rule
    for claim in result.claims:  # estimators these results do not hold are not named
        for absent in ("ppo", "process", "otb", "dr_grpo"):
            assert not re.search(rf"\b{absent}\b", claim.rule), (claim.number, absent)
    assert falsifier.verdict not in ("not measured", "not judged")
    assert set(falsifier.table["per-token"]) == {"estimator=stepwise"}
