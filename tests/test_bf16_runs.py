"""`grpo run` with bf16 weights on CPU (`model.dtype=bfloat16`): every estimator, both HF
backends, probes on. bf16 is what `model.dtype=auto` gives on CUDA, so these are the CPU side of
the GPU tier (tests/test_gpu.py). Each run is two steps, both probed."""

from __future__ import annotations

import json
import math

import pandas as pd
import pytest
import torch
from cli_helpers import grpo_run
from test_static_decode import peaked_llama

from grpo_cli.config.schema import ProbesConfig

SHORT = ["model.dtype=bfloat16", "train.steps=2", "task.eval_size=4", "rollout.max_new_tokens=16"]

# Estimators do not touch the decode loop and backends do not touch the estimators, so each
# estimator runs once and the backends alternate (every estimator and both backends covered).
RUNS = [
    ("grpo", "hf_static", []),
    ("dr_grpo", "hf", []),
    ("rloo", "hf_static", []),
    ("reinforce", "hf", ["algorithm.kl_coef=0.1"]),  # with a bf16 reference model
    ("ppo", "hf_static", []),
    ("process", "hf", []),
]


@pytest.mark.parametrize(("estimator", "backend", "extra"), RUNS,
                         ids=[f"{e}-{b}{'-' + x[0] if x else ''}" for e, b, x in RUNS])
def test_bf16_run_completes_with_probes(tmp_path, cache_dir, estimator, backend, extra):
    overrides = [*SHORT, f"algorithm={estimator}", f"rollout.backend={backend}", *extra]
    result = grpo_run(tmp_path, cache_dir, *overrides)
    assert result.exit_code == 0, result.output
    out = next((tmp_path / "smoke").iterdir())
    assert json.loads((out / "run.json").read_text())["status"] == "completed"
    metrics = pd.read_csv(out / "metrics.csv")
    assert metrics["step"].tolist() == [0, 1]
    assert all(math.isfinite(value) for value in metrics[["loss", "grad_norm", "entropy"]].stack())
    ranks = pd.read_csv(out / "ranks.csv")
    assert set(ranks["matrix"]) == set(ProbesConfig().matrices)
    state = torch.load(out / "checkpoints" / "latest.pt", weights_only=False, map_location="cpu")
    assert {t.dtype for t in state["model"].values()} == {torch.bfloat16}


def test_bf16_weights_under_autocast_decode_train_and_probe():
    """model.dtype=bfloat16 with model.autocast=bf16: the fp32-head wrapper keeps the head's
    dtype (it used to feed float32 into a bf16 head), and the probes' hooks see one dtype."""
    from grpo_cli.models.char_tokenizer import build_char_tokenizer
    from grpo_cli.probes.gram import per_rollout_grams
    from grpo_cli.rollout.base import SamplingSettings
    from grpo_cli.rollout.static_decode import StaticDecodeBackend
    from grpo_cli.train.autocast import keep_lm_head_fp32, policy_autocast
    from grpo_cli.train.policy_forward import forward_policy

    tokenizer = build_char_tokenizer()
    model = peaked_llama(tokenizer).to(torch.bfloat16)
    keep_lm_head_fp32(model)
    cpu = torch.device("cpu")
    prompts = [tokenizer(text, add_special_tokens=False)["input_ids"] for text in ("1+2=", "3+4=")]
    with policy_autocast(cpu, "bf16"):
        batch = StaticDecodeBackend(model, tokenizer, cpu).generate(
            prompts, SamplingSettings(group_size=2, max_new_tokens=6), generator_seed=0
        )
        logprobs, _, _ = forward_policy(model, batch, shared_prompt_forward=True)
    assert logprobs.dtype == torch.float32 and torch.isfinite(logprobs).all()
    (-(logprobs * batch.completion_mask).sum()).backward()
    assert model.lm_head.weight.grad.dtype == torch.bfloat16
    coeffs = {"score": batch.completion_mask}
    grams = per_rollout_grams(model, batch.input_ids, batch.attention_mask, coeffs, "lm_head")
    assert grams["score"].gram.shape == (4, 4) and grams["score"].gram.diagonal().min() > 0


def test_cpu_bf16_training_forward_attends_in_float32():
    """model.autocast=bf16 on a CPU: the scoring/training forwards (`policy_forward_autocast`)
    route SDPA through float32 copies of q/k/v (with SDPA's masks: without them the log-probs
    were off by up to 3 nats); the log-probs stay within bf16 rounding of fp32's, differ from
    bf16 attention's, and the model's attention setting is restored afterwards, also on error."""
    from grpo_cli.models.char_tokenizer import build_char_tokenizer
    from grpo_cli.rollout.base import SamplingSettings
    from grpo_cli.rollout.static_decode import StaticDecodeBackend
    from grpo_cli.train.autocast import (
        FLOAT32_ATTENTION,
        keep_lm_head_fp32,
        policy_autocast,
        policy_forward_autocast,
    )
    from grpo_cli.train.policy_forward import forward_policy

    tokenizer = build_char_tokenizer()
    model = peaked_llama(tokenizer, eos_boost=1.0)
    keep_lm_head_fp32(model)
    cpu = torch.device("cpu")
    prompts = [tokenizer(text, add_special_tokens=False)["input_ids"] for text in ("1+2=", "30+45=?")]
    batch = StaticDecodeBackend(model, tokenizer, cpu).generate(
        prompts, SamplingSettings(group_size=3, max_new_tokens=16), generator_seed=0
    )
    in_completion = batch.completion_mask > 0
    with torch.no_grad():
        reference = forward_policy(model, batch, shared_prompt_forward=True)[0]
        with policy_autocast(cpu, "bf16"):
            bf16_attention = forward_policy(model, batch, shared_prompt_forward=True)[0]
        with policy_forward_autocast(model, cpu, "bf16"):
            assert model.config._attn_implementation == FLOAT32_ATTENTION
            float32_attention = forward_policy(model, batch, shared_prompt_forward=True)[0]
    assert model.config._attn_implementation == "sdpa"
    assert (float32_attention - reference)[in_completion].abs().max() <= 0.05
    assert (float32_attention - bf16_attention)[in_completion].abs().max() > 0
    with pytest.raises(RuntimeError), policy_forward_autocast(model, cpu, "bf16"):
        raise RuntimeError("a failed forward")
    assert model.config._attn_implementation == "sdpa"
    with policy_forward_autocast(model, cpu, "none"):  # fp32: SDPA as it is
        assert model.config._attn_implementation == "sdpa"
