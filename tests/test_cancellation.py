"""Cancellation of per-rollout gradients, 1^T G 1 / (n tr G), against closed forms."""

from __future__ import annotations

import math

import pytest
import torch

from grpo_cli.measures import predicted_coherence
from grpo_cli.probes.cancellation import coherence, mean_cosine


def gram(rows: torch.Tensor) -> torch.Tensor:  # rows [n, P] -> [n, n]
    rows = rows.double()
    return rows @ rows.T


def test_aligned_rows_give_one_orthogonal_one_over_n_zero_sum_zero():
    direction = torch.tensor([1.0, -2.0, 0.5])
    assert coherence(gram(direction.repeat(4, 1))) == pytest.approx(1.0)
    assert coherence(gram(3.0 * torch.eye(5))) == pytest.approx(1 / 5)
    assert coherence(gram(torch.diag(torch.tensor([1.0, 2.0, 3.0])))) == pytest.approx(1 / 3)  # any norms
    zero_sum = torch.tensor([0.75, -0.25, -0.25, -0.25])[:, None] * direction  # a_i u, sum a = 0
    assert coherence(gram(zero_sum)) == pytest.approx(0.0, abs=1e-12)
    assert math.isnan(coherence(torch.zeros(3, 3))) and math.isnan(coherence(torch.zeros(0, 0)))


def test_coherence_lies_between_zero_and_one():
    torch.manual_seed(0)
    for _ in range(20):
        value = coherence(gram(torch.randn(6, 4)))
        assert 0.0 <= value <= 1.0 + 1e-12


def test_prediction_is_exact_for_equicorrelated_unit_scores():
    """s_i = sqrt(rho) u + sqrt(1 - rho) e_i: unit vectors, pairwise cosine rho. Rows a_i s_i
    have exactly the predicted coherence; zero-sum a gives (1 - rho)/R whatever the composition."""
    size, rho = 4, 0.3
    basis = torch.eye(size + 1, dtype=torch.float64)
    scores = math.sqrt(rho) * basis[size] + math.sqrt(1 - rho) * basis[:size]  # [R, R+1]
    assert mean_cosine(gram(scores)) == pytest.approx(rho)
    for advantages in ([0.75, -0.25, -0.25, -0.25], [0.5, 0.5, -0.5, -0.5], [1.0, 0.2, -0.3, 0.9]):
        a = torch.tensor(advantages, dtype=torch.float64)
        measured = coherence(gram(a[:, None] * scores))
        assert measured == pytest.approx(predicted_coherence(advantages, rho), rel=1e-12)
    assert predicted_coherence([0.75, -0.25, -0.25, -0.25], rho) == pytest.approx((1 - rho) / size)
    assert predicted_coherence([0.5, 0.5, -0.5, -0.5], rho) == pytest.approx((1 - rho) / size)
    assert predicted_coherence([1.0, 1.0], cosine=1.0) == pytest.approx(1.0)  # aligned
    assert math.isnan(predicted_coherence([0.0, 0.0]))


def test_mean_cosine_is_signed_and_skips_zero_rows():
    rows = torch.tensor([[1.0, 0.0], [-1.0, 0.0], [0.0, 0.0]])
    assert mean_cosine(gram(rows)) == pytest.approx(-1.0)
    assert math.isnan(mean_cosine(gram(rows[:1])))
