"""Power-law decay of a singular-value spectrum: sigma_k ~ C k^(-alpha)."""

from __future__ import annotations

import math

import numpy as np
import torch


def fit_power_law(
    sigma: torch.Tensor,  # [K] singular values, any order
    k_min: int = 1,
    k_max: int | None = None,
    rtol: float = 0.0,
) -> tuple[float, float]:
    """(alpha, r2) of the least-squares line log sigma_k = c - alpha log k.

    k is the 1-based rank of sigma_k in descending order; only values above rtol * sigma_1
    (rtol = 0: every non-zero one) with k_min <= k <= k_max (None: the last of those) are fitted.
    The probes pass `probes.rank_rtol`, the numerical rank's cut. Below it a rank-deficient
    matrix has only round-off (~1e-16 sigma_1 from svdvals, ~1e-8 from the Gram route of
    `probes.layer_spectrum=gram`), and a line through those values measures the cliff down to
    the round-off, not the spectrum's decay: on the CPU preset the layer-0 k_proj gradient
    (numerical rank ~46 of 64: its inputs are a few dozen characters) read alpha 6.6 (r2 0.62)
    fitted over every non-zero value and 1.9 (r2 0.84) above the cut; and the two routes'
    alphas, up to 20% apart before, agree to ~1e-7. r2 is the coefficient of determination in
    log-log space (1.0 for a perfectly flat spectrum). Fewer than 3 points give (nan, nan).
    """
    # numpy: a layer's spectrum is short, and torch's per-op overhead dominated the fit
    s = np.sort(sigma.detach().reshape(-1).double().cpu().numpy())[::-1]  # [K] descending
    s = s[s > max(rtol * s[0] if s.size else 0.0, 0.0)]  # above the cut, and non-zero
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
