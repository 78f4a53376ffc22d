"""Numpy rank measures of the analysis layer against closed-form cases."""

import math

import numpy as np
import pytest

from grpo_cli.analysis.measures import MEASURES, composition_sigma, predicted_measure, rank_measures


def test_identity_has_full_rank_in_every_measure():
    sigma = np.linalg.svd(np.eye(5), compute_uv=False)
    assert rank_measures(sigma) == pytest.approx(dict.fromkeys(MEASURES, 5.0))


def test_rank_one_outer_product_has_rank_one():
    matrix = np.outer([1.0, 2.0, 3.0], [4.0, -1.0, 0.5, 2.0])
    measures = rank_measures(np.linalg.svd(matrix, compute_uv=False))
    assert measures == pytest.approx(dict.fromkeys(MEASURES, 1.0), abs=1e-6)


def test_zero_matrix_is_zero():
    assert rank_measures(np.zeros(4)) == dict.fromkeys(MEASURES, 0.0)


def test_known_spectrum():
    measures = rank_measures(np.array([2.0, 1.0, 1.0]))
    assert measures["stable_rank"] == pytest.approx(6 / 4)
    assert measures["participation_ratio"] == pytest.approx(36 / 18)
    assert measures["energy_rank_90"] == 3 and measures["energy_rank_99"] == 3
    assert measures["energy_rank_90"] == 3
    p = np.array([0.5, 0.25, 0.25])
    assert measures["erank_entropy"] == pytest.approx(math.exp(-(p * np.log(p)).sum()))


@pytest.mark.parametrize("group_size", [2, 4, 8, 16])
def test_composition_prediction(group_size):
    for minority in range(1, group_size // 2 + 1):
        majority = group_size - minority
        sigma = composition_sigma(minority, group_size)
        assert sorted(sigma) == sorted([majority] * minority + [minority] * majority)
        assert predicted_measure("erank_entropy", minority, group_size) == pytest.approx(
            2 * math.sqrt(minority * majority)
        )
        assert predicted_measure("numerical_rank", minority, group_size) == group_size
    assert (composition_sigma(0, group_size) == 0).all()  # zero-variance group


def test_numpy_measures_match_the_torch_probes():
    """Two implementations: the analysis layer's numpy maths against the probes' torch maths."""
    torch = pytest.importorskip("torch")
    from grpo_cli.probes.composition import predicted_rank_measures
    from grpo_cli.probes.rank_measures import all_rank_measures

    rng = np.random.default_rng(0)
    for shape in [(4, 9), (8, 3), (16, 16)]:
        sigma = np.linalg.svd(
            rng.normal(size=shape) * rng.uniform(0.1, 3, size=shape[1]), compute_uv=False
        )
        expected = all_rank_measures(torch.tensor(sigma, dtype=torch.float64))
        assert rank_measures(sigma) == pytest.approx(expected, rel=1e-9)
    for group_size in (2, 4, 8):
        for minority in range(1, group_size // 2 + 1):
            expected = predicted_rank_measures(minority, group_size - minority)
            ours = {m: predicted_measure(m, minority, group_size) for m in MEASURES}
            assert ours == pytest.approx(expected, rel=1e-9)
