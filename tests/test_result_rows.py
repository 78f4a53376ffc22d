"""grpo_cli/results/rows.py: the one builder of run.json, metrics.csv and timings.csv rows."""

from __future__ import annotations

import math

import pytest

from grpo_cli.results.rows import PHASES, metrics_row, run_record, timing_row
from grpo_cli.results.writer import METRIC_COLUMNS, TIMING_COLUMNS

FACTS = {"name": "grpo", "credit": "outcome", "zero_sum_group": True}
COMMON = dict(seed=0, group_size=4, estimator_facts=FACTS, model="m", task="arith", experiment="e",
              param_regex=".*", weights="pretrained", reward="task")


def test_metrics_row_has_every_column_and_leaves_the_probe_columns_nan():
    values = {column: 1.0 for column in METRIC_COLUMNS if column not in ("grad_sparsity", "grad_hoyer")}
    row = metrics_row(values)
    assert list(row) == list(METRIC_COLUMNS)
    assert math.isnan(row["grad_sparsity"]) and math.isnan(row["grad_hoyer"]) and row["loss"] == 1.0
    with pytest.raises(KeyError, match=r"unknown columns \['lr'\]"):
        metrics_row({**values, "lr": 0.1})
    with pytest.raises(KeyError, match=r"missing columns \['kl'\]"):
        metrics_row({k: v for k, v in values.items() if k != "kl"})


def test_timing_row_sums_its_phases_and_leaves_unmeasured_ones_nan():
    row = timing_row(2, {"rollout": 0.5, "other": 0.25}, peak_mb=8.0, measured=("rollout", "forward", "other"))
    assert list(row) == list(TIMING_COLUMNS)
    assert row["time_step"] == 0.75 and row["time_forward"] == 0.0  # measured, did not run
    assert math.isnan(row["time_backward"]) and math.isnan(row["peak_train_mb"])  # not measured
    assert set(PHASES) >= {"rollout", "backward", "probes", "other"}
    with pytest.raises(KeyError, match="phases without a timings.csv column"):
        timing_row(0, {"warmup": 1.0}, peak_mb=0.0)


def test_run_record_allows_only_the_documented_extra_keys():
    ours = run_record(trainer="grpo-cli", **COMMON)
    theirs = run_record(trainer="trl", extra={"loss_type": "grpo"}, versions_extra={"trl": "0.x"}, **COMMON)
    assert set(theirs) - set(ours) == {"loss_type"} and set(ours) <= set(theirs)
    assert ours["estimator"] == "grpo" and ours["estimator_facts"] == FACTS and ours["status"] == "running"
    assert ours["rehearsal"] is False and run_record(trainer="grpo-cli", **{**COMMON, "reward": "random"})["rehearsal"]
    with pytest.raises(KeyError, match="extra keys"):
        run_record(trainer="grpo-cli", extra={"loss_type": "grpo"}, **COMMON)
    with pytest.raises(ValueError, match="unknown trainer 'verl'"):
        run_record(trainer="verl", **COMMON)
    with pytest.raises(KeyError, match="estimator_facts"):
        run_record(trainer="grpo-cli", **{**COMMON, "estimator_facts": {"name": "grpo"}})
