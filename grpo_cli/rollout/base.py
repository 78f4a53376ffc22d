"""The interface every rollout backend implements (Hugging Face generate, vLLM)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch

from grpo_cli.rollout.batch import RolloutBatch


@dataclass(frozen=True)
class SamplingSettings:
    group_size: int  # R completions per prompt
    max_new_tokens: int  # completion length cap
    temperature: float = 1.0  # 0 means greedy
    top_p: float = 1.0  # nucleus sampling


class RolloutBackend(Protocol):
    def generate(
        self,
        prompts: list[list[int]],  # B prompts as token ids (no padding)
        settings: SamplingSettings,
        generator_seed: int,  # makes sampling reproducible for a given step
    ) -> RolloutBatch:
        """Sample R completions per prompt; return them with the sampler's per-token log-probs."""
        ...

    def sync_weights(self, model: torch.nn.Module) -> None:
        """Make the sampler use the policy's current weights (a no-op when they are shared)."""
        ...
