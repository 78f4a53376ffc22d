"""The rollout batch: what a generation backend hands to the trainer and the probes."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field

import torch


@dataclass
class RolloutBatch:
    """B prompts x R completions, rows of one group contiguous (row n belongs to group n // R).

    Column t of every [N, L] tensor refers to token input_ids[:, t]; log-probs at t are of that
    token given the tokens before it. Prompts are left-padded to `prompt_length`, completions
    right-padded after it.
    """

    input_ids: torch.Tensor  # [N, L] long, N = B*R
    attention_mask: torch.Tensor  # [N, L] long, 1 on real (prompt or completion) tokens
    completion_mask: torch.Tensor  # [N, L] float, 1 on completion tokens that count (up to EOS)
    sampler_logprobs: torch.Tensor  # [N, L] float32, sampler's log-prob per completion token, 0 elsewhere
    group_size: int  # R
    prompt_length: int  # completions start at this column
    completions: list[str] = field(default_factory=list)  # [N] decoded completion text
    problem_indices: list[int] = field(default_factory=list)  # [B] index of each group's problem

    @property
    def num_rollouts(self) -> int:
        return self.input_ids.shape[0]

    @property
    def num_groups(self) -> int:
        return self.num_rollouts // self.group_size

    @property
    def group_ids(self) -> torch.Tensor:  # [N]
        return torch.arange(self.num_rollouts, device=self.input_ids.device) // self.group_size

    def completion_lengths(self) -> torch.Tensor:  # [N]
        return self.completion_mask.sum(dim=1)

    def completion_widths(self) -> torch.Tensor:  # [N] long
        """Completion columns of each row through its last real token (completions are
        right-padded): what a forward over that row's completion must cover."""
        return self.attention_mask[:, self.prompt_length :].sum(dim=1)

    def to(self, device: torch.device | str) -> RolloutBatch:
        return replace_tensors(self, lambda tensor: tensor.to(device))


# The [N, L] tensor fields and the value that pads each; every derived batch maps all of them.
TENSOR_FIELDS = {"input_ids": None, "attention_mask": 0, "completion_mask": 0.0, "sampler_logprobs": 0.0}


def left_pad(prompts: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Stack token-id lists into left-padded ids and attention mask, both [N, P]."""
    width = max(len(prompt) for prompt in prompts)
    ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(prompts), width), dtype=torch.long)
    for row, prompt in enumerate(prompts):
        ids[row, width - len(prompt) :] = torch.tensor(prompt, dtype=torch.long)
        mask[row, width - len(prompt) :] = 1
    return ids, mask


def assemble_batch(
    prompt_ids: torch.Tensor,  # [N, P] long, left-padded
    prompt_mask: torch.Tensor,  # [N, P] long, 1 on prompt tokens
    completion_ids: torch.Tensor,  # [N, T] long, right-padded
    completion_mask: torch.Tensor,  # [N, T] float, 1 on completion tokens that count
    completion_logprobs: torch.Tensor,  # [N, T] float32, sampler's log-prob of each token
    group_size: int,
    completions: list[str] | None = None,  # [N] decoded completion text
    *,
    pad_id: int | None = None,  # completion tokens off the attention mask become pad_id
    completion_attention: torch.Tensor | None = None,  # [N, T] real completion tokens; default completion_mask
) -> RolloutBatch:
    """The batch a sampler hands over: prompt columns then completion columns; log-probs are
    kept on `completion_mask` only. A sampler's tokens after a stop token count for nothing:
    with `pad_id` they become padding (off the attention mask)."""
    attention = completion_mask if completion_attention is None else completion_attention  # [N, T]
    zeros_prompt = torch.zeros(prompt_ids.shape, device=prompt_ids.device)  # [N, P] float32
    if pad_id is not None:
        completion_ids = torch.where(attention.bool(), completion_ids, pad_id)  # [N, T]
    return RolloutBatch(
        input_ids=torch.cat([prompt_ids, completion_ids], dim=1),
        attention_mask=torch.cat([prompt_mask, attention.long()], dim=1),
        completion_mask=torch.cat([zeros_prompt, completion_mask], dim=1),
        sampler_logprobs=torch.cat([zeros_prompt, completion_logprobs * completion_mask], dim=1),
        group_size=group_size,
        prompt_length=prompt_ids.shape[1],
        completions=list(completions or []),
    )


def replace_tensors(
    batch: RolloutBatch, transform: Callable[[torch.Tensor], torch.Tensor], **changes
) -> RolloutBatch:
    """A copy of `batch` with `transform` applied to every [N, L] tensor field; the other fields
    are kept unless `changes` names them, so no field is dropped on the way."""
    tensors = {name: transform(getattr(batch, name)) for name in TENSOR_FIELDS}
    return dataclasses.replace(batch, **tensors, **changes)


def select_rows(batch: RolloutBatch, rows: torch.Tensor | list[int] | slice) -> RolloutBatch:
    """Rows `rows` (in that order) with their completions and the problems of their groups.

    A subset that splits a group (a micro-batch) keeps the problem index of every group it
    touches, in order of first appearance; `num_groups` is only meaningful for whole groups.
    A slice (a micro-batch's rows start:stop) gives views and reads nothing back to the host; a
    list reads nothing back either (a tensor of rows on the device is read once).
    """
    if isinstance(rows, slice):
        row_list = list(range(batch.num_rollouts)[rows])
        index = rows
    elif isinstance(rows, torch.Tensor):
        row_list = rows.tolist()  # a host read where `rows` lives on the device
        index = rows.to(batch.input_ids.device, torch.long)  # [n]
    else:  # a list already on the host: nothing to read back
        row_list = [int(row) for row in rows]
        index = torch.tensor(row_list, dtype=torch.long, device=batch.input_ids.device)  # [n]
    groups = list(dict.fromkeys(row // batch.group_size for row in row_list))
    return replace_tensors(
        batch,
        lambda tensor: tensor[index],
        completions=[batch.completions[row] for row in row_list] if batch.completions else [],
        problem_indices=(
            [batch.problem_indices[group] for group in groups] if batch.problem_indices else []
        ),
    )


def select_groups(batch: RolloutBatch, groups: list[int]) -> RolloutBatch:
    """Keep only the given groups (in that order)."""
    size = batch.group_size
    return select_rows(batch, [group * size + member for group in groups for member in range(size)])


def concat_batches(batches: list[RolloutBatch], pad_id: int) -> RolloutBatch:
    """Stack batches of the same group size, re-padding prompts to a common length."""
    if len(batches) == 1:
        return batches[0]
    group_sizes = {batch.group_size for batch in batches}
    if len(group_sizes) != 1:
        raise ValueError(f"cannot concatenate batches of group sizes {sorted(group_sizes)}")
    prompt_length = max(batch.prompt_length for batch in batches)
    completion_length = max(batch.input_ids.shape[1] - batch.prompt_length for batch in batches)

    def padded(name: str) -> torch.Tensor:  # [sum N, prompt_length + completion_length]
        value = pad_id if TENSOR_FIELDS[name] is None else TENSOR_FIELDS[name]
        parts = []
        for batch in batches:
            left = prompt_length - batch.prompt_length
            right = completion_length - (batch.input_ids.shape[1] - batch.prompt_length)
            parts.append(torch.nn.functional.pad(getattr(batch, name), (left, right), value=value))
        return torch.cat(parts)

    return dataclasses.replace(
        batches[0],
        **{name: padded(name) for name in TENSOR_FIELDS},
        prompt_length=prompt_length,
        completions=[text for b in batches for text in b.completions],
        problem_indices=[index for b in batches for index in b.problem_indices],
    )
