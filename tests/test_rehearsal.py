"""The paper rehearsal on CPU: Nemotron-Mini's config keys at tiny sizes, random weights, a byte
tokenizer sized to the vocabulary, coin-flip rewards, probes on; plus each piece on its own."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pandas as pd
import pytest
import torch
from typer.testing import CliRunner

from grpo_cli.analysis import analyze
from grpo_cli.cli import app
from grpo_cli.config.compose import compose_config
from grpo_cli.models.byte_tokenizer import build_byte_tokenizer
from grpo_cli.models.loading import ModelLoadError
from grpo_cli.models.policy import load_policy
from grpo_cli.results.rehearsal import PLAN_GIB, rehearsal_table
from grpo_cli.runtime.memory import PHASES, PhaseMemory
from grpo_cli.runtime.timing import PhaseTimer
from grpo_cli.tasks.rehearsal import random_group_rewards, random_rewards
from grpo_cli.train.policy_forward import checkpointing

ROOT = Path(__file__).resolve().parents[1]
GSM8K = ROOT.parent / "shared" / "data" / "gsm8k"
NEMOTRON = ROOT / "conf" / "model" / "nemotron_4b.config.json"
# Nemotron-Mini-4B's config with tiny sizes; 32 blocks, so the preset's probe regexes (lm_head,
# blocks 30 and 31; layer spectra of blocks 0, 15, 31) select what they select at full size.
TINY = {"hidden_size": 16, "head_dim": 8, "kv_channels": 8, "intermediate_size": 32,
        "num_attention_heads": 2, "num_key_value_heads": 1, "vocab_size": 300}


@pytest.fixture(scope="module")
def tiny_config(tmp_path_factory) -> Path:
    config = json.loads(NEMOTRON.read_text())
    assert set(TINY) <= set(config)  # same keys, smaller values
    config.update(TINY)
    path = tmp_path_factory.mktemp("tiny_nemotron") / "config.json"
    path.write_text(json.dumps(config))
    return path


def test_shipped_config_is_nemotron_mini_4b():
    """4,190,509,056 parameters: docs/gpu_memory_plan.md section 1, counted on the meta device."""
    from transformers import AutoConfig, AutoModelForCausalLM

    config = json.loads(NEMOTRON.read_text())
    built = AutoConfig.for_model(config.pop("model_type"), **config)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(built)
    assert sum(p.numel() for p in model.parameters()) == 4_190_509_056
    assert type(model).__name__ == "NemotronForCausalLM" and built.hidden_act == "relu2"
    assert built.tie_word_embeddings is False and built.rope_parameters["partial_rotary_factor"] == 0.5


# ---- byte tokenizer ------------------------------------------------------------------------------
def test_byte_tokenizer_covers_the_vocabulary_and_round_trips():
    tokenizer = build_byte_tokenizer(300, ["<extra_id_1>"])
    assert len(tokenizer) == 300  # every id a random policy can sample decodes
    text = "Janet’s ducks lay 16 eggs — ¿cuántos? 🦆\n#### 18"
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    assert len(ids) == len(text.encode("utf-8")) and max(ids) < 300
    assert tokenizer.decode(ids) == text
    stop = tokenizer.convert_tokens_to_ids("<extra_id_1>")
    assert tokenizer("a<extra_id_1>", add_special_tokens=False)["input_ids"][-1] == stop
    assert {tokenizer.pad_token_id, tokenizer.eos_token_id, stop} < set(range(300))
    assert isinstance(tokenizer.decode(list(range(300))), str)


def test_byte_tokenizer_needs_room_for_the_bytes():
    with pytest.raises(ValueError, match="vocab_size=200 is too small"):
        build_byte_tokenizer(200)


# ---- coin-flip rewards ---------------------------------------------------------------------------
def test_random_rewards_are_seeded_and_every_group_is_mixed():
    completions = [f"completion {i % 3}" for i in range(64)]  # repeats within groups
    problems = list(range(8))
    rewards = random_rewards(0, problems, completions, group_size=8)
    assert rewards == random_rewards(0, problems, completions, group_size=8)  # reproducible
    assert rewards != random_rewards(1, problems, completions, group_size=8)  # seed matters
    assert set(rewards) == {0.0, 1.0}
    for group in range(8):
        assert len(set(rewards[group * 8 : (group + 1) * 8])) == 2  # non-zero variance
    assert random_group_rewards(0, 3, ["same", "same"]) in ([0.0, 1.0], [1.0, 0.0])
    with pytest.raises(ValueError, match="7 completions for 2 groups of 4"):
        random_rewards(0, [0, 1], ["x"] * 7, group_size=4)


# ---- random weights ------------------------------------------------------------------------------
def _cfg(tmp_path, *overrides):
    return compose_config(["model=nemotron_4b", "model.weights=random", f"cache_dir={tmp_path}",
                           "model.dtype=float32", *overrides])


def test_random_weights_build_the_configured_architecture(tmp_path, tiny_config):
    cfg = _cfg(tmp_path, f"model.config_json={tiny_config}")
    torch.manual_seed(0)
    loaded = load_policy(cfg, task=None, device=torch.device("cpu"), log=lambda m: None)
    model, tokenizer = loaded.model, loaded.tokenizer
    assert type(model).__name__ == "NemotronForCausalLM"
    assert model.config.num_hidden_layers == 32 and model.config.vocab_size == 300
    assert len(tokenizer) == 300 and "<extra_id_1>" in tokenizer.get_vocab()
    assert model.config.eos_token_id == tokenizer.eos_token_id  # generation stops on its EOS
    assert (Path(loaded.source_path) / "config.json").exists()  # what vLLM serves (dummy weights)
    assert checkpointing(model)  # the preset's gradient_checkpointing applies as to real weights
    torch.manual_seed(0)
    again = load_policy(cfg, task=None, device=torch.device("cpu"), log=lambda m: None).model
    assert torch.equal(again.lm_head.weight, model.lm_head.weight)  # the run's seed decides


def test_the_shipped_architecture_decodes_in_the_functional_graph_ready_step(tmp_path, tiny_config):
    """Nemotron-Mini's config (partial RoPE, relu^2, LayerNorm1P) at tiny sizes: the hf_static
    loop's functional step samples what the model's own forward samples, and CUDA graphs could
    decode it (the rehearsal's rollout without transformers' module stack)."""
    from grpo_cli.rollout.base import SamplingSettings
    from grpo_cli.rollout.llama_decode import supports_llama_step
    from grpo_cli.rollout.static_decode import StaticDecodeBackend, graph_ready_model_problem

    cfg = _cfg(tmp_path, f"model.config_json={tiny_config}")
    torch.manual_seed(0)
    loaded = load_policy(cfg, task=None, device=torch.device("cpu"), log=lambda m: None)
    model, tokenizer = loaded.model, loaded.tokenizer
    assert model.config.rope_parameters["partial_rotary_factor"] == 0.5
    assert supports_llama_step(model) and graph_ready_model_problem(model) is None
    prompts = [tokenizer("Question: 3 + 4 = ?", add_special_tokens=False)["input_ids"],
               tokenizer("Tom has 12 apples.", add_special_tokens=False)["input_ids"]]
    settings = SamplingSettings(group_size=3, max_new_tokens=12, temperature=1.0)
    batches = [StaticDecodeBackend(model, tokenizer, torch.device("cpu"), functional_step=functional)
               .generate(prompts, settings, generator_seed=1) for functional in (False, True)]
    assert torch.equal(batches[0].input_ids, batches[1].input_ids)
    assert batches[0].completion_mask.sum() > 20
    torch.testing.assert_close(batches[1].sampler_logprobs, batches[0].sampler_logprobs, atol=1e-5, rtol=0)


def test_random_weights_need_a_config(tmp_path):
    cfg = _cfg(tmp_path, f"model.config_json={tmp_path / 'missing.json'}")
    with pytest.raises(ModelLoadError, match="model.config_json=.*no config.json"):
        load_policy(cfg, task=None, device=torch.device("cpu"), log=lambda m: None)
    with pytest.raises(ModelLoadError, match="model.weights='zeros'"):
        load_policy(_cfg(tmp_path, "model.weights=zeros"), task=None,
                    device=torch.device("cpu"), log=lambda m: None)


# ---- phase memory and the report -----------------------------------------------------------------
def test_phase_memory_on_cpu_is_not_measurable_per_phase():
    memory = PhaseMemory(torch.device("cpu"))
    timer = PhaseTimer(torch.device("cpu"), memory=memory)
    with timer.phase("rollout"):
        block = torch.ones(2**20)
    peaks = memory.phase_peaks()
    assert set(peaks) == {f"peak_{name}_mb" for name in PHASES}
    assert all(math.isnan(value) for value in peaks.values())
    assert memory.step_peak_mb() > 0
    del block


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_phase_memory_nested_peaks_on_cuda():
    device = torch.device("cuda")
    memory = PhaseMemory(device)
    timer = PhaseTimer(device, memory=memory)
    live = torch.cuda.memory_allocated(device) / 2**20  # tensors other tests left alive (xdist)
    with timer.phase("update"):
        with timer.phase("backward"):
            big = torch.empty(512 * 2**20, dtype=torch.uint8, device=device)
            del big
        with timer.phase("optimizer"):  # a reset inside must not hide update's peak
            small = torch.empty(2**20, dtype=torch.uint8, device=device)
            del small
    peaks = memory.phase_peaks()
    assert peaks["peak_train_mb"] >= 512 and peaks["peak_optimizer_mb"] < live + 64
    assert memory.peaks["update"] >= 512  # nested: the outer phase saw the inner peak
    assert memory.step_peak_mb() >= 512 and math.isnan(peaks["peak_rollout_mb"])


def test_rehearsal_table_puts_measured_peaks_next_to_the_plan():
    timings = pd.DataFrame({
        "step": [0, 1], "peak_memory_mb": [60 * 1024, 70 * 1024],
        **{f"peak_{name}_mb": [10 * 1024, 20 * 1024] for name in PHASES},
    })
    table = rehearsal_table(timings).set_index("phase")
    assert table.loc["probes", "measured_gib_max"] == 20 and table.loc["probes", "measured_gib_step0"] == 10
    assert table.loc["probes", "plan_gib"] == PLAN_GIB["probes"][0]
    assert table.loc["whole step (peak_memory_mb)", "measured_gib_max"] == 70


# ---- the whole route -----------------------------------------------------------------------------
@pytest.mark.skipif(not (GSM8K / "train.jsonl").exists(), reason=f"GSM8K not found at {GSM8K}")
def test_paper_rehearsal_runs_end_to_end_on_cpu(tmp_path, tiny_config):
    out = tmp_path / "run"
    result = CliRunner().invoke(app, [
        "run", "experiment=paper_rehearsal", f"model.config_json={tiny_config}",
        f"results_dir={tmp_path}", f"hydra.run.dir={out}", f"cache_dir={tmp_path / 'cache'}", "progress=false", "threads=1",
        "device=cpu", "rollout=hf", "model.dtype=float32", f"task.path={GSM8K}",
        "task.train_size=16", "task.eval_size=2", "rollout.group_size=2",
        "rollout.prompts_per_step=2", "rollout.max_new_tokens=6", "train.steps=2",
        "probes.sketch_dim=256",
        "train.logits_chunk_mb=0.01",  # ~4 positions per chunk: the chunked log-prob path
    ], catch_exceptions=True)
    assert result.exit_code == 0, result.output
    info = json.loads((out / "run.json").read_text())
    assert info["status"] == "completed" and info["rehearsal"] is True
    assert info["weights"] == "random" and info["reward"] == "random"

    metrics = pd.read_csv(out / "metrics.csv")
    assert metrics["step"].tolist() == [0, 1]
    assert metrics["zero_variance_frac"].eq(0).all()  # every group has reward variance ...
    assert metrics["grad_norm"].gt(0).all()  # ... so the update is real
    assert metrics["logprob_diff_max"].lt(1e-4).all()  # sampler and chunked trainer agree
    ranks = pd.read_csv(out / "ranks.csv")
    assert {"rollout_group", "rollout_batch", "score_group", "group_batch", "layer",
            "update"} <= set(ranks["matrix"])
    assert "model.layers.31.mlp.down_proj.weight" in set(ranks["layer"].dropna())
    timings = pd.read_csv(out / "timings.csv")
    assert {f"peak_{name}_mb" for name in PHASES} <= set(timings.columns)

    report = (out / "rehearsal.md").read_text()
    assert "REHEARSAL, NOT SCIENCE" in report and "| probes | n/a |" in report
    assert len(pd.read_csv(out / "rehearsal.csv")) == len(PLAN_GIB) + 1

    analysis = analyze([out], figures=False)
    assert analysis.title.startswith("REHEARSAL (not science)")
    assert analysis.notes[0].startswith("REHEARSAL, NOT SCIENCE")


def test_plan_table_in_the_doc_is_the_modules():
    """grpo_cli/results/rehearsal.py owns the plan's per-phase figures; docs/gpu_memory_plan.md
    section 8 shows them, and each of its totals is the sum of its terms."""
    import re

    from grpo_cli.results.rehearsal import PLAN_STEP_S

    doc = (ROOT / "docs" / "gpu_memory_plan.md").read_text()
    section = doc[doc.index("## 8. Rehearsal"):doc.index("## 9.")]
    phase_of = {"rollout": "rollout", "training": "train", "probes": "probes", "optimizer": "optimizer"}
    shown = {}
    for line in section.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        first = cells[0].split(" ")[0] if cells else ""
        if len(cells) == 4 and first in phase_of:
            plan, terms = float(cells[1]), re.sub(r"\([^)]*\)", "", cells[2])
            shown[phase_of[first]] = plan
            summed = sum(float(n) for n in re.findall(r"(?<![\w.])~?(\d+(?:\.\d+)?)", terms))
            assert math.isclose(summed, plan, abs_tol=0.05), (first, terms)
        elif cells and cells[0].startswith("step time"):
            seconds = re.compile(r"\d+ to \d+ s")
            assert seconds.search(cells[1])[0] == seconds.search(PLAN_STEP_S)[0], cells[1]
    assert shown == {phase: plan for phase, (plan, _) in PLAN_GIB.items()}
