"""Closed-form rank of one group's gradient matrix from its reward composition alone.

Model: a group of R = m + M binary-outcome rollouts, m in the minority and M in the majority,
whose score vectors (per-rollout gradients of log-prob) are orthonormal. A zero-sum advantage
(r_i - mean r, with or without a std division) is proportional to M on every minority row and to
-m on every majority row, because the minority fraction is m/R. Orthonormal rows scaled by a_i
have singular values |a_i|, so up to a common scale the spectrum is

    sigma = (M repeated m times, m repeated M times).

From it (sum sigma = 2mM, sum sigma^2 = mMR, sum sigma^4 = mM(M^3 + m^3)):

    erank_entropy       = 2 sqrt(mM)                                (= R when m = M)
    erank_entropy_sq    = (mR/M)^(M/R) * (MR/m)^(m/R)
    stable_rank         = mR/M = m + m^2/M
    participation_ratio = mM R^2 / (M^3 + m^3)
    energy_rank(f)      = ceil(f mR/M)                  if f <= M/R (minority rows suffice)
                          m + ceil(M (fR - M) / m)      otherwise
    numerical_rank      = R (m if m/M <= rtol)

A zero-variance group (m = 0) has a zero matrix: every measure 0.

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

import math

import torch

from grpo_cli.probes.rank_measures import ENERGY_TOLERANCE, RANK_MEASURES


def _check(minority: int, majority: int) -> None:
    if minority < 0 or majority < minority:
        raise ValueError(f"need 0 <= minority <= majority, got {minority} and {majority}")


def composition_spectrum(minority: int, majority: int) -> torch.Tensor:  # [R] float64, descending
    """sigma = (M x m, m x M) for m = minority, M = majority (common scale dropped)."""
    _check(minority, majority)
    return torch.tensor(
        [float(majority)] * minority + [float(minority)] * majority, dtype=torch.float64
    )


def _energy_rank(minority: int, majority: int, fraction: float) -> float:
    """Fewest k whose sigma^2 reach `fraction` of the energy, with rank_measures' tolerance."""
    m, M, R = minority, majority, minority + majority
    target = fraction * (1.0 - ENERGY_TOLERANCE) * R  # the threshold in units of m M
    if target <= M:
        return float(math.ceil(target * m / M))
    return float(m + math.ceil(M * (target - M) / m))


def predicted_rank_measures(minority: int, majority: int, rtol: float = 1e-6) -> dict[str, float]:
    """The closed forms of the module docstring, keyed like `all_rank_measures`."""
    _check(minority, majority)
    if minority == 0:
        return {name: 0.0 for name in RANK_MEASURES}
    m, M = float(minority), float(majority)
    R = m + M
    return {
        "erank_entropy": 2.0 * math.sqrt(m * M),
        "erank_entropy_sq": math.exp((M / R) * math.log(m * R / M) + (m / R) * math.log(M * R / m)),
        "stable_rank": m * R / M,
        "participation_ratio": m * M * R**2 / (M**3 + m**3),
        "energy_rank_90": _energy_rank(minority, majority, 0.90),
        "energy_rank_99": _energy_rank(minority, majority, 0.99),
        "numerical_rank": R if m / M > rtol else m,
    }


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
