"""Rank measures of a tensor spectrum: the probes' side of grpo_cli/measures.py.

The measures, their names and tolerances live in `grpo_cli.measures` (numpy, no torch); this
module hands it a tensor's singular values and computes those values, from a Gram matrix or of a
matrix (`singular_values`).
"""

from __future__ import annotations

import torch

from grpo_cli import measures

SPECTRUM_METHODS = ("svd", "gram")  # probes.layer_spectrum: how `singular_values` computes


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


def singular_values(matrix: torch.Tensor, method: str = "svd") -> torch.Tensor:  # [min(m, n)] float64
    """Singular values of a 2-D matrix [m, n] in float64, descending, on its device
    (`probes.layer_spectrum`).

    `svd`: `torch.linalg.svdvals`, exact to round-off (~1e-16 sigma_1). `gram`: sqrt(eig) of the
    smaller Gram, A A^T or A^T A (`singular_values_from_gram`): one matrix product and a symmetric
    eigensolver, 3-10x faster at the paper preset's shapes on a CPU (scripts/bench_layer_spectra.py),
    and on CUDA it avoids cuSOLVER's Jacobi SVD, slow for matrices of a thousand columns and more.
    Its values below ~1.5e-8 sigma_1 are round-off: the rank measures agree with `svd`'s to ~1e-6
    or better on the CPU preset's gradients, and `powerlaw_alpha` (fitted above `rank_rtol`
    sigma_1, probes/powerlaw.py) to ~1e-7; fitted over every non-zero value it differed by up to
    20% on the CPU preset's lm_head gradients, whose spectrum runs below that floor.
    """
    if matrix.ndim != 2:
        raise ValueError(f"singular_values needs a 2-D matrix, got shape {tuple(matrix.shape)}")
    if method not in SPECTRUM_METHODS:
        raise ValueError(f"unknown spectrum method {method!r}; one of {', '.join(SPECTRUM_METHODS)}")
    values = matrix.detach().double()
    if method == "svd":
        return torch.linalg.svdvals(values)
    gram = values @ values.mT if values.shape[0] <= values.shape[1] else values.mT @ values
    return singular_values_from_gram(gram)
