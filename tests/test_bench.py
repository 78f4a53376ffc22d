"""`grpo bench` and the step speed-ups: fp32 loss and gradients unchanged, bench rows sane."""

from __future__ import annotations

import pandas as pd
import pytest
import torch
from step_parity import TINY, assert_same_update, setup_for, step_loss_and_grads

import grpo_cli.train.trainer as trainer_module
from grpo_cli.bench.speedups import apply_sorted_micro_batches, sorted_micro_batches, used_columns
from grpo_cli.bench.step_bench import flag_overrides, parse_bench_args, run_bench


@pytest.fixture
def restore_forward(monkeypatch):
    """The bench patches trainer.forward_policy for the process; undo it after each test."""
    monkeypatch.setattr(trainer_module, "forward_policy", trainer_module.forward_policy)


def test_sorted_trimmed_micro_batches_keep_loss_and_gradients(tmp_path, restore_forward):
    reference = step_loss_and_grads(setup_for(tmp_path, "algorithm.micro_batch_size=5"))
    candidate_setup = setup_for(tmp_path, "algorithm.micro_batch_size=5")
    apply_sorted_micro_batches(candidate_setup.trainer, 5)
    assert_same_update(reference, step_loss_and_grads(candidate_setup))


def test_sorted_micro_batches_and_used_columns():
    mask = torch.tensor([[0, 1, 0], [1, 1, 1], [0, 1, 1], [0, 0, 1]])
    assert [rows.tolist() for rows in sorted_micro_batches(mask, 2)] == [[1, 2], [0, 3]]
    assert used_columns(mask[[0, 3]]) == (1, 3)
    assert used_columns(torch.zeros(2, 4, dtype=torch.long)) == (0, 4)


def test_parse_bench_args_splits_flags_from_overrides():
    options = parse_bench_args(
        ["--model-size", "25m", "rollout.max_new_tokens=64", "--autocast=bf16", "--shared-prefix",
         "--sorted-micro-batches", "8"]
    )
    assert options.model_size == "25m" and options.autocast == "bf16"
    assert options.shared_prefix and options.sorted_micro_batches == 8
    assert options.overrides == ["rollout.max_new_tokens=64"]
    assert flag_overrides(options) == [
        "algorithm.shared_prompt_forward=true", "model.autocast=bf16", "rollout.compile_decode=false"
    ]
    assert "algorithm.shared_prompt_forward=false" in flag_overrides(parse_bench_args([]))
    with pytest.raises(ValueError, match="unknown bench option"):
        parse_bench_args(["--fast"])


def test_run_bench_times_phases_and_writes_rows(tmp_path, restore_forward):
    out = tmp_path / "bench.csv"
    args = TINY + [f"cache_dir={tmp_path}", "rollout.backend=hf_static", "--shared-prefix",
                   "--out", str(out)]
    rows = run_bench(args, steps=2)
    assert [row["step"] for row in rows] == [1, 2]
    for row in rows:
        assert row["tokens"] > 0 and row["step_s"] > 0 and row["tokens_per_s"] > 0
        assert row["rollout"] > 0 and row["forward"] > 0 and row["backward"] > 0
        parts = row["rollout"] + row["reward"] + row["train"]
        assert parts <= row["step_s"] * 1.05
    frame = pd.read_csv(out)
    assert len(frame) == 2 and {"label", "load_start", "cpu_s"} <= set(frame.columns)


@pytest.mark.slow
def test_run_bench_against_trl(tmp_path, restore_forward):
    pytest.importorskip("trl")
    rows = run_bench(TINY + [f"cache_dir={tmp_path}"], steps=1, vs_trl=True)
    sides = sorted(row["side"] for row in rows)
    assert sides == ["grpo-cli", "trl"]
    assert all(row["ratio"] > 0 and row["tokens"] > 0 for row in rows)
