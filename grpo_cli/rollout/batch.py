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
