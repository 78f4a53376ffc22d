"""Sparsity of a gradient: thresholded zero fraction and Hoyer's measure; of an update: the
entries that changed at all.

Conventions: a tensor with no non-zero entry (all zeros, or empty) is fully sparse, 1.0 for both
measures. `combined_sparsity` measures a list of tensors as their concatenation without building it.
`changed_entries` counts exact changes (no threshold): the notion of "parameters updated" in
Mukherjee et al. 2025 (arXiv 2505.11711) and of the bf16-rounding account (arXiv 2511.08567).
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import torch

from grpo_cli.runtime.sharded import whole


def gradient_sparsity(g: torch.Tensor, rtol: float = 1e-3) -> float:
    """Fraction of entries with |g| < rtol * max|g|; 1.0 when g has no non-zero entry."""
    magnitude = g.detach().abs().reshape(-1)  # [n]
    if magnitude.numel() == 0 or magnitude.max() == 0:
        return 1.0
    return float((magnitude < rtol * magnitude.max()).double().mean())


def hoyer_from_norms(l1: float, l2: float, size: int) -> float:
    """(sqrt(n) - L1/L2) / (sqrt(n) - 1) (Hoyer 2004); 1.0 if L2 = 0, 0.0 if n = 1."""
    if l2 <= 0:
        return 1.0
    if size <= 1:
        return 0.0
    root = math.sqrt(size)
    return min(max((root - l1 / l2) / (root - 1.0), 0.0), 1.0)


def hoyer_sparsity(g: torch.Tensor) -> float:
    """Hoyer's measure in [0, 1]: 1 for one non-zero entry, 0 for equal magnitudes everywhere."""
    values = g.detach().reshape(-1).double()  # [n]
    return hoyer_from_norms(float(values.abs().sum()), float(values.norm()), values.numel())


def combined_sparsity(tensors: Iterable[torch.Tensor], rtol: float = 1e-3) -> dict[str, float]:
    """{"sparsity", "hoyer"} of the concatenation of `tensors` (e.g. every parameter's gradient).

    Two passes over the tensors, one float64 copy of a single tensor at a time, and one host read
    (the sums stay on the device until the end: it runs on every training step). FSDP2's DTensor
    gradients are measured whole: their max and sums are reduced over the processes (a
    collective: every process calls it), never flattened (an uneven shard cannot be).
    """
    tensors = [t.detach() for t in tensors if t.numel()]
    if not tensors:
        return {"sparsity": 1.0, "hoyer": 1.0}
    peak = torch.stack([t.abs().max().double() for t in tensors]).max()  # 0-dim, on the device
    below, l1, squares, size = 0, 0, 0, 0
    for tensor in tensors:
        values = tensor.double().abs()  # the tensor's shape, n_i entries
        size += values.numel()
        below = below + (values < rtol * peak).sum()
        l1 = l1 + values.sum()
        squares = squares + values.square().sum()
    sums = whole(torch.stack([below.double(), l1, squares]))  # [3]
    peak, below, l1, squares = torch.cat([whole(peak).reshape(1), sums]).tolist()
    return {
        "sparsity": 1.0 if peak == 0 else below / size,
        "hoyer": hoyer_from_norms(l1, math.sqrt(squares), size),
    }


def changed_entries(current: torch.Tensor, initial: torch.Tensor, dtype: torch.dtype | None = None) -> int:
    """How many entries of `current` differ from `initial` (same shape), both cast to `dtype`
    first (default: `current`'s dtype). Casting to bfloat16 rounds to nearest, as a bf16 copy
    of an fp32 master is made: an entry whose change is below half its bf16 spacing counts as
    unchanged.

    >>> changed_entries(torch.tensor([1.0, 1.0 + 2**-10, 3.0]), torch.ones(3))
    2
    >>> changed_entries(torch.tensor([1.0, 1.0 + 2**-10, 3.0]), torch.ones(3), torch.bfloat16)
    1
    """
    return int(changed_count(current, initial, dtype))


def changed_count(current: torch.Tensor, initial: torch.Tensor, dtype: torch.dtype | None = None) -> torch.Tensor:
    """`changed_entries` as a 0-d int64 tensor on `current`'s device (no host read)."""
    if current.shape != initial.shape:
        raise ValueError(f"shapes differ: {tuple(current.shape)} and {tuple(initial.shape)}")
    dtype = dtype or current.dtype
    initial = initial.to(current.device)
    return (current.detach().to(dtype) != initial.to(dtype)).sum()
