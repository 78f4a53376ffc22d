"""The rollout batch: what a generation backend hands to the trainer and the probes."""

from __future__ import annotations

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

    def to(self, device: torch.device | str) -> RolloutBatch:
        return RolloutBatch(
            input_ids=self.input_ids.to(device),
            attention_mask=self.attention_mask.to(device),
            completion_mask=self.completion_mask.to(device),
            sampler_logprobs=self.sampler_logprobs.to(device),
            group_size=self.group_size,
            prompt_length=self.prompt_length,
            completions=self.completions,
            problem_indices=self.problem_indices,
        )


def concat_batches(batches: list[RolloutBatch], pad_id: int) -> RolloutBatch:
    """Stack batches of the same group size, re-padding prompts to a common length."""
    if len(batches) == 1:
        return batches[0]
    group_sizes = {batch.group_size for batch in batches}
    if len(group_sizes) != 1:
        raise ValueError(f"cannot concatenate batches of group sizes {sorted(group_sizes)}")
    prompt_length = max(batch.prompt_length for batch in batches)
    completion_length = max(batch.input_ids.shape[1] - batch.prompt_length for batch in batches)

    def pad(batch: RolloutBatch, tensor: torch.Tensor, value) -> torch.Tensor:
        left = prompt_length - batch.prompt_length
        right = completion_length - (batch.input_ids.shape[1] - batch.prompt_length)
        return torch.nn.functional.pad(tensor, (left, right), value=value)

    return RolloutBatch(
        input_ids=torch.cat([pad(b, b.input_ids, pad_id) for b in batches]),
        attention_mask=torch.cat([pad(b, b.attention_mask, 0) for b in batches]),
        completion_mask=torch.cat([pad(b, b.completion_mask, 0.0) for b in batches]),
        sampler_logprobs=torch.cat([pad(b, b.sampler_logprobs, 0.0) for b in batches]),
        group_size=batches[0].group_size,
        prompt_length=prompt_length,
        completions=[text for b in batches for text in b.completions],
        problem_indices=[index for b in batches for index in b.problem_indices],
    )


def select_groups(batch: RolloutBatch, groups: list[int]) -> RolloutBatch:
    """Keep only the given groups (in that order)."""
    size = batch.group_size
    rows = [group * size + member for group in groups for member in range(size)]
    index = torch.tensor(rows, dtype=torch.long, device=batch.input_ids.device)
    return RolloutBatch(
        input_ids=batch.input_ids[index],
        attention_mask=batch.attention_mask[index],
        completion_mask=batch.completion_mask[index],
        sampler_logprobs=batch.sampler_logprobs[index],
        group_size=size,
        prompt_length=batch.prompt_length,
        completions=[batch.completions[row] for row in rows],
        problem_indices=[batch.problem_indices[group] for group in groups],
    )
