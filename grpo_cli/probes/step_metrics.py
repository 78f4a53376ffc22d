"""metrics.csv's values for one training step, whoever trained it: grpo-cli's loop
(grpo_cli/train/trainer.py) and the TRL callback (grpo_cli/integrations/trl_spectra.py) both
build their row here, so a column means the same for both and is added in one place.

`read_batch` reduces the scored batch on its device and reads it back once (`BatchReadings`);
`step_metrics` joins those readings with the update's (`LossTotals`, the gradient norm) into the
row's values, which `grpo_cli.results.rows.metrics_row` puts in column order. What a trainer does
not measure is NaN: TRL gives no sampler log-probs, KL or value loss, and no problem ids.

What only the update holds comes in as device tensors read with the batch: each trainer sums
`entropy_sign_sums` over its micro-batches' training forwards (token entropy by the advantage's
sign) and takes `head_gradient_squares` (grpo_cli/probes/head_share.py) before clipping.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from grpo_cli.algorithm.loss import token_weight_readings
from grpo_cli.algorithm.scored import (
    ScoredBatch,
    credit_uniform_share,
    expected_zero_variance_fraction,
    group_outcome_shares,
    zero_variance_groups,
)
from grpo_cli.probes.composition import correct_distinct_mean, informative_distinct_mean
from grpo_cli.probes.head_share import head_shares
from grpo_cli.probes.step_change import STEP_CHANGED_COLUMNS
from grpo_cli.rollout.batch import RolloutBatch


@dataclass(frozen=True)
class LossTotals:
    """The update's logged loss terms over the batch (grpo-cli: its first pass); NaN for a
    term the loss does not have."""

    loss: float  # the loss the backward differentiated, summed over micro-batches
    pg_loss: float  # ... its policy-gradient (PPO-clip surrogate) part
    kl: float  # k3 KL to the reference per completion token (NaN: no KL term)
    value_loss: float  # the value head's loss (NaN: no value head)
    entropy: float  # mean token entropy per completion token
    clip_frac: float  # share of completion tokens whose ratio was clipped


@dataclass(frozen=True)
class BatchReadings:
    """What metrics.csv reads off one scored batch (`read_batch`), as host numbers."""

    group_size: int
    accuracy: float  # share of rollouts whose final answer is right
    reward_mean: float  # over rollouts with a reward (TRL: a reward function may give none)
    reward_std: float  # population std, a missing reward counted as 0
    zero_variance_frac: float  # share of groups whose rewards are all equal
    completion_len_mean: float  # loss tokens per rollout
    completion_len_max: int
    tokens: int  # loss tokens in the batch
    logprob_diff_mean: float  # |sampler - policy| log-prob over completion tokens (NaN: not measured)
    logprob_diff_max: float
    credit_uniform_frac: float  # rollouts whose tokens all got the same advantage
    groups_all_wrong: float  # share of groups whose rollouts are all wrong
    groups_all_right: float  # ... all right
    groups_mixed: float  # ... some right, some wrong
    distinct_completions: float  # mean distinct completions per informative group (NaN: none)
    token_weight_uniform_frac: float  # informative rollouts with uniform d loss / d log pi(y_t)
    token_weight_spread: float  # ... their mean relative spread (NaN: no informative rollout)
    distinct_correct: float  # mean distinct correct completions per group with one (NaN: none correct)
    entropy_adv_positive: float  # mean token entropy over tokens with advantage > 0 (NaN: none)
    entropy_adv_negative: float  # ... < 0
    entropy_adv_zero: float  # ... == 0
    head_squares: tuple[float, float, float]  # head_gradient_squares (NaN: not measured)
    step_changed: tuple[float, float, float]  # STEP_CHANGED_COLUMNS (NaN: not measured)
    correct: tuple[float, ...]  # [N] each rollout's `correct`, in batch order (groups contiguous)


def read_batch(
    batch: RolloutBatch,
    scored: ScoredBatch,  # rewards [N] NaN where no reward was given (TRL: every function gave None)
    advantages: torch.Tensor,  # [N, L]
    token_weight_counts: torch.Tensor,  # [3] `uniform_weight_rollouts`, summed over the passes
    logprob_gap: torch.Tensor | None = None,  # [T] |sampler - policy| log-prob per completion token
    entropy_sums: torch.Tensor | None = None,  # [6] `entropy_sign_sums`, summed over the forwards
    head_squares: torch.Tensor | None = None,  # [3] `head_gradient_squares`
    step_changed: torch.Tensor | None = None,  # [3] `StepChange.after` (probes/step_change.py)
) -> BatchReadings:
    """The batch's readings, every one reduced on the device, then one host read (NaN for the
    entropy split and head squares not given)."""
    group_size, mask = batch.group_size, batch.completion_mask  # mask [N, L]
    rewards = scored.rewards  # [N]
    scored_only = rewards.nan_to_num(0.0)  # a missing reward counts as 0 in spreads and groups
    lengths = batch.completion_lengths()  # [N]
    gap = mask.new_full((1,), math.nan) if logprob_gap is None else logprob_gap  # [T]
    entropy_sums = mask.new_zeros(6, dtype=torch.float64) if entropy_sums is None else entropy_sums.double()
    head_squares = mask.new_full((3,), math.nan) if head_squares is None else head_squares
    step_changed = mask.new_full((3,), math.nan) if step_changed is None else step_changed.to(mask.device)
    values = {
        "accuracy": scored.correct.mean(),
        # nanmean only where a reward is missing: grpo-cli's rollouts always have one, and on
        # CUDA mean and nanmean can differ in the last bit
        "reward_mean": torch.where(rewards.isnan().any(), rewards.nanmean(), rewards.mean()),
        "reward_std": scored_only.std(correction=0),
        "zero_variance_frac": zero_variance_groups(scored_only, group_size).float().mean(),
        "completion_len_mean": lengths.float().mean(),
        "completion_len_max": lengths.max(),
        "tokens": lengths.sum(),
        "logprob_diff_mean": gap.mean(),
        "logprob_diff_max": gap.max(),
        "credit_uniform_frac": credit_uniform_share(advantages, mask),
        **dict(zip(("groups_all_wrong", "groups_all_right", "groups_mixed"),
                   group_outcome_shares(scored.correct, group_size), strict=True)),
        "distinct_completions": informative_distinct_mean(batch.input_ids, mask, scored_only, group_size),
        "distinct_correct": correct_distinct_mean(batch.input_ids, mask, scored.correct, group_size),
        **dict(zip(ENTROPY_SIGN_COLUMNS, entropy_sums[:3] / entropy_sums[3:], strict=True)),  # 0 / 0: NaN
        **{f"head_square_{k}": value for k, value in enumerate(head_squares)},
        **dict(zip(STEP_CHANGED_COLUMNS, step_changed, strict=True)),
        **dict(zip(("token_weight_uniform_frac", "token_weight_spread"),
                   token_weight_readings(token_weight_counts), strict=True)),
    }
    read = torch.cat([torch.stack([value.double() for value in values.values()]),
                      scored.correct.double()]).tolist()  # the one host read
    named = dict(zip(values, read[: len(values)], strict=True))
    for count in ("completion_len_max", "tokens"):
        named[count] = int(named[count])
    named["head_squares"] = tuple(named.pop(f"head_square_{k}") for k in range(3))
    named["step_changed"] = tuple(named.pop(column) for column in STEP_CHANGED_COLUMNS)
    return BatchReadings(group_size=group_size, correct=tuple(read[len(values):]), **named)


ENTROPY_SIGN_COLUMNS = ("entropy_adv_positive", "entropy_adv_negative", "entropy_adv_zero")


def entropy_sign_sums(
    entropy: torch.Tensor,  # [n, L] each token's entropy under the policy (nats)
    advantages: torch.Tensor,  # [n, L] each token's advantage
    mask: torch.Tensor,  # [n, L] 1 on the tokens the loss counts
) -> torch.Tensor:  # [6] float64
    """(sum of H over tokens with A > 0, A < 0, A = 0, then their token counts), over `mask`:
    EAPO's (arXiv 2604.11056) polarity split of the token entropy; sums over micro-batches and
    processes add up, and metrics.csv's ENTROPY_SIGN_COLUMNS are the sums over the counts.

    >>> entropy_sign_sums(torch.tensor([[1.0, 2.0, 4.0]]), torch.tensor([[0.5, -1.0, 0.0]]),
    ...                   torch.tensor([[1.0, 1.0, 0.0]])).tolist()
    [1.0, 2.0, 0.0, 1.0, 1.0, 0.0]
    """
    counted = mask > 0  # [n, L]
    signs = (advantages > 0, advantages < 0, advantages == 0)
    kept = [(sign & counted).double() for sign in signs]  # each [n, L]
    values = entropy.detach().double()
    return torch.stack([(values * k).sum() for k in kept] + [k.sum() for k in kept])


def step_metrics(step: int, readings: BatchReadings, losses: LossTotals, grad_norm: float, *,
                 groups_dropped: int = 0, expected_zero_variance_frac: float = math.nan) -> dict:
    """The step's metrics.csv values, every column but the probes' (pass them to `metrics_row`).
    `grad_norm`: the gradient's norm before clipping; `groups_dropped`: zero-variance groups
    dynamic sampling dropped; `expected_zero_variance_frac`: the mean over the batch's problems
    of p^R + (1 - p)^R, p each problem's success rate so far (NaN: problems not known)."""
    return {
        "step": step,
        "reward_mean": readings.reward_mean,
        "reward_std": readings.reward_std,
        "accuracy_train": readings.accuracy,
        "zero_variance_frac": readings.zero_variance_frac,
        "expected_zero_variance_frac": expected_zero_variance_frac,
        # a lower bound when difficulty varies (grpo_cli/train/problem_success.py)
        "expected_zero_variance_frac_batch": expected_zero_variance_fraction(
            readings.accuracy, readings.group_size),
        "loss": losses.loss,
        "pg_loss": losses.pg_loss,
        "kl": losses.kl,
        "value_loss": losses.value_loss,
        "entropy": losses.entropy,
        "clip_frac": losses.clip_frac,
        "grad_norm": grad_norm,
        "completion_len_mean": readings.completion_len_mean,
        "completion_len_max": readings.completion_len_max,
        "tokens": readings.tokens,
        "logprob_diff_mean": readings.logprob_diff_mean,
        "logprob_diff_max": readings.logprob_diff_max,
        "groups_dropped": groups_dropped,
        "credit_uniform_frac": readings.credit_uniform_frac,
        "groups_all_wrong": readings.groups_all_wrong,
        "groups_all_right": readings.groups_all_right,
        "groups_mixed": readings.groups_mixed,
        "distinct_completions": readings.distinct_completions,
        "token_weight_uniform_frac": readings.token_weight_uniform_frac,
        "token_weight_spread": readings.token_weight_spread,
        **head_shares(readings.head_squares, grad_norm),  # of grad_norm^2: NaN at a zero gradient
        "distinct_correct": readings.distinct_correct,
        **{column: getattr(readings, column) for column in ENTROPY_SIGN_COLUMNS},
        **dict(zip(STEP_CHANGED_COLUMNS, readings.step_changed, strict=True)),  # NaN: not measured
    }
