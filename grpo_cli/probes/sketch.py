"""Kronecker sketch of a matrix parameter's per-rollout gradients: Z_i = U^T G_i V.

U [a, k1] and V [b, k2] are i.i.d. N(0, 1/k1), N(0, 1/k2), drawn on the CPU from a generator
seeded by (seed, parameter name, side) only, so every row chunk and every coefficient set of one
probe sees the same projections and Z Z^T is one unbiased estimate of K. The error bound and
measured errors are in `gram.py`'s docstring.
"""

from __future__ import annotations

import math
import zlib

import torch

Projections = tuple[torch.Tensor | None, torch.Tensor | None, int, int]  # (U, V, k1, k2)


def sketch_mse_bound(trace: float, rows: int, k1: int, cols: int, k2: int) -> float:
    """Bound on E||K_hat - K||_F^2 for one parameter's Kronecker sketch (`gram.py` docstring)."""
    v = 2 / k2 if k2 < cols else 0.0
    u = (2 / k1) * (1 + v) if k1 < rows else 0.0
    return trace**2 * (u + v)


def sketch_widths(rows: int, cols: int, sketch_dim: int) -> tuple[int, int]:
    """(k1, k2) with k1 k2 <= sketch_dim, balanced; a side that fits is left unprojected."""
    if rows * cols <= sketch_dim:
        return rows, cols
    s = math.isqrt(sketch_dim)
    if rows <= s:
        return rows, sketch_dim // rows
    if cols <= s:
        return sketch_dim // cols, cols
    return s, s


def _gaussian(shape: tuple[int, int], name: str, seed: int, salt: int, device) -> torch.Tensor:
    gen = torch.Generator().manual_seed(
        (seed * 1_000_003 + zlib.crc32(name.encode()) * 7 + salt) % 2**63
    )
    return (torch.randn(shape, generator=gen, dtype=torch.float64) / math.sqrt(shape[1])).to(device)


def sketch_projections(name: str, rows: int, cols: int, sketch_dim: int, seed: int, device):
    """(U [a, k1] or None, V [b, k2] or None, k1, k2): None is the identity on that side."""
    k1, k2 = sketch_widths(rows, cols, sketch_dim)
    u = _gaussian((rows, k1), name, seed, 1, device) if k1 < rows else None
    v = _gaussian((cols, k2), name, seed, 2, device) if k2 < cols else None
    return u, v, k1, k2


def project_gradient(
    grad: torch.Tensor,  # [a, b] any float dtype
    u: torch.Tensor | None,  # [a, k1]
    v: torch.Tensor | None,  # [b, k2]
    chunk_elems: int,
) -> torch.Tensor:  # [k1, k2] float64
    """U^T grad V in float64, converting `chunk_elems` elements of grad at a time.

    An lm_head gradient at 256k vocab is 0.8e9 elements: one float64 copy would be 6 GiB.
    """
    a, b = grad.shape
    step = max(1, chunk_elems // max(b, 1))
    slabs = []  # each [slab, k2]
    for r0 in range(0, a, step):
        slab = grad[r0 : r0 + step].double()
        slabs.append(slab if v is None else slab @ v)
    right = torch.cat(slabs)  # [a, k2]
    return right if u is None else u.T @ right
