import doctest
import math

import pytest
import torch

from grpo_cli import measures as measures_module
from grpo_cli.measures import RANK_MEASURES, energy_rank, erank_entropy, numerical_rank
from grpo_cli.probes.rank_measures import all_rank_measures, singular_values_from_gram


def svdvals(matrix):
    return torch.linalg.svdvals(matrix.double())


def test_keys_are_the_results_contract_columns():
    measures = all_rank_measures(torch.tensor([1.0]))
    assert (
        list(measures)
        == list(RANK_MEASURES)
        == [
            "erank_entropy",
            "erank_entropy_sq",
            "stable_rank",
            "participation_ratio",
            "energy_rank_90",
            "energy_rank_99",
            "numerical_rank",
        ]
    )
    assert all(isinstance(value, float) for value in measures.values())


@pytest.mark.parametrize("n", [1, 3, 8])
def test_identity_has_rank_n_in_every_measure(n):
    measures = all_rank_measures(svdvals(torch.eye(n)))
    for name, value in measures.items():
        assert value == pytest.approx(n, abs=1e-9), name


def test_rank_one_outer_product_has_rank_one():
    generator = torch.Generator().manual_seed(0)
    u = torch.randn(6, 1, generator=generator, dtype=torch.float64)
    v = torch.randn(1, 9, generator=generator, dtype=torch.float64)
    measures = all_rank_measures(svdvals(u @ v))
    for name, value in measures.items():
        # svdvals leaves ~1e-16 sigma_1 in the null directions; entropy ranks see them to ~1e-14
        assert value == pytest.approx(1.0, abs=1e-9), name


def test_two_equal_and_two_zero_singular_values_give_two():
    measures = all_rank_measures(torch.tensor([0.0, 1.0, 0.0, 1.0], dtype=torch.float64))
    assert measures == {name: 2.0 for name in RANK_MEASURES}


@pytest.mark.parametrize("sigma", [torch.zeros(4), torch.zeros(0), svdvals(torch.zeros(3, 5))])
def test_zero_and_empty_spectra_give_zero(sigma):
    measures = all_rank_measures(sigma)
    assert measures == {name: 0.0 for name in RANK_MEASURES}


def test_hand_computed_spectrum_three_one():
    measures = all_rank_measures(torch.tensor([1.0, 3.0], dtype=torch.float64))
    entropy = -(0.75 * math.log(0.75) + 0.25 * math.log(0.25))  # p = [3/4, 1/4]
    entropy_sq = -(0.9 * math.log(0.9) + 0.1 * math.log(0.1))  # p = [9/10, 1/10]
    assert measures["erank_entropy"] == pytest.approx(math.exp(entropy), abs=1e-12)
    assert measures["erank_entropy"] == pytest.approx(1.7548, abs=1e-4)
    assert measures["erank_entropy_sq"] == pytest.approx(math.exp(entropy_sq), abs=1e-12)
    assert measures["stable_rank"] == pytest.approx(10 / 9, abs=1e-12)
    assert measures["participation_ratio"] == pytest.approx(100 / 82, abs=1e-12)
    assert measures["energy_rank_90"] == 1.0  # 9 of 10 is exactly 90%
    assert measures["energy_rank_99"] == 2.0
    assert measures["numerical_rank"] == 2.0


def test_energy_rank_boundaries_survive_round_off():
    sigma = torch.tensor([0.7] * 5, dtype=torch.float64)  # each holds 20% of the energy
    # in float64 the cumulative energy at k=2 falls just short of 0.4 * total
    assert energy_rank(sigma, 0.4) == 2
    assert energy_rank(sigma, 0.8) == 4
    assert energy_rank(sigma, 0.41) == 3
    assert energy_rank(sigma, 1.0) == 5
    assert energy_rank(torch.tensor([1.0, 1.0]), 0.5) == 1


def test_numerical_rank_uses_a_strict_relative_threshold():
    sigma = torch.tensor([1.0, 1e-3, 1e-6, 1e-9], dtype=torch.float64)
    assert numerical_rank(sigma, 1e-6) == 2  # 1e-6 is not > 1e-6
    assert numerical_rank(sigma, 1e-7) == 3
    assert numerical_rank(sigma, 1e-12) == 4


def test_order_and_sign_round_off_do_not_matter():
    assert erank_entropy(torch.tensor([1.0, 3.0, -1e-18])) == pytest.approx(
        erank_entropy(torch.tensor([3.0, 1.0]))
    )


def test_gram_route_matches_svdvals():
    generator = torch.Generator().manual_seed(0)
    matrix = torch.randn(7, 40, generator=generator, dtype=torch.float64)
    matrix[3] = 2 * matrix[1] - matrix[0]  # rank 6
    sigma = singular_values_from_gram(matrix @ matrix.T)
    expected = torch.linalg.svdvals(matrix)
    torch.testing.assert_close(sigma[:6], expected[:6], atol=1e-10, rtol=1e-10)
    assert sigma[6] < 1e-6 * sigma[0]
    assert bool((sigma[:-1] >= sigma[1:]).all())
    assert numerical_rank(sigma) == 6


def test_stacked_grams_give_each_spectrum_as_if_alone():
    generator = torch.Generator().manual_seed(1)
    rows = torch.randn(5, 4, 9, generator=generator, dtype=torch.float64)  # 5 groups of 4 rows
    rows[2, 3] = rows[2, 0]  # a repeated row: rank 3
    grams = rows @ rows.mT  # [5, 4, 4]
    stacked = singular_values_from_gram(grams)  # [5, 4]
    assert stacked.shape == (5, 4)
    for index in range(5):
        assert torch.equal(stacked[index], singular_values_from_gram(grams[index]))
    assert stacked[2, 3] < 1e-6 * stacked[2, 0]


@pytest.mark.parametrize("seed", range(4))
def test_all_measures_at_once_equal_each_measure_alone(seed):
    """rank_measures sorts the spectrum once; every value equals its own function's exactly."""
    generator = torch.Generator().manual_seed(seed)
    sigma = (torch.rand(11, generator=generator, dtype=torch.float64) ** 4).numpy()
    sigma[[2, 5]] = [0.0, -1e-17]  # unsorted, a zero and a round-off negative
    alone = {
        "erank_entropy": measures_module.erank_entropy(sigma),
        "erank_entropy_sq": measures_module.erank_entropy_sq(sigma),
        "stable_rank": measures_module.stable_rank(sigma),
        "participation_ratio": measures_module.participation_ratio(sigma),
        "energy_rank_90": float(energy_rank(sigma, 0.90)),
        "energy_rank_99": float(energy_rank(sigma, 0.99)),
        "numerical_rank": float(numerical_rank(sigma, 1e-3)),
    }
    assert measures_module.rank_measures(sigma, 1e-3) == alone


def test_doctests_of_the_measures_module_pass():
    result = doctest.testmod(measures_module)
    assert result.attempted >= 5 and result.failed == 0


def test_top1_energy_share_closed_forms():
    from grpo_cli.measures import stable_rank, top1_energy_share

    assert top1_energy_share([2.0, 0.0, 0.0]) == 1.0  # rank one: the best rank-1 keeps it all
    assert top1_energy_share([1.0] * 5) == pytest.approx(0.2)  # identity: 1/n
    assert top1_energy_share([1.0, 3.0, 1.0, 1.0]) == pytest.approx(9 / 12)  # any order
    assert top1_energy_share([]) == top1_energy_share([0.0, 0.0]) == 0.0
    sigma = [5.0, 2.0, 0.5]
    assert top1_energy_share(sigma) == pytest.approx(1 / stable_rank(sigma))
