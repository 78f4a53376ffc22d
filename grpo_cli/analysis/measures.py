"""Rank measures on singular values, in numpy (the analysis layer never imports torch).

Same definitions as `ranks.csv` (docs/results.md, "Rank measures"); used here to recompute a
measure from spectra and to draw the closed-form group-composition curves: a group of R binary
rewards with m minority and M = R - m majority outcomes has singular values M (m times) and
m (M times), so e.g. exp-entropy rank = 2 sqrt(m M), which is 2 only when m = M = 1.
"""

from __future__ import annotations

import numpy as np

from grpo_cli.probes.rank_measure_names import RANK_MEASURES as MEASURES  # torch-free

ENERGY_TOLERANCE = 1e-12  # as grpo_cli.probes.rank_measures: 90% energy reached up to rounding
MEASURE_LABELS = {
    "erank_entropy": "exp-entropy rank (sigma)",
    "erank_entropy_sq": "exp-entropy rank (sigma^2)",
    "stable_rank": "stable rank",
    "participation_ratio": "participation ratio",
    "energy_rank_90": "90% energy rank",
    "energy_rank_99": "99% energy rank",
    "numerical_rank": "numerical rank",
}


def _exp_entropy(weights: np.ndarray) -> float:
    p = weights / weights.sum()
    p = p[p > 0]
    return float(np.exp(-(p * np.log(p)).sum()))


def _energy_rank(energy: np.ndarray, fraction: float) -> float:
    cumulative = np.cumsum(energy) / energy.sum()
    return float(np.argmax(cumulative >= fraction * (1 - ENERGY_TOLERANCE)) + 1)


def rank_measures(sigma: np.ndarray, rank_rtol: float = 1e-6) -> dict[str, float]:
    """Every measure of MEASURES for singular values `sigma` ([k], any order); zeros -> 0.

    >>> rank_measures(np.ones(3))["erank_entropy"]
    3.0
    >>> rank_measures(np.array([1.0, 0.0]))["stable_rank"]
    1.0
    """
    sigma = np.sort(np.abs(np.asarray(sigma, dtype=float)))[::-1]
    if sigma.size == 0 or sigma[0] <= 0:
        return dict.fromkeys(MEASURES, 0.0)
    energy = sigma**2
    return {
        "erank_entropy": round(_exp_entropy(sigma), 12),
        "erank_entropy_sq": round(_exp_entropy(energy), 12),
        "stable_rank": float(energy.sum() / energy[0]),
        "participation_ratio": float(energy.sum() ** 2 / (energy**2).sum()),
        "energy_rank_90": _energy_rank(energy, 0.90),
        "energy_rank_99": _energy_rank(energy, 0.99),
        "numerical_rank": float((sigma > rank_rtol * sigma[0]).sum()),
    }


def composition_sigma(minority: int, group_size: int) -> np.ndarray:
    """Closed-form singular values of a group with `minority` of `group_size` outcomes differing."""
    majority = group_size - minority
    if minority <= 0 or majority <= 0:
        return np.zeros(group_size)
    return np.array([majority] * minority + [minority] * majority, dtype=float)


def predicted_measure(
    measure: str, minority: int, group_size: int, rank_rtol: float = 1e-6
) -> float:
    """Closed-form prediction of `measure` from the group composition.

    >>> predicted_measure("erank_entropy", 1, 2)
    2.0
    >>> round(predicted_measure("erank_entropy", 1, 4), 4)  # 2 sqrt(3)
    3.4641
    """
    return rank_measures(composition_sigma(minority, group_size), rank_rtol)[measure]
