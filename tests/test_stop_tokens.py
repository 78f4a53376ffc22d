"""Stop tokens besides EOS (model.stop_tokens): every backend ends a completion at the first one."""

from __future__ import annotations

import pytest
import torch
from conftest import tiny_llama

from grpo_cli.models.char_tokenizer import build_char_tokenizer
from grpo_cli.rollout.base import SamplingSettings
from grpo_cli.rollout.hf_backend import HFGenerateBackend, completion_mask_through_eos
from grpo_cli.rollout.static_decode import StaticDecodeBackend
from grpo_cli.rollout.stop_tokens import is_stop, stop_token_ids

CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def tokenizer():
    return build_char_tokenizer()


def test_stop_ids_start_with_eos_and_add_named_tokens(tokenizer):
    eos, question = tokenizer.eos_token_id, tokenizer.convert_tokens_to_ids("?")
    assert stop_token_ids(tokenizer) == [eos]
    assert stop_token_ids(tokenizer, None, ["?", "?"]) == [eos, question]
    with pytest.raises(ValueError, match="model.stop_tokens: '<extra_id_1>'"):
        stop_token_ids(tokenizer, None, ["<extra_id_1>"])


def test_generation_config_eos_ids_also_stop(tokenizer):
    model = tiny_llama(tokenizer=tokenizer, hidden_size=16, intermediate_size=32,
                       num_hidden_layers=1, num_attention_heads=2)
    model.generation_config.eos_token_id = [tokenizer.eos_token_id, 7]
    assert stop_token_ids(tokenizer, model) == [tokenizer.eos_token_id, 7]


def test_completion_mask_ends_at_the_first_stop_token():
    ids = torch.tensor([[5, 3, 9, 9], [5, 5, 5, 2], [1, 1, 1, 1]])
    mask = completion_mask_through_eos(ids, [2, 3])
    assert mask.tolist() == [[1, 1, 0, 0], [1, 1, 1, 1], [1, 1, 1, 1]]
    assert is_stop(ids, 9).sum() == 2


@pytest.mark.parametrize("backend_class", [HFGenerateBackend, StaticDecodeBackend])
def test_backends_stop_at_an_extra_stop_token(tokenizer, backend_class):
    model = tiny_llama(tokenizer=tokenizer)
    stop = tokenizer.convert_tokens_to_ids("?")
    with torch.no_grad():  # make "?" likely, so most rows meet it within 16 tokens
        model.lm_head.weight[stop] += 3.0 * model.model.norm.weight
    prompts = [tokenizer(text, add_special_tokens=False)["input_ids"] for text in ["7+5=", "Tom has 3 "]]
    settings = SamplingSettings(group_size=4, max_new_tokens=16, temperature=1.0)
    stop_ids = stop_token_ids(tokenizer, model, ["?"])
    batch = backend_class(model, tokenizer, CPU, stop_ids=stop_ids).generate(prompts, settings, 3)
    completion = batch.input_ids[:, batch.prompt_length :]
    mask = batch.completion_mask[:, batch.prompt_length :]
    lengths = mask.sum(dim=1).long()
    stopped = 0
    for row, length in zip(completion, lengths, strict=True):
        hits = is_stop(row[:length], stop_ids).nonzero().flatten().tolist()
        assert hits in ([], [int(length) - 1])  # a stop token only as the last counted token
        stopped += bool(hits) and row[length - 1] == stop
    assert stopped >= 2  # the extra stop token really ended completions
