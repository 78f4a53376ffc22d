import os
import warnings

import deprecation_guard
import pytest

# Two cores: keep each test process to one torch thread so parallel runs (pytest -n) do not thrash.
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("MPLBACKEND", "Agg")


@pytest.fixture(autouse=True, scope="session")
def _one_torch_thread():
    try:
        import torch
    except ImportError:  # analysis-only environments
        yield
        return
    torch.set_num_threads(1)
    yield


@pytest.fixture(autouse=True)
def _own_calls_use_current_apis():
    """A deprecated torch/transformers (or other) API called by grpo_cli fails the test."""
    previous = deprecation_guard.install()
    yield
    warnings.showwarning = previous


@pytest.fixture(scope="session")
def cache_dir(tmp_path_factory):
    """One warm-started smoke model for the whole session (shared by every CLI test)."""
    return tmp_path_factory.mktemp("cache")


def tiny_llama(*, seed: int | None = 0, tokenizer=None, **overrides):
    """The tiny random Llama every test builds: 2 layers, hidden 32, 4 heads (2 KV heads).

    `tokenizer` (default: the char tokenizer of grpo_cli/models/char_tokenizer.py) sets the
    vocabulary and special ids; `overrides` replace any LlamaConfig field. The weights are drawn
    after torch.manual_seed(seed) (no seeding if seed is None).
    """
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from grpo_cli.models.char_tokenizer import build_char_tokenizer

    tokenizer = tokenizer if tokenizer is not None else build_char_tokenizer()
    fields = dict(
        vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
        pad_token_id=tokenizer.pad_token_id, bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id, tie_word_embeddings=False,
    )
    if seed is not None:
        torch.manual_seed(seed)
    return LlamaForCausalLM(LlamaConfig(**(fields | overrides)))


def tiny_nemotron(*, seed: int = 0, tokenizer=None, partial_rotary_factor: float = 0.5, **overrides):
    """A tiny random Nemotron (the paper's architecture: LayerNorm1P norms, a relu^2 MLP without a
    gate, RoPE on the first `partial_rotary_factor` of each head): 2 layers, hidden 32, 4 heads
    of dim 8 (2 KV heads). Its norm weights and biases are drawn too (default: LayerNorm1P's
    zeros, a plain layer norm), so a step that mishandled them would show."""
    import torch
    from transformers import NemotronConfig, NemotronForCausalLM

    from grpo_cli.models.char_tokenizer import build_char_tokenizer

    tokenizer = tokenizer if tokenizer is not None else build_char_tokenizer()
    fields = dict(
        vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=8, max_position_embeddings=128,
        partial_rotary_factor=partial_rotary_factor, pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
        tie_word_embeddings=False,
    )
    torch.manual_seed(seed)
    model = NemotronForCausalLM(NemotronConfig(**(fields | overrides)))
    with torch.no_grad():
        for module in model.modules():
            if type(module).__name__.endswith("LayerNorm1P"):
                module.weight.normal_(0, 0.3)
                module.bias.normal_(0, 0.3)
    return model


def outcome_advantages(name: str, rewards, group_size: int, **options):
    """Per-rollout advantages [N] of the registered estimator `name` (one token per rollout),
    with the algorithm options of AlgorithmConfig overridden by `options`."""
    import torch

    from grpo_cli.algorithm.advantages import get_estimator, outcome_on_last_token
    from grpo_cli.config.schema import AlgorithmConfig

    mask = torch.ones(len(rewards), 1)  # [N, 1]
    advantages, _ = get_estimator(name).compute(
        outcome_on_last_token(rewards, mask), mask, group_size, AlgorithmConfig(**options),
        outcome_rewards=rewards,
    )
    return advantages[:, 0]
