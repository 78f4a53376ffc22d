import math

import pytest
import torch

from grpo_cli.measures import participation_ratio, stable_rank
from grpo_cli.probes.powerlaw import fit_power_law

RANKS = torch.arange(1, 51, dtype=torch.float64)


def test_exact_power_law_is_recovered_in_any_order():
    sigma = 3.0 * RANKS**-1.3
    shuffled = sigma[torch.randperm(50, generator=torch.Generator().manual_seed(0))]
    alpha, r2 = fit_power_law(shuffled)
    assert alpha == pytest.approx(1.3, abs=1e-12)
    assert r2 == pytest.approx(1.0, abs=1e-12)


def test_noisy_power_law_is_recovered_approximately():
    noise = torch.randn(50, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    sigma = RANKS**-0.8 * torch.exp(0.05 * noise)
    alpha, r2 = fit_power_law(sigma)
    assert alpha == pytest.approx(0.8, abs=0.05)
    assert 0.95 < r2 < 1.0


def test_fit_window_and_zero_values():
    head = RANKS[:10] ** -1.0
    tail = head[-1] * (RANKS[10:] / 10) ** -3.0  # steeper beyond k = 10
    sigma = torch.cat([head, tail, torch.zeros(5, dtype=torch.float64)])
    alpha_head, r2_head = fit_power_law(sigma, k_max=10)
    alpha_tail, _ = fit_power_law(sigma, k_min=10)
    alpha_all, r2_all = fit_power_law(sigma)
    assert alpha_head == pytest.approx(1.0, abs=1e-12) and r2_head == pytest.approx(1.0)
    assert alpha_tail == pytest.approx(3.0, abs=1e-12)
    assert 1.0 < alpha_all < 3.0 and r2_all < 1.0


def test_values_below_the_rank_cut_are_not_fitted():
    """A rank-deficient matrix's spectrum: a power law over its rank, then what svdvals leaves of
    its zeros. Above rtol * sigma_1 (the probes pass probes.rank_rtol) the fit is the power law's;
    over every non-zero value it measures the cliff down to the round-off."""
    signal = 2.0 * RANKS[:20] ** -1.5  # sigma_20 ~ 0.011 sigma_1
    round_off = torch.logspace(-16, -15, 30, dtype=torch.float64)
    sigma = torch.cat([round_off, signal])
    alpha, r2 = fit_power_law(sigma, rtol=1e-6)
    assert alpha == pytest.approx(1.5, abs=1e-12) and r2 == pytest.approx(1.0, abs=1e-12)
    alpha_all, r2_all = fit_power_law(sigma)
    assert alpha_all > 5.0 and r2_all < 0.8
    assert fit_power_law(sigma, rtol=0.05) == pytest.approx((1.5, 1.0))  # sigma_k > 0.05 sigma_1: k <= 7
    assert all(math.isnan(v) for v in fit_power_law(sigma, rtol=0.3))  # two values above the cut


def test_too_few_values_give_nan_and_flat_gives_zero():
    assert all(math.isnan(v) for v in fit_power_law(torch.tensor([1.0, 0.5, 0.0, 0.0])))
    assert all(math.isnan(v) for v in fit_power_law(torch.ones(10), k_min=9))
    assert fit_power_law(torch.ones(5)) == (0.0, 1.0)


def test_one_over_k_spectrum_has_small_stable_rank_and_participation_ratio():
    sigma = 1.0 / torch.arange(1, 65, dtype=torch.float64)
    second = sum(k**-2 for k in range(1, 65))  # sum sigma^2, sigma_1 = 1
    fourth = sum(k**-4 for k in range(1, 65))
    assert stable_rank(sigma) == pytest.approx(second, abs=1e-12)
    assert stable_rank(sigma) == pytest.approx(1.6295, abs=1e-4)
    assert 1.5 < stable_rank(sigma) < 2.0
    assert participation_ratio(sigma) == pytest.approx(second**2 / fourth, abs=1e-12)
    assert participation_ratio(sigma) == pytest.approx(2.4531, abs=1e-4)
    assert 2.0 < participation_ratio(sigma) < 3.0


def test_matches_a_least_squares_reference_on_a_generic_spectrum():
    generator = torch.Generator().manual_seed(2)
    sigma = torch.rand(40, generator=generator, dtype=torch.float64) ** 3  # no power law
    s = sigma.sort(descending=True).values
    x, y = RANKS[:40].log(), s.log()
    design = torch.stack([torch.ones_like(x), x], dim=1)  # [40, 2]
    intercept, slope = torch.linalg.lstsq(design, y[:, None]).solution[:, 0]
    r2 = 1 - ((y - intercept - slope * x) ** 2).sum() / ((y - y.mean()) ** 2).sum()
    alpha, fitted_r2 = fit_power_law(sigma)
    assert alpha == pytest.approx(-float(slope), rel=1e-10)
    assert fitted_r2 == pytest.approx(float(r2), rel=1e-10)
