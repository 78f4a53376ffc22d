"""grpo_cli/probes/step_metrics.py: the one builder of metrics.csv's values, for grpo-cli's loop
and the TRL callback alike; closed-form readings of a hand-made batch, then both trainers' rows."""

from __future__ import annotations

import math

import pandas as pd
import pytest
import torch
from host_reads import HostReads
from step_parity import TINY, parity_reward, setup_for

from grpo_cli.algorithm.scored import ScoredBatch
from grpo_cli.probes.step_metrics import LossTotals, read_batch, step_metrics
from grpo_cli.results.rows import PROBE_METRICS, metrics_row
from grpo_cli.results.writer import METRIC_COLUMNS
from grpo_cli.rollout.batch import assemble_batch

# four rollouts in two groups of 2, completions of 3, 2, 3 and 1 tokens
COMPLETIONS = torch.tensor([[5, 6, 7], [5, 7, 8], [9, 9, 9], [9, 9, 9]])
MASK = torch.tensor([[1.0, 1, 1], [1, 1, 0], [1, 1, 1], [1, 0, 0]])
# group 0 informative (row 0's credit not uniform over its tokens), group 1 not
ADVANTAGES = torch.tensor([[0.5, 0.5, 0.25], [-0.5, -0.5, 0], [0, 0, 0], [0, 0, 0]])
LOSSES = LossTotals(loss=0.5, pg_loss=0.5, kl=math.nan, value_loss=math.nan, entropy=1.5, clip_frac=0.0)


def hand_batch():
    batch = assemble_batch(torch.ones(4, 1, dtype=torch.long), torch.ones(4, 1, dtype=torch.long),
                           COMPLETIONS, MASK, torch.zeros(4, 3), group_size=2)
    return batch, torch.cat([torch.zeros(4, 1), ADVANTAGES], dim=1)  # advantages [N, L]


def test_readings_of_a_hand_made_batch_are_their_closed_forms():
    batch, advantages = hand_batch()
    rewards = torch.tensor([1.0, 0.0, 1.0, 1.0])
    counts = torch.tensor([1.0, 2.0, 0.5], dtype=torch.float64)  # 1 of 2 informative uniform, spread sum 0.5
    with HostReads() as reads:
        readings = read_batch(batch, ScoredBatch(rewards=rewards, correct=rewards), advantages, counts,
                              logprob_gap=torch.tensor([0.1, 0.3]))
    assert reads.total == 1, reads.sites()
    assert readings.reward_mean == 0.75 and readings.accuracy == 0.75
    assert readings.reward_std == pytest.approx(math.sqrt(0.1875))
    assert readings.zero_variance_frac == 0.5  # group 1 is [1, 1]
    assert (readings.groups_all_wrong, readings.groups_all_right, readings.groups_mixed) == (0.0, 0.5, 0.5)
    assert readings.completion_len_mean == 2.25 and readings.completion_len_max == 3 and readings.tokens == 9
    assert readings.credit_uniform_frac == 0.75  # row 0: 0.5, 0.5, 0.25
    assert readings.distinct_completions == 2.0  # the informative group's two completions differ
    assert (readings.token_weight_uniform_frac, readings.token_weight_spread) == (0.5, 0.25)
    assert readings.logprob_diff_mean == pytest.approx(0.2) and readings.logprob_diff_max == pytest.approx(0.3)
    assert readings.correct == (1.0, 0.0, 1.0, 1.0)

    row = metrics_row(step_metrics(3, readings, LOSSES, grad_norm=2.0, groups_dropped=1,
                                   expected_zero_variance_frac=0.5))
    assert list(row) == list(METRIC_COLUMNS)
    assert row["expected_zero_variance_frac_batch"] == 0.75**2 + 0.25**2  # p^R + (1 - p)^R
    assert (row["step"], row["grad_norm"], row["groups_dropped"], row["loss"]) == (3, 2.0, 1, 0.5)
    assert math.isnan(row["kl"]) and math.isnan(row["value_loss"])
    assert all(math.isnan(row[column]) for column in PROBE_METRICS)


def test_a_missing_reward_counts_in_no_mean_and_as_zero_in_spreads():
    """TRL: a rollout no reward function scored has reward NaN (and is not correct)."""
    batch, advantages = hand_batch()
    rewards = torch.tensor([math.nan, 1.0, 0.0, 0.0])
    readings = read_batch(batch, ScoredBatch(rewards=rewards, correct=(rewards > 0.5).float()), advantages,
                          torch.zeros(3, dtype=torch.float64))
    assert readings.reward_mean == pytest.approx(1 / 3)  # over the three rewards given
    assert readings.reward_std == pytest.approx(math.sqrt(0.1875))  # of [0, 1, 0, 0]
    assert readings.zero_variance_frac == 0.5 and readings.accuracy == 0.25
    assert math.isnan(readings.logprob_diff_mean) and math.isnan(readings.token_weight_spread)  # not measured


def nan_columns(row) -> set[str]:
    return {column for column, value in row.items() if column not in PROBE_METRICS and pd.isna(value)}


def test_both_trainers_rows_leave_nan_only_what_they_do_not_measure(tmp_path):
    """grpo-cli's loop (no KL term, no value head here) and the TRL callback, one step each on
    the same tiny model: the same columns, in order, and NaN only where a trainer measures nothing."""
    trl = pytest.importorskip("trl")
    setup = setup_for(tmp_path / "cache")
    ours = setup.trainer.step(0).metrics
    assert list(ours) == list(METRIC_COLUMNS)
    assert nan_columns(ours) == {"kl", "value_loss"}

    from grpo_cli.config.compose import compose_config
    from grpo_cli.integrations.trl_setup import (
        grpo_config_kwargs,
        load_trl_policy,
        task_dataset,
        task_reward,
    )
    from grpo_cli.integrations.trl_spectra import SpectraCallback
    from grpo_cli.models.policy import load_policy
    from grpo_cli.tasks import build_task

    cfg = compose_config(TINY + [f"cache_dir={tmp_path / 'cache'}"])
    task = build_task(cfg.task)
    source = load_policy(cfg, task, torch.device("cpu"), log=lambda message: None).source_path
    task.reward = parity_reward
    model, tokenizer = load_trl_policy(source, "cpu", dtype=torch.float64)
    kwargs = grpo_config_kwargs(cfg, steps=1, output_dir=str(tmp_path / "trl"), device_type="cpu")
    trainer = trl.GRPOTrainer(model=model, reward_funcs=task_reward(task), args=trl.GRPOConfig(**kwargs),
                              train_dataset=task_dataset(task), processing_class=tokenizer)
    SpectraCallback(tmp_path / "run", every=1, matrices=["rollout_batch"]).attach(trainer)
    trainer.train()
    (theirs,) = pd.read_csv(tmp_path / "run" / "metrics.csv").to_dict("records")
    assert list(theirs) == list(METRIC_COLUMNS)
    # no sampler log-probs, KL, value head or problem ids inside TRL
    assert nan_columns(theirs) == {"kl", "value_loss", "logprob_diff_mean", "logprob_diff_max",
                                   "expected_zero_variance_frac"}
