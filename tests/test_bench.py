"""`grpo bench` and the step speed-ups: fp32 loss and gradients unchanged, bench rows sane."""

from __future__ import annotations

import pandas as pd
import pytest
import torch

import grpo_cli.train.trainer as trainer_module
from grpo_cli.bench.builder import build_setup
from grpo_cli.bench.shared_prefix import (
    apply_shared_prefix,
    distinct_prompts,
    shared_prefix_forward,
)
from grpo_cli.bench.speedups import apply_sorted_micro_batches, sorted_micro_batches, used_columns
from grpo_cli.bench.step_bench import parse_bench_args, run_bench, schema_has
from grpo_cli.config.compose import compose_config

TINY = [
    "experiment=smoke", "analysis.every=0", "progress=false", "model.name=bench_tiny",
    "model.hidden_size=32", "model.num_layers=2", "model.num_heads=4",
    "model.intermediate_size=64", "model.warm_start.steps=0", "rollout.prompts_per_step=3",
    "rollout.group_size=4", "rollout.max_new_tokens=10", "task.train_size=50",
]


def parity_reward(text: str, problem) -> float:
    """Any reward that varies within groups, so advantages (and gradients) are not all zero."""
    return float(sum(map(ord, text)) % 3 == 0)


# Plain reference forward, also once the trainer shares prompts natively (proposed setting).
PLAIN = ["algorithm.shared_prompt_forward=false"] if schema_has("algorithm", "shared_prompt_forward") else []


def setup_for(cache_dir, *overrides):
    cfg = compose_config(TINY + PLAIN + [f"cache_dir={cache_dir}"] + list(overrides))
    setup = build_setup(cfg, log=lambda message: None)
    setup.task.reward = parity_reward
    return setup


def step_loss_and_grads(setup, step: int = 0):
    grads: dict[str, torch.Tensor] = {}

    def capture() -> dict:
        for name, p in setup.model.named_parameters():
            grads[name] = p.grad.detach().clone()
        return {}

    output = setup.trainer.step(step, capture_layers=capture)
    return output.metrics["loss"], grads, output


def assert_same_update(reference, candidate, rtol=1e-5):
    loss_a, grads_a, out_a = reference
    loss_b, grads_b, out_b = candidate
    assert torch.equal(out_a.batch.input_ids, out_b.batch.input_ids)  # identical inputs
    assert out_a.advantages.abs().sum() > 0  # a real gradient, not an all-zero one
    assert abs(loss_a - loss_b) <= rtol * max(abs(loss_a), 1e-12)
    for name, grad in grads_a.items():
        scale = grad.norm().clamp(min=1e-12)
        assert (grads_b[name] - grad).norm() <= rtol * scale, name
    assert sum(grad.norm() for grad in grads_a.values()) > 0


@pytest.fixture
def restore_forward(monkeypatch):
    """The bench patches trainer.forward_policy for the process; undo it after each test."""
    monkeypatch.setattr(trainer_module, "forward_policy", trainer_module.forward_policy)


@pytest.mark.parametrize("loss_agg", ["token_mean", "seq_mean_token_mean"])
@pytest.mark.parametrize("micro_batch_size", [64, 3])
def test_shared_prefix_step_keeps_loss_and_gradients(
    tmp_path, restore_forward, loss_agg, micro_batch_size
):
    overrides = [f"algorithm.loss_agg={loss_agg}", f"algorithm.micro_batch_size={micro_batch_size}"]
    reference = step_loss_and_grads(setup_for(tmp_path, *overrides))
    apply_shared_prefix()
    assert getattr(trainer_module.forward_policy, "shared_prefix", False)
    assert_same_update(reference, step_loss_and_grads(setup_for(tmp_path, *overrides)))


def test_sorted_trimmed_micro_batches_keep_loss_and_gradients(tmp_path, restore_forward):
    reference = step_loss_and_grads(setup_for(tmp_path, "algorithm.micro_batch_size=5"))
    candidate_setup = setup_for(tmp_path, "algorithm.micro_batch_size=5")
    apply_sorted_micro_batches(candidate_setup.trainer, 5)
    assert_same_update(reference, step_loss_and_grads(candidate_setup))


def test_static_backend_with_shared_prefix_keeps_the_update(tmp_path, restore_forward):
    """The bench's fast configuration: hf_static rollouts, shared-prefix training forward."""
    reference = step_loss_and_grads(setup_for(tmp_path, "rollout.backend=hf_static"))
    apply_shared_prefix()
    assert_same_update(reference, step_loss_and_grads(setup_for(tmp_path, "rollout.backend=hf_static")))


def test_shared_prefix_forward_matches_on_completion_columns(tmp_path):
    setup = setup_for(tmp_path)
    batch = setup.trainer.rollout(0, draw=0)
    first, inverse = distinct_prompts(batch)
    assert first.numel() == batch.num_groups
    by_group = inverse.reshape(batch.num_groups, batch.group_size)  # [B, R]
    assert (by_group == by_group[:, :1]).all()  # a group's rows share their prompt
    assert torch.equal(inverse[first], torch.arange(first.numel()))
    assert torch.equal(inverse, torch.arange(batch.num_groups).repeat_interleave(batch.group_size))
    plain = trainer_module.forward_policy(setup.model, batch)
    shared = shared_prefix_forward(setup.model, batch)
    assert shared is not None
    columns = slice(batch.prompt_length, None)
    torch.testing.assert_close(shared[0][:, columns], plain[0][:, columns], atol=1e-5, rtol=0)
    torch.testing.assert_close(shared[1][:, columns], plain[1][:, columns], atol=1e-5, rtol=0)
    single = trainer_module.select_rows(batch, torch.arange(0, batch.num_rollouts, batch.group_size))
    assert shared_prefix_forward(setup.model, single) is None  # nothing shared: plain forward


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


def test_bf16_autocast_gradient_stays_close_to_fp32(tmp_path):
    """Not a parity claim: bf16 matmuls (fp32 lm_head) change the gradient by rounding only."""
    from grpo_cli.bench.speedups import keep_lm_head_fp32

    setup = setup_for(tmp_path)
    batch = setup.trainer.rollout(0, draw=0)
    weights = torch.randn(batch.input_ids.shape, generator=torch.Generator().manual_seed(0))

    def gradient(autocast: bool) -> torch.Tensor:
        setup.model.zero_grad()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            logprobs, _, _ = trainer_module.forward_policy(setup.model, batch)
        assert logprobs.dtype == torch.float32
        (weights * batch.completion_mask * logprobs).sum().backward()
        return torch.cat([p.grad.flatten() for p in setup.model.parameters()])

    reference = gradient(False)
    keep_lm_head_fp32(setup.model)
    candidate = gradient(True)
    assert not torch.equal(reference, candidate)  # bf16 really ran
    assert torch.nn.functional.cosine_similarity(reference, candidate, dim=0) > 0.99
