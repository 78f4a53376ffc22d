"""Rank measures of a tensor spectrum: the probes' side of grpo_cli/measures.py.

The measures, their names and tolerances live in `grpo_cli.measures` (numpy, no torch); this
module hands it a tensor's singular values and computes those values from a Gram matrix.
"""

from __future__ import annotations

import torch

from grpo_cli import measures


def all_rank_measures(sigma: torch.Tensor, rtol: float = 1e-6) -> dict[str, float]:  # sigma [K]
    """Every measure of `measures.RANK_MEASURES` for the singular values `sigma`, as floats."""
    return measures.rank_measures(sigma.detach().reshape(-1).double().cpu().numpy(), rtol)


def singular_values_from_gram(gram: torch.Tensor) -> torch.Tensor:  # [..., n] float64, descending
    """Singular values of A from its Gram matrix G = A A^T [..., n, n]: sqrt(eig(G)), clamped at 0
    (a stack of Grams gives a stack of spectra, each as if alone).

    Eigenvalue round-off is about eps * sigma_1^2, so singular values below ~sqrt(eps) * sigma_1
    (1.5e-8 sigma_1 in float64) are noise; keep rank_rtol above that.
    """
    symmetric = gram.detach().double()
    symmetric = (symmetric + symmetric.mT) / 2  # [..., n, n]
    eigenvalues = torch.linalg.eigvalsh(symmetric)  # [..., n] ascending
    return eigenvalues.clamp(min=0.0).sqrt().flip(-1)
