"""Effective-rank measures of a matrix, from its singular values.

Every function takes sigma, a 1-D tensor of singular values in any order (negatives from
round-off are clamped to 0), and works in float64. A zero or empty spectrum gives 0 for every
measure, never NaN. The column names of `ranks.csv` are the keys of `all_rank_measures`.
"""

from __future__ import annotations

import torch

RANK_MEASURES = (
    "erank_entropy",
    "erank_entropy_sq",
    "stable_rank",
    "participation_ratio",
    "energy_rank_90",
    "energy_rank_99",
    "numerical_rank",
)

# relative slack on the energy threshold: round-off must not push 40% of [0.7] * 5 to k=3
ENERGY_TOLERANCE = 1e-12


def _spectrum(sigma: torch.Tensor) -> torch.Tensor:  # [K] float64, descending, >= 0
    return sigma.detach().reshape(-1).double().clamp(min=0.0).sort(descending=True).values


def _entropy_rank(weights: torch.Tensor) -> float:
    """exp(H(p)) with p = weights / sum(weights); 0 for zero weights."""
    total = weights.sum()
    if total <= 0:
        return 0.0
    p = weights[weights > 0] / total
    return float(torch.exp(-(p * p.log()).sum()))


def erank_entropy(sigma: torch.Tensor) -> float:
    """exp(H(p)), p_k = sigma_k / sum sigma (Roy & Vetterli 2007)."""
    return _entropy_rank(_spectrum(sigma))


def erank_entropy_sq(sigma: torch.Tensor) -> float:
    """exp(H(p)), p_k = sigma_k^2 / sum sigma^2 (entropy of the energy distribution)."""
    return _entropy_rank(_spectrum(sigma) ** 2)


def stable_rank(sigma: torch.Tensor) -> float:
    """sum sigma^2 / sigma_1^2 = ||A||_F^2 / ||A||_2^2."""
    s = _spectrum(sigma)
    if s.numel() == 0 or s[0] <= 0:
        return 0.0
    return float((s**2).sum() / s[0] ** 2)


def participation_ratio(sigma: torch.Tensor) -> float:
    """(sum sigma^2)^2 / sum sigma^4."""
    energy = _spectrum(sigma) ** 2
    fourth = (energy**2).sum()
    if fourth <= 0:
        return 0.0
    return float(energy.sum() ** 2 / fourth)


def energy_rank(sigma: torch.Tensor, fraction: float) -> int:
    """Fewest k with sum_{j<=k} sigma_j^2 >= fraction * sum sigma^2 (descending sigma)."""
    energy = _spectrum(sigma) ** 2
    total = energy.sum()
    if total <= 0:
        return 0
    threshold = fraction * total * (1.0 - ENERGY_TOLERANCE)
    reached = energy.cumsum(0) >= threshold  # [K]
    return int(reached.int().argmax()) + 1


def numerical_rank(sigma: torch.Tensor, rtol: float = 1e-6) -> int:
    """Count of sigma_k > rtol * sigma_1."""
    s = _spectrum(sigma)
    if s.numel() == 0:
        return 0
    return int((s > rtol * s[0]).sum())


def all_rank_measures(sigma: torch.Tensor, rtol: float = 1e-6) -> dict[str, float]:
    """Every measure of `RANK_MEASURES`, as floats, in that order."""
    return {
        "erank_entropy": erank_entropy(sigma),
        "erank_entropy_sq": erank_entropy_sq(sigma),
        "stable_rank": stable_rank(sigma),
        "participation_ratio": participation_ratio(sigma),
        "energy_rank_90": float(energy_rank(sigma, 0.90)),
        "energy_rank_99": float(energy_rank(sigma, 0.99)),
        "numerical_rank": float(numerical_rank(sigma, rtol)),
    }


def singular_values_from_gram(gram: torch.Tensor) -> torch.Tensor:  # [n] float64, descending
    """Singular values of A from its Gram matrix G = A A^T [n, n]: sqrt(eig(G)), clamped at 0.

    Eigenvalue round-off is about eps * sigma_1^2, so singular values below ~sqrt(eps) * sigma_1
    (1.5e-8 sigma_1 in float64) are noise; keep rank_rtol above that.
    """
    symmetric = gram.detach().double()
    symmetric = (symmetric + symmetric.T) / 2  # [n, n]
    eigenvalues = torch.linalg.eigvalsh(symmetric)  # [n] ascending
    return eigenvalues.clamp(min=0.0).sqrt().flip(0)
