"""Advantage estimators: rewards in, per-token advantages out, every one registered by name.

Every estimator, outcome or token-level, is registered with `@register_adv_est(name)` (as verl's
`core_algos.register_adv_est`) and has one signature:

    estimator(
        token_level_rewards,  # [N, L] each reward on the token that earned it: the outcome on a
                              #   rollout's last completion token (process: step rewards too)
        response_mask,        # [N, L] 1 on completion tokens
        group_size,           # R; rows of a group are contiguous (row n is in group n // R)
        config,               # the algorithm options (AlgorithmConfig), read by name
        *,
        outcome_rewards,      # [N] each rollout's outcome reward
        values=None,          # [N, L] value head's V before each token (needs_values)
        step_index=None,      # [N, L] long, step of each token, -1 off steps (needs_step_rewards)
        token_probs=None,     # TokenProbs: the policy's log-prob of each sampled token and its
                              #   sum of squared vocabulary probabilities (needs_token_probs)
    ) -> (advantages [N, L] float32, returns [N, L] value targets or None)

What an estimator needs from the run (a value head, the task's checked steps) and what it is
(its `facts`: outcome or per-token credit, a zero-sum group or not; a run records them in
run.json's `estimator_facts`, which `grpo analyze` reads) are properties of its registration,
never a comparison with its name elsewhere. Adding one is one function here and one YAML file
in conf/algorithm/.

Outcome estimators (grpo, dr_grpo, rloo, reinforce) give each rollout one scalar, broadcast to
its completion tokens; every group baseline gives exactly 0 to a zero-variance group (all
rewards equal), whatever the round-off of its mean. `process` (step rewards), `ppo` (GAE on
a value head) and `otb` (verl's Optimal Token Baseline: a per-timestep baseline from the policy's
own probabilities, no per-token reward) give tokens of one rollout different advantages.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

import torch

AdvantageFn = Callable[..., tuple[torch.Tensor, torch.Tensor | None]]


CREDITS = ("outcome", "per_token")  # what `credit` may say


@dataclass(frozen=True)
class RegisteredEstimator:
    name: str
    compute: AdvantageFn  # the estimator, with the module docstring's signature
    # outcome: one advantage per rollout, shared by all its tokens (the paper's claim 1);
    # per_token: advantages may vary along a completion (the paper's falsifier, claim 4)
    credit: str
    # each rollout gets c * (r_i - mean of its group), c > 0 the same for the group, so a group's
    # advantages sum to zero: what the rank-2 argument and the composition prediction assume
    zero_sum_group: bool
    needs_values: bool = False  # the run builds a value head and passes its values
    needs_step_rewards: bool = False  # the task's checked steps become token_level_rewards
    group_baseline: bool = True  # the baseline is the group's own rewards (R = 1 trains nothing)
    needs_token_probs: bool = False  # the run passes the policy's per-token probabilities (TokenProbs)

    def facts(self) -> dict:
        """run.json's `estimator_facts`: what the analysis needs to judge this estimator."""
        return {"name": self.name, "credit": self.credit, "zero_sum_group": self.zero_sum_group}


class TokenProbs(NamedTuple):
    """What the pre-update policy says about each sampled token (0 off the completion)."""

    logprobs: torch.Tensor  # [N, L] log pi(y_t | y_<t) of the sampled token
    sum_pi_squared: torch.Tensor  # [N, L] sum over the vocabulary of pi(v | y_<t)^2


ESTIMATORS: dict[str, RegisteredEstimator] = {}
GRPO_STD = ("population", "sample")  # grpo's std: ddof 0 or 1
PROCESS_BASELINES = ("step_group", "return_to_go")  # process: per-step baselines


def register_adv_est(
    name: str,
    *,
    credit: str,
    zero_sum_group: bool,
    needs_values: bool = False,
    needs_step_rewards: bool = False,
    group_baseline: bool = True,
    needs_token_probs: bool = False,
) -> Callable[[AdvantageFn], AdvantageFn]:
    """Decorator: make `fn` selectable as `algorithm.name=<name>`, with what it is (`credit`,
    `zero_sum_group`; see RegisteredEstimator) and what it needs from the run."""
    if credit not in CREDITS:
        raise ValueError(f"estimator {name!r}: credit={credit!r} is not one of {', '.join(CREDITS)}")
    if zero_sum_group and credit != "outcome":
        raise ValueError(f"estimator {name!r}: a zero-sum group gives one advantage per rollout "
                         "(credit='outcome')")

    def decorate(fn: AdvantageFn) -> AdvantageFn:
        if name in ESTIMATORS:
            raise ValueError(f"advantage estimator {name!r} is already registered")
        ESTIMATORS[name] = RegisteredEstimator(
            name, fn, credit, zero_sum_group, needs_values, needs_step_rewards, group_baseline,
            needs_token_probs,
        )
        return fn

    return decorate


def get_estimator(name: str) -> RegisteredEstimator:
    """The estimator registered as `name`; ValueError naming the known ones otherwise."""
    if name not in ESTIMATORS:
        known = ", ".join(sorted(ESTIMATORS))
        raise ValueError(f"unknown advantage estimator {name!r}; known: {known}")
    return ESTIMATORS[name]


def outcome_on_last_token(
    rewards: torch.Tensor,  # [N]
    response_mask: torch.Tensor,  # [N, L]
) -> torch.Tensor:  # [N, L]
    """token_level_rewards of an outcome-only task: r_n on rollout n's last completion token."""
    last = response_mask.cumsum(1) == response_mask.sum(1, keepdim=True)  # [N, L] at/after the last
    first_last = last & (response_mask > 0)  # [N, L]
    return first_last.float() * rewards.unsqueeze(1)


def _grouped(rewards: torch.Tensor, group_size: int) -> torch.Tensor:  # [B, R] float64
    if rewards.dim() != 1:
        raise ValueError(f"rewards must be 1-D [N], got shape {tuple(rewards.shape)}")
    if group_size < 1 or rewards.numel() % group_size:
        raise ValueError(f"{rewards.numel()} rewards do not split into groups of {group_size}")
    return rewards.double().reshape(-1, group_size)


def _zero_variance(groups: torch.Tensor) -> torch.Tensor:  # [B, 1] bool
    return (groups == groups[:, :1]).all(dim=1, keepdim=True)


def _per_rollout(
    groups: torch.Tensor,  # [B, R] rewards
    advantages: torch.Tensor,  # [B, R]
    response_mask: torch.Tensor,  # [N, L]
) -> tuple[torch.Tensor, None]:  # [N, L] float32
    """Exact zeros for zero-variance groups; each rollout's A_n on all of its completion tokens."""
    advantages = advantages.masked_fill(_zero_variance(groups), 0.0).reshape(-1).float()  # [N]
    return broadcast_to_tokens(advantages.to(response_mask.device), response_mask), None


@register_adv_est("grpo", credit="outcome", zero_sum_group=True)
def grpo(
    token_level_rewards: torch.Tensor,  # [N, L]
    response_mask: torch.Tensor,  # [N, L]
    group_size: int,
    config,
    *,
    outcome_rewards: torch.Tensor,  # [N]
    values: torch.Tensor | None = None,
    step_index: torch.Tensor | None = None,
    token_probs: TokenProbs | None = None,
) -> tuple[torch.Tensor, None]:  # [N, L]
    """A_i = (r_i - mean_g r) / (std_g r + std_epsilon)  (Shao et al. 2024, DeepSeekMath).

    `config.std="population"` divides the squared deviations by R (ddof=0), `"sample"` by R-1
    (ddof=1, undefined for R=1). Zero-variance groups get exactly 0.
    """
    groups = _grouped(outcome_rewards, group_size)  # [B, R]
    if config.std not in GRPO_STD:
        raise ValueError(f"grpo std must be one of {GRPO_STD}, got {config.std!r}")
    ddof = 0 if config.std == "population" else 1
    if group_size - ddof < 1:
        raise ValueError("grpo with std='sample' needs group_size >= 2")
    centered = groups - groups.mean(dim=1, keepdim=True)  # [B, R]
    spread = groups.std(dim=1, correction=ddof, keepdim=True)  # [B, 1]
    return _per_rollout(groups, centered / (spread + config.std_epsilon), response_mask)


@register_adv_est("dr_grpo", credit="outcome", zero_sum_group=True)
def dr_grpo(
    token_level_rewards: torch.Tensor,  # [N, L]
    response_mask: torch.Tensor,  # [N, L]
    group_size: int,
    config,
    *,
    outcome_rewards: torch.Tensor,  # [N]
    values: torch.Tensor | None = None,
    step_index: torch.Tensor | None = None,
    token_probs: TokenProbs | None = None,
) -> tuple[torch.Tensor, None]:  # [N, L]
    """A_i = r_i - mean_g r, no std division (Liu et al. 2025, "Understanding R1-Zero-like training")."""
    groups = _grouped(outcome_rewards, group_size)  # [B, R]
    return _per_rollout(groups, groups - groups.mean(dim=1, keepdim=True), response_mask)


@register_adv_est("rloo", credit="outcome", zero_sum_group=True)
def rloo(
    token_level_rewards: torch.Tensor,  # [N, L]
    response_mask: torch.Tensor,  # [N, L]
    group_size: int,
    config,
    *,
    outcome_rewards: torch.Tensor,  # [N]
    values: torch.Tensor | None = None,
    step_index: torch.Tensor | None = None,
    token_probs: TokenProbs | None = None,
) -> tuple[torch.Tensor, None]:  # [N, L]
    """A_i = r_i - mean_{j != i} r_j, leave-one-out baseline (Ahmadian et al. 2024).

    Equals R/(R-1) * (r_i - mean_g r); needs group_size >= 2.
    """
    if group_size < 2:
        raise ValueError(
            "rloo needs group_size >= 2 (the leave-one-out baseline of one rollout is empty)"
        )
    groups = _grouped(outcome_rewards, group_size)  # [B, R]
    others_mean = (groups.sum(dim=1, keepdim=True) - groups) / (group_size - 1)  # [B, R]
    return _per_rollout(groups, groups - others_mean, response_mask)


@register_adv_est("reinforce", credit="outcome", zero_sum_group=False, group_baseline=False)
def reinforce(
    token_level_rewards: torch.Tensor,  # [N, L]
    response_mask: torch.Tensor,  # [N, L]
    group_size: int,
    config,
    *,
    outcome_rewards: torch.Tensor,  # [N]
    values: torch.Tensor | None = None,
    step_index: torch.Tensor | None = None,
    token_probs: TokenProbs | None = None,
) -> tuple[torch.Tensor, None]:  # [N, L]
    """A_i = r_i - mean over the whole batch (Williams 1992 with a batch-mean baseline).

    Groups are ignored; a batch whose rewards are all equal gets exactly 0.
    """
    batch = _grouped(outcome_rewards, outcome_rewards.numel() or 1).reshape(1, -1)  # [1, N]
    return _per_rollout(batch, batch - batch.mean(dim=1, keepdim=True), response_mask)


@register_adv_est("process", credit="per_token", zero_sum_group=False, needs_step_rewards=True)
def process(
    token_level_rewards: torch.Tensor,  # [N, L] step rewards on step ends, outcome on the last token
    response_mask: torch.Tensor,  # [N, L]
    group_size: int,
    config,
    *,
    outcome_rewards: torch.Tensor,  # [N]
    values: torch.Tensor | None = None,
    step_index: torch.Tensor | None = None,  # [N, L]
    token_probs: TokenProbs | None = None,
) -> tuple[torch.Tensor, None]:  # [N, L]
    """Per-step rewards from checked calculator steps, baseline `config.process_baseline`
    (see `process_advantages`)."""
    if step_index is None:
        raise ValueError("algorithm=process needs step rewards from the task")
    advantages = process_advantages(
        token_level_rewards, response_mask, step_index, group_size,
        baseline=config.process_baseline, outcome_rewards=outcome_rewards,
    )
    return advantages, None


@register_adv_est("ppo", credit="per_token", zero_sum_group=False, needs_values=True,
                  group_baseline=False)
def ppo(
    token_level_rewards: torch.Tensor,  # [N, L]
    response_mask: torch.Tensor,  # [N, L]
    group_size: int,
    config,
    *,
    outcome_rewards: torch.Tensor,  # [N]
    values: torch.Tensor | None = None,  # [N, L]
    step_index: torch.Tensor | None = None,
    token_probs: TokenProbs | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:  # advantages [N, L], returns [N, L]
    """GAE on a learned value head (Schulman et al. 2016/2017), `config.gamma`, `config.lam`."""
    if values is None:
        raise ValueError("algorithm=ppo needs the value head's values")
    return gae(token_level_rewards, values, response_mask, config.gamma, config.lam)


@register_adv_est("otb", credit="per_token", zero_sum_group=False, group_baseline=False,
                  needs_token_probs=True)
def otb(
    token_level_rewards: torch.Tensor,  # [N, L]
    response_mask: torch.Tensor,  # [N, L]
    group_size: int,
    config,
    *,
    outcome_rewards: torch.Tensor,  # [N]
    values: torch.Tensor | None = None,
    step_index: torch.Tensor | None = None,
    token_probs: TokenProbs | None = None,  # [N, L] each field
) -> tuple[torch.Tensor, None]:  # [N, L]
    """Optimal Token Baseline: A_t = G_t - B_t with B_t = sum_g G_t W_t / (sum_g W_t + 1e-8).

    verl's `compute_optimal_token_baseline_advantage` (verl/trainer/ppo/core_algos.py; Li et al.,
    arXiv 2602.07078). G_t is the reward-to-go, W_t = sum_{j<=t} (1 - 2 pi_j + sum_v pi_v^2) the
    cumulative score-norm proxy (pi_j the sampled token's probability; the term is
    ||onehot - pi||^2, the squared logit-gradient of log pi_j), and the sums run over the rollouts
    of the group still generating at completion position t. With `config.otb_zero_tail` (verl's
    default) the one strictly longest rollout of a group gets baseline 0 past the second-longest
    length (where it would otherwise be its own baseline). R = 1 has no baseline (A_t = G_t).
    Not zero-sum, and not exactly 0 for zero-variance groups (the 1e-8 and the zero tail).
    Completion position t is a column: completions all start at one column (RolloutBatch).
    """
    if token_probs is None:
        raise ValueError("algorithm=otb needs the policy's per-token probabilities (token_probs)")
    rows, length = response_mask.shape
    if group_size < 1 or rows % group_size:
        raise ValueError(f"{rows} rollouts do not split into groups of {group_size}")
    mask = response_mask.double()  # [N, L]
    to_go = (token_level_rewards.double() * mask).flip(1).cumsum(1).flip(1)  # [N, L] G_t
    pi = token_probs.logprobs.double().exp()  # [N, L]
    energy = ((1 - 2 * pi + token_probs.sum_pi_squared.double()) * mask).cumsum(1)  # [N, L] W_t
    shape = (-1, group_size, length)
    weighted = (to_go * energy * mask).reshape(shape).sum(1)  # [B, L]
    total = (energy * mask).reshape(shape).sum(1) + 1e-8  # [B, L]
    baseline = (weighted / total).unsqueeze(1).expand(shape)  # [B, R, L]
    if group_size == 1:
        baseline = torch.zeros_like(baseline)
    elif config.otb_zero_tail:
        lengths = mask.sum(1).reshape(-1, group_size)  # [B, R]
        top_two = lengths.topk(2, dim=1).values  # [B, 2]
        longest = (lengths == top_two[:, :1]) & (top_two[:, :1] > top_two[:, 1:])  # [B, R]
        position = mask.cumsum(1).reshape(shape)  # [B, R, L] 1-based completion position
        tail = longest.unsqueeze(2) & (position > top_two[:, 1:].unsqueeze(2))  # [B, R, L]
        baseline = baseline.masked_fill(tail, 0.0)
    advantages = (to_go - baseline.reshape(rows, length)) * mask  # [N, L]
    return advantages.float(), None


def broadcast_to_tokens(
    advantages: torch.Tensor,  # [N]
    completion_mask: torch.Tensor,  # [N, L]
) -> torch.Tensor:  # [N, L]
    """Every completion token of rollout n gets A_n; prompt and padding get 0."""
    return advantages.unsqueeze(1) * completion_mask.to(advantages.dtype)


def advantage_range(
    advantages: torch.Tensor, completion_mask: torch.Tensor  # [N, L] each
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:  # low [N], high [N], has_tokens [N]
    """Smallest and largest advantage over each rollout's completion tokens."""
    in_completion = completion_mask > 0  # [N, L]
    high = torch.where(in_completion, advantages, -torch.inf).max(dim=1).values  # [N]
    low = torch.where(in_completion, advantages, torch.inf).min(dim=1).values  # [N]
    return low, high, in_completion.any(dim=1)


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
    in_completion = completion_mask > 0  # [N, L]
    num_steps = _process_steps(step_index, in_completion, group_size, baseline)  # K
    num_rows = step_rewards.shape[0]
    token_step = step_index.clamp(min=0)  # [N, L]
    rewards = torch.where(in_completion, step_rewards.double(), 0.0)  # [N, L]
    is_last_token, outcome = _outcome(rewards, in_completion, outcome_rewards)  # [N, L], [N] f_n

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


def _process_steps(step_index: torch.Tensor, in_completion: torch.Tensor, group_size: int,
                   baseline: str) -> int:
    """K, the number of steps of the longest rollout (step_index [N, L]); ValueError for an
    unknown baseline, a completion token without a step or rows that are not whole groups."""
    if baseline not in PROCESS_BASELINES:
        raise ValueError(f"process baseline must be one of {PROCESS_BASELINES}, got {baseline!r}")
    # one read: a completion token without a step, and the largest step index
    unindexed, last_step = torch.stack(
        [((step_index < 0) & in_completion).any().long(), step_index.max().clamp(min=0)]
    ).tolist()
    if unindexed:
        raise ValueError("every completion token needs a step index >= 0")
    num_rows = step_index.shape[0]
    if num_rows % group_size:
        raise ValueError(f"{num_rows} rollouts do not split into groups of {group_size}")
    return last_step + 1


def _outcome(rewards: torch.Tensor, in_completion: torch.Tensor,
             outcome_rewards: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """(True on each non-empty rollout's last completion token [N, L], the outcome f_n [N]):
    `outcome_rewards`, or the reward on that last token where it is None."""
    length = rewards.shape[1]
    has_completion = in_completion.any(dim=1, keepdim=True)  # [N, 1]
    last_column = length - 1 - in_completion.flip(1).int().argmax(dim=1, keepdim=True)  # [N, 1]
    is_last_token = torch.zeros_like(in_completion).scatter(1, last_column, has_completion)
    if outcome_rewards is None:
        return is_last_token, (rewards * is_last_token).sum(dim=1)
    return is_last_token, outcome_rewards.to(rewards).reshape(-1) * has_completion.squeeze(1)


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
