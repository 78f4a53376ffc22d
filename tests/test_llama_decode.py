"""The functional Llama decode step against the model's own forward (grpo_cli/rollout/llama_decode.py)."""

from __future__ import annotations

import pytest
import torch
from conftest import tiny_llama, tiny_nemotron
from transformers import (
    GPT2Config,
    GPT2LMHeadModel,
    Qwen2Config,
    Qwen2ForCausalLM,
)

from grpo_cli.models.char_tokenizer import build_char_tokenizer
from grpo_cli.rollout.base import SamplingSettings
from grpo_cli.rollout.llama_decode import supports_llama_step
from grpo_cli.rollout.static_decode import StaticDecodeBackend

CPU = torch.device("cpu")
PROMPTS = ["Tom has 3 books.\n", "7+5=?\n", "How many apples are left over today?\n"]


@pytest.fixture(scope="module")
def tokenizer():
    return build_char_tokenizer()


def llama(tokenizer, **extra):
    return tiny_llama(tokenizer=tokenizer, **extra)


QWEN_FIELDS = (  # the shape of the tiny Llama, for a Qwen2 of the same size
    "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
    "num_key_value_heads", "max_position_embeddings", "pad_token_id", "bos_token_id",
    "eos_token_id", "tie_word_embeddings",
)


def qwen2(tokenizer):
    shape = llama(tokenizer).config
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(Qwen2Config(**{name: getattr(shape, name) for name in QWEN_FIELDS}))
    with torch.no_grad():  # Qwen2 has q/k/v biases; make them matter
        for layer in model.model.layers:
            for proj in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj):
                proj.bias.normal_(0, 0.5)
    return model


def sample(model, tokenizer, functional: bool, temperature: float = 1.0):
    settings = SamplingSettings(group_size=4, max_new_tokens=20, temperature=temperature)
    backend = StaticDecodeBackend(model, tokenizer, CPU, functional_step=functional)
    prompts = [tokenizer(text, add_special_tokens=False)["input_ids"] for text in PROMPTS]
    return backend.generate(prompts, settings, generator_seed=5)


@pytest.mark.parametrize(
    "build",
    [
        lambda tok: llama(tok),
        lambda tok: llama(tok, attention_bias=True, mlp_bias=True, num_key_value_heads=4),
        lambda tok: llama(tok, rope_scaling={"rope_type": "linear", "factor": 2.0}),
        qwen2,
        lambda tok: tiny_nemotron(tokenizer=tok),
        lambda tok: tiny_nemotron(tokenizer=tok, partial_rotary_factor=1.0),
    ],
    ids=["llama-gqa", "llama-biases", "llama-linear-rope", "qwen2", "nemotron", "nemotron-full-rope"],
)
@pytest.mark.parametrize("temperature", [1.0, 0.0])
def test_functional_step_samples_what_the_model_forward_samples(tokenizer, build, temperature):
    model = build(tokenizer)
    assert supports_llama_step(model)
    reference = sample(model, tokenizer, functional=False, temperature=temperature)
    candidate = sample(model, tokenizer, functional=True, temperature=temperature)
    assert torch.equal(candidate.input_ids, reference.input_ids)
    assert torch.equal(candidate.completion_mask, reference.completion_mask)
    torch.testing.assert_close(candidate.sampler_logprobs, reference.sampler_logprobs, atol=1e-5, rtol=0)
    assert candidate.completion_mask.sum() > 20  # real completions were compared


def test_functional_step_under_bf16_autocast_keeps_fp32_logprobs(tokenizer):
    from grpo_cli.train.autocast import keep_lm_head_fp32, policy_autocast

    model = llama(tokenizer)
    keep_lm_head_fp32(model)
    with policy_autocast(CPU, "bf16"):
        reference = sample(model, tokenizer, functional=False, temperature=0.0)
        candidate = sample(model, tokenizer, functional=True, temperature=0.0)
    assert candidate.sampler_logprobs.dtype == torch.float32
    first = slice(reference.prompt_length, reference.prompt_length + 3)  # before greedy paths can part
    assert torch.equal(candidate.input_ids[:, first], reference.input_ids[:, first])
    gap = (candidate.sampler_logprobs[:, first] - reference.sampler_logprobs[:, first]).abs().max()
    assert gap < 0.05


def test_unsupported_models_take_the_model_forward(tokenizer):
    torch.manual_seed(0)
    gpt2 = GPT2LMHeadModel(GPT2Config(vocab_size=len(tokenizer), n_embd=32, n_layer=1, n_head=2))
    assert not supports_llama_step(gpt2)
    windowed = qwen2(tokenizer)
    windowed.config.use_sliding_window, windowed.config.sliding_window = True, 8
    assert not supports_llama_step(windowed)
    peft = pytest.importorskip("peft")
    lora = peft.get_peft_model(llama(tokenizer), peft.LoraConfig(r=2, target_modules=["q_proj"]))
    assert not supports_llama_step(lora.base_model.model)  # LoRA layers are not plain nn.Linear


@pytest.mark.parametrize("build", [lambda tok: llama(tok), qwen2, lambda tok: tiny_nemotron(tokenizer=tok)],
                         ids=["llama-gqa", "qwen2", "nemotron"])
@pytest.mark.parametrize("temperature", [1.0, 0.0])
def test_functional_step_in_bf16_samples_what_the_model_forward_samples(tokenizer, build, temperature):
    """bf16 weights (model.dtype=bfloat16, CUDA's default): same tokens, log-probs within bf16
    rounding. Measured on CPU: at most 0.0020 nats apart over 180-240 tokens; bound 0.01."""
    model = build(tokenizer).to(torch.bfloat16)
    reference = sample(model, tokenizer, functional=False, temperature=temperature)
    candidate = sample(model, tokenizer, functional=True, temperature=temperature)
    assert torch.equal(candidate.input_ids, reference.input_ids)
    assert candidate.sampler_logprobs.dtype == torch.float32
    torch.testing.assert_close(candidate.sampler_logprobs, reference.sampler_logprobs, atol=0.01, rtol=0)
    assert candidate.completion_mask.sum() > 20


def test_decode_attention_runs_in_float32_under_autocast():
    """two_part_attention and one_query_attention attend in float32 under bf16 autocast too (it
    would run their matmuls in bf16): the output is the one computed with autocast off."""
    from grpo_cli.rollout.decode_attention import one_query_attention, two_part_attention

    generator = torch.Generator().manual_seed(0)

    def rand(*shape):
        return torch.randn(*shape, generator=generator).to(torch.bfloat16)

    query, prompt_keys, prompt_values = rand(4, 6, 1, 16), rand(2, 2, 5, 16), rand(2, 2, 5, 16)
    keys, values = rand(4, 2, 3, 16), rand(4, 2, 3, 16)
    mask = torch.ones(4, 1, 1, 8, dtype=torch.bool)
    mask[0, ..., 1] = False
    outputs = []
    for enabled in (False, True):
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=enabled):
            outputs.append((two_part_attention(query, prompt_keys, prompt_values, keys, values, mask, 0.25),
                            one_query_attention(query, keys, values, mask[..., :3], 0.25)))
    (two_plain, one_plain), (two_autocast, one_autocast) = outputs
    assert two_plain.dtype == torch.bfloat16 and torch.equal(two_autocast, two_plain)
    assert torch.equal(one_autocast, one_plain)
