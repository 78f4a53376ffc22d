"""GRPO on GSM8K prompts end to end: the paper preset on CPU with a tiny Nemotron-shaped model.

The paper preset (conf/experiment/paper_gsm8k.yaml) runs as shipped except for what a CPU and a
random model need: HF rollouts instead of vLLM, float32, two short steps. The model has the
architecture and layer names of Nemotron-Mini-4B (32 layers, squared-ReLU MLP, LayerNorm1P), so
the preset's probe regexes select the same matrices they would at full size.
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
import torch
from markers import needs_smollm2
from transformers import NemotronConfig, NemotronForCausalLM
from typer.testing import CliRunner

from grpo_cli.cli import app
from grpo_cli.measures import RANK_MEASURES
from grpo_cli.models.char_tokenizer import build_char_tokenizer

GSM8K = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "gsm8k"
needs_gsm8k = pytest.mark.skipif(
    not (GSM8K / "train.jsonl").exists(), reason=f"GSM8K not found at {GSM8K}"
)

CONTRACT = ["config.yaml", "run.json", "metrics.csv", "eval.csv", "ranks.csv", "spectra.parquet"]


@pytest.fixture(scope="module")
def tiny_nemotron(tmp_path_factory):
    """Nemotron-Mini-4B's layout at width 16: 32 blocks, 2 query / 1 KV heads, char vocabulary."""
    directory = tmp_path_factory.mktemp("tiny_nemotron")
    torch.manual_seed(0)
    tokenizer = build_char_tokenizer()
    config = NemotronConfig(
        vocab_size=len(tokenizer), hidden_size=16, intermediate_size=32, num_hidden_layers=32,
        num_attention_heads=2, num_key_value_heads=1, head_dim=8, partial_rotary_factor=0.5,
        max_position_embeddings=2048, tie_word_embeddings=False,
        pad_token_id=tokenizer.pad_token_id, bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    NemotronForCausalLM(config).save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory


def grpo(args: list[str]):
    return CliRunner().invoke(app, ["run", *args], catch_exceptions=True)


@needs_gsm8k
def test_paper_preset_on_gsm8k_writes_the_results_contract(tmp_path, tiny_nemotron):
    # A random model never solves GSM8K; task.reward=random gives the rewards variance, so every
    # matrix is non-zero (held-out accuracy still uses the GSM8K checker)
    out = tmp_path / "run"  # named here: the override list would exceed 255 characters
    result = grpo([
        "experiment=paper_gsm8k", f"results_dir={tmp_path}", f"hydra.run.dir={out}", f"cache_dir={tmp_path / 'cache'}",
        "progress=false", "threads=1", "device=cpu", "rollout=hf", "model.dtype=float32",
        f"model.path={tiny_nemotron}", f"task.path={GSM8K}", "task.train_size=16",
        "task.eval_size=4", "rollout.group_size=2", "rollout.prompts_per_step=2",
        "rollout.max_new_tokens=16", "train.steps=2", "optim.lr=1e-3",
        "probes.every=1", "eval.every=2", "checkpoint_every=2",
        "model.stop_tokens=[]",  # the character tokenizer has no <extra_id_1>
        "task.reward=random",
    ])
    assert result.exit_code == 0, result.output
    for name in CONTRACT:
        assert (out / name).exists(), name
    assert json.loads((out / "run.json").read_text())["status"] == "completed"
    config = (out / "config.yaml").read_text()
    assert "name: gsm8k" in config and str(GSM8K) in config and "gradient_checkpointing: true" in config

    metrics = pd.read_csv(out / "metrics.csv")
    assert metrics["step"].tolist() == [0, 1]
    assert metrics["grad_norm"].gt(0).all()
    assert metrics["logprob_diff_max"].lt(1e-4).all()  # HF sampler log-probs are the policy's
    evals = pd.read_csv(out / "eval.csv")
    assert evals["step"].tolist() == [0, 2] and evals["n"].eq(4).all()

    ranks = pd.read_csv(out / "ranks.csv")
    assert {"rollout_group", "rollout_batch", "score_group", "group_batch"} <= set(ranks["matrix"])
    layers = set(ranks.loc[ranks["matrix"] == "layer", "layer"])
    assert layers == {
        f"model.layers.{block}.{name}.weight"
        for block in (0, 15, 31)
        for name in ("self_attn.q_proj", "self_attn.v_proj", "mlp.down_proj")
    }
    batch = ranks[ranks["matrix"] == "rollout_batch"]
    assert not batch[list(RANK_MEASURES)].isna().any().any() and batch["n_rows"].eq(4).all()
    spectra = pd.read_parquet(out / "spectra.parquet")
    assert list(spectra.columns) == ["step", "matrix", "layer", "group", "k", "sigma"]
    assert spectra["sigma"].gt(0).any()


@pytest.mark.slow
@needs_gsm8k
@needs_smollm2
def test_smollm2_grpo_on_gsm8k(tmp_path):
    result = grpo([
        "experiment=cpu_smollm2", "task=gsm8k", f"task.path={GSM8K}", "task.train_size=8",
        "task.eval_size=2", f"results_dir={tmp_path}", f"cache_dir={tmp_path / 'cache'}",
        "progress=false", "rollout.group_size=2", "rollout.prompts_per_step=2",
        "rollout.max_new_tokens=32", "train.steps=1", "probes.every=1",
    ])
    assert result.exit_code == 0, result.output
    out = next((tmp_path / "cpu_smollm2").iterdir())
    for name in CONTRACT:
        assert (out / name).exists(), name
    assert json.loads((out / "run.json").read_text())["status"] == "completed"
    metrics = pd.read_csv(out / "metrics.csv")
    assert metrics["completion_len_mean"].gt(0).all() and metrics["logprob_diff_max"].lt(1e-3).all()
    assert set(pd.read_csv(out / "ranks.csv")["matrix"]) >= {"rollout_batch", "layer", "update"}
