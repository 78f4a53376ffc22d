"""A group's reward composition and distinct completions, read off tensors.

`group_composition` gives (minority m, majority M), the inputs of the closed-form rank
predictions in grpo_cli/measures.py (`predicted_rank_measures`, with the model they assume);
`count_distinct_rows` bounds a group's rank by its number of distinct completions, and
`distinct_per_group` counts them for every group at once on the device (metrics.csv
`distinct_completions`), `distinct_correct_per_group` those among its correct rollouts
(`distinct_correct`).

The model holds only for advantages of the form c (r_i - mean r), c > 0, with binary r
(`composition_applies`): grpo, dr_grpo and rloo without an overlong penalty. Not for reinforce
(its baseline is the batch mean, so a group's advantages need not sum to zero), nor for ppo or
process (per-token credit), nor when an overlong penalty makes the rewards non-binary.

Duplicate completions have identical score vectors, so orthonormality can hold at best between
distinct completions. With u = 1..U distinct completions, n_u copies each and advantage a_u, the
matrix's rows are n_u copies of a_u s_u; for orthonormal s_u its singular values are
sqrt(n_u) |a_u| (`distinct_spectrum`): the prediction recomputed over distinct completions.
"""

from __future__ import annotations

import torch


def group_composition(rewards: torch.Tensor) -> tuple[int, int]:  # rewards [R]
    """(minority, majority): sizes of the two sides of the group mean; (0, R) if all equal.

    For binary rewards these are the success and failure counts, smaller first. For other
    rewards it is the split by the sign of r_i - mean r, for which the prediction is approximate.
    """
    values = rewards.detach().reshape(-1).double()  # [R]
    size = values.numel()
    if size == 0 or bool((values == values[0]).all()):
        return 0, size
    above = int((values > values.mean()).sum())
    return min(above, size - above), max(above, size - above)


def composition_applies(
    advantages: torch.Tensor,  # [R] one advantage per rollout
    correct: torch.Tensor,  # [R] 1.0 where the answer is right, else 0.0
    rtol: float = 1e-4,
) -> bool:
    """Whether a group's advantages are c (correct_i - mean correct) with c > 0 (module docstring).

    `rtol` is relative to max |advantage| (advantages are float32).
    """
    a = advantages.detach().reshape(-1).double()  # [R]
    r = correct.detach().reshape(-1).double()  # [R]
    if not bool(((r == 0) | (r == 1)).all()):
        return False
    centered = r - r.mean()  # [R]
    scale = float(a.abs().max()) if a.numel() else 0.0
    if float(centered.abs().max()) == 0.0:  # all rewards equal: the model says a zero matrix
        return scale == 0.0
    c = float(a @ centered / (centered @ centered))
    return c > 0 and float((a - c * centered).abs().max()) <= rtol * scale


def distinct_rows(
    tokens: torch.Tensor,  # [R, L] completion token ids
    mask: torch.Tensor | None = None,  # [R, L] 1 on tokens that count
) -> torch.Tensor:  # [R] int64: index of each row's distinct completion (0..U-1)
    """Which rows are the same completion, comparing only the tokens under `mask`."""
    if tokens.shape[0] == 0:
        return torch.zeros(0, dtype=torch.long)
    keys = tokens
    if mask is not None:
        counted = mask > 0  # [R, L]
        keys = torch.cat([torch.where(counted, tokens, 0), counted.long()], dim=1)  # [R, 2L]
    return torch.unique(keys, dim=0, return_inverse=True)[1]


def distinct_spectrum(
    advantages: torch.Tensor,  # [R] one advantage per rollout
    inverse: torch.Tensor,  # [R] distinct-completion index of each row (distinct_rows)
) -> torch.Tensor:  # [U] float64, descending
    """sqrt(n_u) |a_u| per distinct completion u: the spectrum if distinct scores were orthonormal.

    >>> distinct_spectrum(torch.tensor([3.0, -1, -1, -1]), torch.tensor([0, 1, 1, 2])).tolist()
    [3.0, 1.4142135623730951, 1.0]
    """
    inverse = inverse.to(advantages.device)
    count = torch.bincount(inverse).double()  # [U]
    value = torch.zeros_like(count).scatter_(0, inverse, advantages.detach().double().abs())
    return (count.sqrt() * value).sort(descending=True).values


def count_distinct_rows(
    tokens: torch.Tensor,  # [R, L] completion token ids
    mask: torch.Tensor | None = None,  # [R, L] 1 on tokens that count
) -> int:
    """Number of distinct rows, comparing only the tokens under `mask` (all tokens if None).

    Identical completions have identical score vectors, so they bound the rank of a group's matrix.
    """
    if tokens.shape[0] == 0:
        return 0
    if mask is None:
        return int(torch.unique(tokens, dim=0).shape[0])
    counted = mask > 0  # [R, L]
    keys = torch.cat([torch.where(counted, tokens, 0), counted.long()], dim=1)  # [R, 2L]
    return int(torch.unique(keys, dim=0).shape[0])


def distinct_per_group(
    tokens: torch.Tensor,  # [N, L] token ids, N = B * R
    mask: torch.Tensor,  # [N, L] 1 on tokens that count
    group_size: int,
) -> torch.Tensor:  # [B] int64
    """Distinct completions in each group (`count_distinct_rows` per group), without a host read:
    row i is new when no earlier row j < i of its group has the same tokens under the same mask.

    >>> t = torch.tensor([[5, 1], [5, 1], [5, 2], [7, 7], [7, 8], [7, 9]])
    >>> distinct_per_group(t, torch.tensor([[1, 1]] * 3 + [[1, 0]] * 3), 3).tolist()
    [2, 1]
    """
    return (~_repeats_earlier(tokens, mask, group_size).any(dim=-1)).sum(dim=-1)  # [B]


def _repeats_earlier(tokens: torch.Tensor, mask: torch.Tensor, group_size: int) -> torch.Tensor:
    """[B, R, R] bool: [b, i, j] when j < i and rows i and j of group b have the same tokens
    under the same mask."""
    keys = torch.where(mask > 0, tokens, -1).reshape(-1, group_size, tokens.shape[-1])  # [B, R, L]
    same = (keys.unsqueeze(2) == keys.unsqueeze(1)).all(dim=-1)  # [B, R, R]
    earlier = torch.ones(group_size, group_size, dtype=torch.bool, device=tokens.device).tril(-1)
    return same & earlier


def distinct_correct_per_group(
    tokens: torch.Tensor,  # [N, L] token ids, N = B * R
    mask: torch.Tensor,  # [N, L] 1 on tokens that count
    correct: torch.Tensor,  # [N] 1.0 where the final answer is right, else 0.0
    group_size: int,
) -> torch.Tensor:  # [B] int64
    """Distinct completions among each group's correct rollouts (G2RPO's correct modes), without a
    host read: a correct row is new when no earlier correct row of its group has its tokens.

    >>> t = torch.tensor([[5, 1], [5, 1], [5, 2], [7, 7], [7, 8], [7, 9]])
    >>> distinct_correct_per_group(t, torch.ones(6, 2), torch.tensor([1.0, 1, 0, 0, 0, 0]), 3).tolist()
    [1, 0]
    """
    right = (correct > 0).reshape(-1, group_size)  # [B, R]
    repeated = (_repeats_earlier(tokens, mask, group_size) & right.unsqueeze(1)).any(dim=-1)  # [B, R]
    return (right & ~repeated).sum(dim=-1)


def informative_distinct_mean(tokens: torch.Tensor, mask: torch.Tensor, rewards: torch.Tensor,
                              group_size: int) -> torch.Tensor:  # 0-d float64
    """metrics.csv's `distinct_completions`: mean distinct completions per informative group (one
    whose rewards differ), NaN when no group is informative; on the device, no host read."""
    groups = rewards.reshape(-1, group_size)  # [B, R]
    informative = ((groups.max(dim=1).values - groups.min(dim=1).values).abs() >= 1e-12).double()  # [B]
    return (distinct_per_group(tokens, mask, group_size).double() * informative).sum() / informative.sum()


def correct_distinct_mean(tokens: torch.Tensor, mask: torch.Tensor, correct: torch.Tensor,
                          group_size: int) -> torch.Tensor:  # 0-d float64
    """metrics.csv's `distinct_correct`: mean distinct correct completions per group with a
    correct rollout (`distinct_correct_per_group`), NaN when no rollout is correct; on the device."""
    counts = distinct_correct_per_group(tokens, mask, correct, group_size).double()  # [B]
    solved = (correct.reshape(-1, group_size) > 0).any(dim=1).double()  # [B]
    return counts.sum() / solved.sum()
