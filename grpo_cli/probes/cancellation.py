"""How much the per-rollout gradients cancel when summed, read off their Gram matrix.

With rows g_1..g_n and Gram G = [g_i . g_j] [n, n],

    coherence = ||sum_i g_i||^2 / (n sum_i ||g_i||^2) = 1^T G 1 / (n tr G)

is 1 when the rows are equal (aligned: nothing cancels), 1/n when they are orthogonal and 0 when
they sum to zero (full cancellation); 0 <= coherence <= 1 by Cauchy-Schwarz. Dividing by n
puts groups of every size on one scale; n * coherence is the plain ratio ||sum g||^2 /
sum ||g||^2 (1 for orthogonal rows). The closed form for a group's composition is
`grpo_cli.measures.predicted_coherence` (SALT, arXiv 2606.05800, argues this cancellation
grows with R).
"""

from __future__ import annotations

import math

import torch


def coherence(gram: torch.Tensor) -> float:  # gram [n, n]
    """1^T G 1 / (n tr G); NaN when every row is zero (tr G = 0) or n = 0."""
    gram = gram.detach().double()
    size = gram.shape[0]
    trace = float(gram.diagonal().sum())
    if size == 0 or trace <= 0:
        return math.nan
    return float(gram.sum()) / (size * trace)


def mean_cosine(gram: torch.Tensor) -> float:  # gram [n, n]
    """Mean signed cosine between distinct non-zero rows (NaN when fewer than two)."""
    gram = gram.detach().double()
    norms = gram.diagonal().clamp(min=0).sqrt()  # [n]
    keep = norms > 0
    count = int(keep.sum())
    if count < 2:
        return math.nan
    cosines = gram[keep][:, keep] / torch.outer(norms[keep], norms[keep])  # [k, k]
    return float((cosines.sum() - cosines.diagonal().sum()) / (count * (count - 1)))
