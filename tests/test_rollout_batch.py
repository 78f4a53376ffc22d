"""The rollout batch: one assembly function, and derived batches that keep every field."""

import dataclasses

import torch

from grpo_cli.rollout.batch import (
    TENSOR_FIELDS,
    RolloutBatch,
    assemble_batch,
    concat_batches,
    left_pad,
    select_groups,
    select_rows,
)

PAD = 0


def two_groups() -> RolloutBatch:
    """B=2 prompts x R=2 completions; completion lengths 2, 1, 3, 0."""
    prompt_ids, prompt_mask = left_pad([[5, 6], [5, 6], [7], [7]], PAD)  # [4, 2]
    completion_ids = torch.tensor([[1, 2, 9], [3, 9, 9], [4, 1, 2], [9, 9, 9]])  # [4, 3]
    completion_mask = torch.tensor([[1, 1, 0], [1, 0, 0], [1, 1, 1], [0, 0, 0]]).float()
    logprobs = -torch.arange(1, 13, dtype=torch.float32).reshape(4, 3)  # [4, 3]
    batch = assemble_batch(
        prompt_ids, prompt_mask, completion_ids, completion_mask, logprobs, 2,
        ["ab", "c", "dab", ""], pad_id=PAD,
    )
    batch.problem_indices = [10, 20]
    return batch


def test_assemble_keeps_tokens_on_attention_but_off_the_loss_mask():
    """TRL's tool-masked tokens: real (attended) tokens that carry no loss and no log-prob."""
    prompt_ids, prompt_mask = left_pad([[5], [6]], PAD)  # [2, 1]
    attended = torch.tensor([[1, 1, 1], [1, 1, 0]])  # [2, 3]
    loss_mask = torch.tensor([[1, 0, 1], [1, 1, 0]]).float()
    batch = assemble_batch(
        prompt_ids, prompt_mask, torch.tensor([[1, 2, 3], [4, 5, 9]]), loss_mask,
        -torch.ones(2, 3), 1, pad_id=PAD, completion_attention=attended,
    )
    assert batch.input_ids.tolist() == [[5, 1, 2, 3], [6, 4, 5, PAD]]
    assert batch.attention_mask.tolist() == [[1, 1, 1, 1], [1, 1, 1, 0]]
    assert batch.completion_mask.tolist() == [[0, 1, 0, 1], [0, 1, 1, 0]]
    assert batch.sampler_logprobs.tolist() == [[0, -1, 0, -1], [0, -1, -1, 0]]
    assert batch.completions == []


def test_every_field_is_a_tensor_field_or_handled_by_name():
    names = {f.name for f in dataclasses.fields(RolloutBatch)}
    assert names == set(TENSOR_FIELDS) | {"group_size", "prompt_length", "completions", "problem_indices"}


def test_assemble_lays_out_prompt_then_completion():
    batch = two_groups()
    assert batch.prompt_length == 2 and batch.group_size == 2
    assert batch.input_ids.tolist() == [
        [5, 6, 1, 2, PAD], [5, 6, 3, PAD, PAD], [PAD, 7, 4, 1, 2], [PAD, 7, PAD, PAD, PAD]
    ]
    assert batch.attention_mask.tolist() == [
        [1, 1, 1, 1, 0], [1, 1, 1, 0, 0], [0, 1, 1, 1, 1], [0, 1, 0, 0, 0]
    ]
    assert batch.completion_mask.tolist() == [
        [0, 0, 1, 1, 0], [0, 0, 1, 0, 0], [0, 0, 1, 1, 1], [0, 0, 0, 0, 0]
    ]
    assert batch.sampler_logprobs[0].tolist() == [0, 0, -1, -2, 0]
    assert batch.sampler_logprobs[3].abs().sum() == 0
    assert batch.completion_lengths().tolist() == [2, 1, 3, 0]


def test_select_rows_keeps_every_field():
    batch = two_groups()
    part = select_rows(batch, torch.tensor([3, 0]))
    for name in TENSOR_FIELDS:
        assert torch.equal(getattr(part, name), getattr(batch, name)[[3, 0]]), name
    assert part.completions == ["", "ab"]
    assert part.problem_indices == [20, 10]  # the groups of rows 3 and 0, in that order
    assert (part.group_size, part.prompt_length) == (2, 2)


def test_select_rows_by_slice_equals_by_index():
    """A micro-batch's slice gives views with the same values and host fields as its indices."""
    batch = two_groups()
    by_slice, by_index = select_rows(batch, slice(1, 3)), select_rows(batch, torch.tensor([1, 2]))
    for name in TENSOR_FIELDS:
        assert torch.equal(getattr(by_slice, name), getattr(by_index, name)), name
    assert by_slice.input_ids.data_ptr() == batch.input_ids[1].data_ptr()  # a view, no copy
    assert by_slice.completions == by_index.completions == batch.completions[1:3]
    assert by_slice.problem_indices == by_index.problem_indices == [10, 20]


def test_select_groups_keeps_whole_groups_in_order():
    batch = two_groups()
    part = select_groups(batch, [1])
    assert torch.equal(part.input_ids, batch.input_ids[2:])
    assert part.completions == ["dab", ""] and part.problem_indices == [20]
    assert part.num_groups == 1


def test_to_keeps_every_field():
    batch = two_groups()
    moved = batch.to("cpu")
    for name in TENSOR_FIELDS:
        assert torch.equal(getattr(moved, name), getattr(batch, name)), name
    assert moved.completions == batch.completions
    assert moved.problem_indices == batch.problem_indices


def test_concat_repads_and_concatenates_every_field():
    batch = two_groups()
    prompt_ids, prompt_mask = left_pad([[7], [7]], PAD)  # group 1 alone: prompt length 1
    short = assemble_batch(
        prompt_ids, prompt_mask, batch.input_ids[2:, 2:], batch.completion_mask[2:, 2:],
        batch.sampler_logprobs[2:, 2:], 2, batch.completions[2:], pad_id=PAD,
    )
    short.problem_indices = [20]
    both = concat_batches([select_groups(batch, [0]), short], PAD)
    assert both.prompt_length == 2
    for name in TENSOR_FIELDS:
        assert torch.equal(getattr(both, name), getattr(batch, name)), name
    assert both.completions == batch.completions
    assert both.problem_indices == batch.problem_indices
