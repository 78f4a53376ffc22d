"""What a scored batch says before any gradient: its rewards, which groups carry no signal, and
how uniform each rollout's credit is. Plain functions shared by every trainer that writes
metrics.csv (grpo-cli's loop, grpo_cli/train/trainer.py, and the TRL callback).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

import torch

from grpo_cli.algorithm.advantages import advantage_range


@dataclass
class ScoredBatch:
    rewards: torch.Tensor  # [N] outcome reward used for advantages (after any overlong penalty)
    correct: torch.Tensor  # [N] 1.0 where the final answer is right
    step_rewards: torch.Tensor | None = None  # [N, L] process: step rewards on step-final tokens
    step_index: torch.Tensor | None = None  # [N, L] process: step position of each token


def zero_variance_groups(rewards: torch.Tensor, group_size: int) -> torch.Tensor:  # [B] bool
    groups = rewards.reshape(-1, group_size)
    return (groups.max(dim=1).values - groups.min(dim=1).values).abs() < 1e-12


def credit_uniform_share(advantages: torch.Tensor, completion_mask: torch.Tensor) -> torch.Tensor:
    """Fraction of rollouts whose completion tokens all received the same advantage (0-d, on
    the advantages' device: nothing read back)."""
    low, high, has_tokens = advantage_range(advantages, completion_mask)
    scale = advantages.abs().max().clamp(min=1e-12)
    uniform = ((high - low) <= 1e-6 * scale) | ~has_tokens
    return uniform.float().mean()


def expected_zero_variance_fraction(success_rate: float, group_size: int) -> float:
    """P(all R rewards equal) for i.i.d. binary rewards: p^R + (1 - p)^R."""
    if not 0.0 <= success_rate <= 1.0:
        raise ValueError(f"success rate must be in [0, 1], got {success_rate}")
    return success_rate**group_size + (1.0 - success_rate) ** group_size


def mean_expected_zero_variance_fraction(success_rates: Iterable[float], group_size: int) -> float:
    """Mean over prompts of p_b^R + (1 - p_b)^R, p_b each prompt's success rate."""
    rates = [float(rate) for rate in success_rates]
    if not rates:
        return math.nan
    return sum(expected_zero_variance_fraction(rate, group_size) for rate in rates) / len(rates)


def group_outcome_shares(correct: torch.Tensor, group_size: int) -> torch.Tensor:  # [3]
    """Shares of groups whose rollouts are all wrong, all right, or mixed (NeMo-RL's split), by
    the final answer (correct > 0.5), as one tensor on correct's device (nothing read back)."""
    right = correct.reshape(-1, group_size) > 0.5  # [B, R]
    all_right, all_wrong = right.all(dim=1), (~right).all(dim=1)  # [B] each
    return torch.stack([all_wrong, all_right, ~(all_wrong | all_right)]).float().mean(dim=1)
