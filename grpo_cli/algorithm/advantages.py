"""Advantage estimators: rewards in, per-rollout or per-token advantages out.

Outcome estimators are registered by name (`AlgorithmConfig.name`) and share one signature,
`estimator(rewards [N], group_size, **options) -> advantages [N]` float32, with rows of a group
contiguous (row n belongs to group n // group_size). Options an estimator does not use are ignored,
so one call site can pass every algorithm option to whichever estimator the config names.

Every group baseline gives exactly 0 to a zero-variance group (all rewards equal), whatever the
round-off of its mean. `process_advantages` (step rewards) and `gae` (PPO with a value head) work on
tokens and have their own signatures; they are not in the registry.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

Estimator = Callable[..., torch.Tensor]

ESTIMATORS: dict[str, Estimator] = {}


def register_estimator(name: str) -> Callable[[Estimator], Estimator]:
    """Decorator: make `fn` selectable as `algorithm.name=<name>`."""

    def decorate(fn: Estimator) -> Estimator:
        if name in ESTIMATORS:
            raise ValueError(f"advantage estimator {name!r} is already registered")
        ESTIMATORS[name] = fn
        return fn

    return decorate


def get_estimator(name: str) -> Estimator:
    """The outcome estimator registered as `name`; ValueError naming the known ones otherwise."""
    if name not in ESTIMATORS:
        known = ", ".join(sorted(ESTIMATORS))
        raise ValueError(f"unknown advantage estimator {name!r}; known: {known}")
    return ESTIMATORS[name]


def _grouped(rewards: torch.Tensor, group_size: int) -> torch.Tensor:  # [B, R] float64
    if rewards.dim() != 1:
        raise ValueError(f"rewards must be 1-D [N], got shape {tuple(rewards.shape)}")
    if group_size < 1 or rewards.numel() % group_size:
        raise ValueError(f"{rewards.numel()} rewards do not split into groups of {group_size}")
    return rewards.double().reshape(-1, group_size)


def _zero_variance(groups: torch.Tensor) -> torch.Tensor:  # [B, 1] bool
    return (groups == groups[:, :1]).all(dim=1, keepdim=True)


def _finish(groups: torch.Tensor, advantages: torch.Tensor) -> torch.Tensor:  # [N] float32
    """Exact zeros for zero-variance groups, flattened back to [N] float32."""
    advantages = advantages.masked_fill(_zero_variance(groups), 0.0)
    return advantages.reshape(-1).float()


@register_estimator("grpo")
def grpo(
    rewards: torch.Tensor,  # [N]
    group_size: int,
    *,
    std: str = "population",
    std_epsilon: float = 1e-6,
    **_other_options: object,
) -> torch.Tensor:  # [N]
    """A_i = (r_i - mean_g r) / (std_g r + std_epsilon)  (Shao et al. 2024, DeepSeekMath).

    `std="population"` divides the squared deviations by R (ddof=0), `"sample"` by R-1 (ddof=1,
    undefined for R=1). Zero-variance groups get exactly 0.
    """
    groups = _grouped(rewards, group_size)  # [B, R]
    if std not in ("population", "sample"):
        raise ValueError(f"grpo std must be 'population' or 'sample', got {std!r}")
    ddof = 0 if std == "population" else 1
    if group_size - ddof < 1:
        raise ValueError("grpo with std='sample' needs group_size >= 2")
    centered = groups - groups.mean(dim=1, keepdim=True)  # [B, R]
    spread = groups.std(dim=1, correction=ddof, keepdim=True)  # [B, 1]
    return _finish(groups, centered / (spread + std_epsilon))


@register_estimator("dr_grpo")
def dr_grpo(rewards: torch.Tensor, group_size: int, **_other_options: object) -> torch.Tensor:
    """A_i = r_i - mean_g r, no std division (Liu et al. 2025, "Understanding R1-Zero-like training")."""
    groups = _grouped(rewards, group_size)  # [B, R]
    return _finish(groups, groups - groups.mean(dim=1, keepdim=True))


@register_estimator("rloo")
def rloo(rewards: torch.Tensor, group_size: int, **_other_options: object) -> torch.Tensor:
    """A_i = r_i - mean_{j != i} r_j, leave-one-out baseline (Ahmadian et al. 2024).

    Equals R/(R-1) * (r_i - mean_g r); needs group_size >= 2.
    """
    if group_size < 2:
        raise ValueError(
            "rloo needs group_size >= 2 (the leave-one-out baseline of one rollout is empty)"
        )
    groups = _grouped(rewards, group_size)  # [B, R]
    others_mean = (groups.sum(dim=1, keepdim=True) - groups) / (group_size - 1)  # [B, R]
    return _finish(groups, groups - others_mean)


@register_estimator("reinforce")
def reinforce(rewards: torch.Tensor, group_size: int, **_other_options: object) -> torch.Tensor:
    """A_i = r_i - mean over the whole batch (Williams 1992 with a batch-mean baseline).

    Groups are ignored; a batch whose rewards are all equal gets exactly 0.
    """
    batch = _grouped(rewards, rewards.numel() or 1).reshape(1, -1)  # [1, N]
    return _finish(batch, batch - batch.mean(dim=1, keepdim=True))


def broadcast_to_tokens(
    advantages: torch.Tensor,  # [N]
    completion_mask: torch.Tensor,  # [N, L]
) -> torch.Tensor:  # [N, L]
    """Every completion token of rollout n gets A_n; prompt and padding get 0."""
    return advantages.unsqueeze(1) * completion_mask.to(advantages.dtype)


def _group_mean_where_present(
    values: torch.Tensor,  # [N, K]
    present: torch.Tensor,  # [N, K] bool
    group_size: int,
) -> torch.Tensor:  # [N, K]
    """Mean of values[:, k] over the group members that have step k (0 where none has)."""
    num_steps = values.shape[1]
    grouped = (values * present).reshape(-1, group_size, num_steps)  # [B, R, K]
    counts = present.reshape(-1, group_size, num_steps).sum(dim=1, keepdim=True)  # [B, 1, K]
    means = grouped.sum(dim=1, keepdim=True) / counts.clamp(min=1)  # [B, 1, K]
    return means.expand(-1, group_size, -1).reshape(-1, num_steps)


def process_advantages(
    step_rewards: torch.Tensor,  # [N, L] reward on each step's last token, outcome on the last completion token
    completion_mask: torch.Tensor,  # [N, L]
    step_index: torch.Tensor,  # [N, L] long, step position of each token, -1 on prompt/padding
    group_size: int,
    baseline: str = "step_group",
    outcome_rewards: torch.Tensor | None = None,  # [N] outcome part of the last token's reward
) -> torch.Tensor:  # [N, L] float32
    """Token advantages from step-level rewards with a per-step group baseline.

    Let r_{n,k} be the sum of rollout n's step_rewards over the tokens of step k, f_n the outcome
    reward (`outcome_rewards`, or if None the whole value at n's last completion token, which
    step_rewards must include either way) and, for a per-step quantity x_{n,k},
    mean_k(x) the mean over the members of n's group that have a step k. A token of step k gets

    - "return_to_go": G_{n,k} - mean_k(G), with G_{n,k} = sum_{k' >= k} r_{n,k'} (gamma = 1;
      the outcome f_n sits in the last step, so it is part of every G).
    - "step_group": (s_{n,k} - mean_k(s)) + (f_n - mean_group(f)), with s_{n,k} = r_{n,k}
      minus f_n in the last step. The outcome term is the same for all tokens of a rollout;
      tokens differ where their steps' centred rewards differ. Without `outcome_rewards`, a step
      reward on the last completion token cannot be told apart and counts as outcome.

    Every completion token must have a step index >= 0. Prompt and padding get 0.
    """
    if baseline not in ("step_group", "return_to_go"):
        raise ValueError(
            f"process baseline must be 'step_group' or 'return_to_go', got {baseline!r}"
        )
    in_completion = completion_mask > 0  # [N, L]
    if (step_index[in_completion] < 0).any():
        raise ValueError("every completion token needs a step index >= 0")
    num_rows, length = step_rewards.shape
    if num_rows % group_size:
        raise ValueError(f"{num_rows} rollouts do not split into groups of {group_size}")
    num_steps = int(step_index.max().clamp(min=0)) + 1  # K
    token_step = step_index.clamp(min=0)  # [N, L]
    rewards = torch.where(in_completion, step_rewards.double(), 0.0)  # [N, L]

    has_completion = in_completion.any(dim=1, keepdim=True)  # [N, 1]
    last_column = length - 1 - in_completion.flip(1).int().argmax(dim=1, keepdim=True)  # [N, 1]
    # [N, L] True on each non-empty rollout's last completion token
    is_last_token = torch.zeros_like(in_completion).scatter(1, last_column, has_completion)
    if outcome_rewards is None:
        outcome = (rewards * is_last_token).sum(dim=1)  # [N] f_n
    else:
        outcome = outcome_rewards.to(rewards).reshape(-1) * has_completion.squeeze(1)  # [N] f_n

    def per_step(token_values: torch.Tensor) -> torch.Tensor:  # [N, L] -> [N, K] sum per step
        zeros = torch.zeros(num_rows, num_steps, dtype=rewards.dtype, device=rewards.device)
        return zeros.scatter_add(1, token_step, token_values)

    present = per_step(in_completion.double()) > 0  # [N, K] rollout n has a step k

    if baseline == "return_to_go":
        step_sums = per_step(rewards)  # [N, K] r_{n,k}
        to_go = step_sums.flip(1).cumsum(1).flip(1)  # [N, K] G_{n,k}
        step_advantage = to_go - _group_mean_where_present(to_go, present, group_size)  # [N, K]
        outcome_advantage = torch.zeros_like(outcome)  # [N]
    else:
        step_only = per_step(rewards - is_last_token * outcome[:, None])  # [N, K] s_{n,k}
        step_advantage = step_only - _group_mean_where_present(step_only, present, group_size)
        group_outcome = outcome.reshape(-1, group_size)  # [B, R]
        outcome_advantage = (group_outcome - group_outcome.mean(dim=1, keepdim=True)).reshape(-1)

    token_advantage = step_advantage.gather(1, token_step) + outcome_advantage[:, None]  # [N, L]
    return torch.where(in_completion, token_advantage, 0.0).float()


def gae(
    rewards_per_token: torch.Tensor,  # [N, L]
    values: torch.Tensor,  # [N, L]
    completion_mask: torch.Tensor,  # [N, L]
    gamma: float,
    lam: float,
) -> tuple[torch.Tensor, torch.Tensor]:  # advantages [N, L], returns [N, L]
    """Generalised advantage estimation over completion tokens (Schulman et al. 2016).

    delta_t = r_t + gamma V_{t+1} - V_t and A_t = delta_t + gamma lam A_{t+1}, where t+1 is the
    next completion token of the row (masked columns are skipped) and V after the last completion
    token is 0. Returns (A, A + V), both 0 off the completion mask and detached from `values`.
    """
    rewards = rewards_per_token.detach().float()  # [N, L]
    values = values.detach().float()  # [N, L]
    in_completion = completion_mask > 0  # [N, L]
    advantages = torch.zeros_like(values)  # [N, L]
    next_value = values.new_zeros(values.shape[0])  # [N]
    next_advantage = values.new_zeros(values.shape[0])  # [N]
    for t in reversed(range(values.shape[1])):
        delta = rewards[:, t] + gamma * next_value - values[:, t]  # [N]
        advantage = delta + gamma * lam * next_advantage  # [N]
        here = in_completion[:, t]  # [N]
        advantages[:, t] = torch.where(here, advantage, 0.0)
        next_value = torch.where(here, values[:, t], next_value)
        next_advantage = torch.where(here, advantage, next_advantage)
    returns = torch.where(in_completion, advantages + values, 0.0)  # [N, L]
    return advantages, returns
