"""Power-law decay of a singular-value spectrum: sigma_k ~ C k^(-alpha)."""

from __future__ import annotations

import math

import numpy as np
import torch


def fit_power_law(
    sigma: torch.Tensor,  # [K] singular values, any order
    k_min: int = 1,
    k_max: int | None = None,
) -> tuple[float, float]:
    """(alpha, r2) of the least-squares line log sigma_k = c - alpha log k.

    k is the 1-based rank of sigma_k in descending order; only non-zero values with
    k_min <= k <= k_max (None: the last non-zero one) are fitted. r2 is the coefficient of
    determination in log-log space (1.0 for a perfectly flat spectrum). Fewer than 3 points give
    (nan, nan).
    """
    # numpy: a layer's spectrum is short, and torch's per-op overhead dominated the fit
    s = np.sort(sigma.detach().reshape(-1).double().cpu().numpy())[::-1]  # [K] descending
    s = s[s > 0]
    ranks = np.arange(1, s.size + 1, dtype=np.float64)  # [K'] 1-based
    keep = ranks >= k_min
    if k_max is not None:
        keep &= ranks <= k_max
    if int(keep.sum()) < 3:
        return math.nan, math.nan
    x, y = np.log(ranks[keep]), np.log(s[keep])  # [K'']
    x_centered, y_centered = x - x.mean(), y - y.mean()
    slope = (x_centered * y_centered).sum() / (x_centered**2).sum()
    residual = ((y_centered - slope * x_centered) ** 2).sum()
    total = (y_centered**2).sum()
    r2 = 1.0 if total <= 0 else float(1.0 - residual / total)
    return float(-slope), r2
