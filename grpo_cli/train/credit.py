"""Rewards and advantages for one batch of rollouts: the credit-assignment stage of a step.

The estimators and what each needs (a value head, step rewards) are registered in
grpo_cli/algorithm/advantages.py; this module turns a scored batch into their inputs.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from grpo_cli.algorithm.advantages import TokenProbs, get_estimator, outcome_on_last_token
from grpo_cli.algorithm.scored import ScoredBatch
from grpo_cli.rollout.batch import RolloutBatch

if TYPE_CHECKING:
    from grpo_cli.config.schema import AlgorithmConfig


def overlong_penalty(lengths: torch.Tensor, max_tokens: int, buffer: int, scale: float):
    """DAPO soft overlong punishment: 0 up to max-buffer, then linear down to -scale at max."""
    if scale <= 0 or buffer <= 0:
        return torch.zeros_like(lengths, dtype=torch.float32)
    excess = (lengths.float() - (max_tokens - buffer)).clamp(min=0)  # [N]
    return -scale * (excess / buffer).clamp(max=1.0)


def token_char_ends(tokenizer, token_ids: list[int]) -> list[int]:
    """Character offset at which each completion token's text ends (incremental decoding)."""
    return [
        len(tokenizer.decode(token_ids[: position + 1], skip_special_tokens=True))
        for position in range(len(token_ids))
    ]


def step_tensors(
    batch: RolloutBatch, step_checks: list[list], final_rewards: torch.Tensor, step_weight: float,
    tokenizer,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Place each checked step's reward on its last token; return (step_rewards, step_index).

    A correct step earns `step_weight`, a wrong one 0; the outcome reward lands on the last
    completion token. Tokens up to the end of step k have step index k; tokens after the last
    step form one more segment. The batch is read back once; the tensors are built on the host
    and copied to the device without a sync.
    """
    mask = batch.completion_mask  # [N, L]
    on_mask, token_ids = torch.stack([(mask != 0).long(), batch.input_ids]).tolist()  # [N, L] each
    width = mask.shape[1]
    step_rewards = [[0.0] * width for _ in on_mask]  # [N, L]
    step_index = [[-1] * width for _ in on_mask]  # [N, L]
    last = [[False] * width for _ in on_mask]  # [N, L] each row's last completion token
    for row, checks in enumerate(step_checks):
        columns = [column for column, flag in enumerate(on_mask[row]) if flag]
        if not columns:
            continue
        ends = token_char_ends(tokenizer, [token_ids[row][column] for column in columns])
        segment = 0
        check_iter = iter(sorted(checks, key=lambda check: check.end_char))
        current = next(check_iter, None)
        for column, end in zip(columns, ends, strict=True):
            step_index[row][column] = segment
            if current is not None and end >= current.end_char:
                step_rewards[row][column] = step_weight if current.correct else 0.0
                segment += 1
                current = next(check_iter, None)
        last[row][columns[-1]] = True

    def on_device(values, dtype):
        return torch.tensor(values, dtype=dtype).to(mask.device, non_blocking=True)

    final = torch.where(on_device(last, torch.bool), final_rewards[:, None], 0.0)  # [N, L]
    return (on_device(step_rewards, mask.dtype) + final.to(mask.dtype),
            on_device(step_index, batch.input_ids.dtype))


def token_advantages(
    algorithm_cfg: AlgorithmConfig,
    batch: RolloutBatch,
    scored: ScoredBatch,
    values: torch.Tensor | None = None,  # [N, L] value of the state before each token (needs_values)
    token_probs: TokenProbs | None = None,  # the policy's per-token probabilities (needs_token_probs)
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Advantages [N, L] of the configured estimator, and its value targets [N, L] (or None)."""
    estimator = get_estimator(algorithm_cfg.name)
    mask = batch.completion_mask  # [N, L]
    if estimator.needs_step_rewards and scored.step_rewards is None:
        raise ValueError(f"algorithm={estimator.name} needs step rewards from the task")
    token_rewards = (  # [N, L]
        scored.step_rewards
        if scored.step_rewards is not None
        else outcome_on_last_token(scored.rewards, mask)
    )
    return estimator.compute(
        token_rewards, mask, batch.group_size, algorithm_cfg,
        outcome_rewards=scored.rewards, values=values, step_index=scored.step_index,
        token_probs=token_probs,
    )

