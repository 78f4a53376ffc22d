import doctest
import math

import numpy as np
import pytest
import torch

from grpo_cli import measures as measures_module
from grpo_cli.measures import RANK_MEASURES, energy_rank, erank_entropy, numerical_rank
from grpo_cli.probes.rank_measures import (
    all_rank_measures,
    singular_values,
    singular_values_from_gram,
)


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


@pytest.mark.parametrize("shape", [(12, 30), (30, 12), (16, 16)])
def test_layer_spectrum_by_gram_equals_svdvals_down_to_its_floor(shape):
    """`singular_values` (probes.layer_spectrum): the Gram of the smaller side gives svdvals' values
    in either orientation, to ~1e-10 of sigma_1 over a spectrum spanning 1 .. 1e-6 (the default
    rank_rtol), and the same numerical rank and rank measures as `svd`."""
    generator = torch.Generator().manual_seed(sum(shape))
    rows, columns = shape
    k = min(shape)
    left, _ = torch.linalg.qr(torch.randn(rows, k, generator=generator, dtype=torch.float64))
    right, _ = torch.linalg.qr(torch.randn(columns, k, generator=generator, dtype=torch.float64))
    truth = torch.logspace(0, -5.5, k, dtype=torch.float64)  # [k] down to 3e-6 sigma_1
    matrix = ((left * truth) @ right.T).float()  # a float32 weight or gradient, as the probes get
    by_gram, by_svd = singular_values(matrix, "gram"), singular_values(matrix, "svd")
    assert by_gram.shape == by_svd.shape == (k,) and by_gram.dtype == torch.float64
    assert float((by_gram - by_svd).abs().max()) < 1e-10 * float(by_svd[0])
    assert bool((by_gram[:-1] >= by_gram[1:]).all())
    assert numerical_rank(by_gram) == numerical_rank(by_svd) == k
    for name, value in all_rank_measures(by_gram).items():
        assert value == pytest.approx(all_rank_measures(by_svd)[name], rel=1e-9), name


def test_layer_spectrum_of_a_rank_deficient_matrix_leaves_only_round_off():
    """A rank-3 matrix: both routes find rank 3 at rank_rtol; the Gram's null values sit below its
    documented floor (~1.5e-8 sigma_1), svdvals' far below."""
    generator = torch.Generator().manual_seed(5)
    matrix = torch.randn(8, 3, generator=generator, dtype=torch.float64) @ torch.randn(
        3, 20, generator=generator, dtype=torch.float64)
    by_gram, by_svd = singular_values(matrix, "gram"), singular_values(matrix)  # svd: the default
    assert numerical_rank(by_gram) == numerical_rank(by_svd) == 3
    assert float(by_gram[3:].max()) < 1.5e-7 * float(by_gram[0])
    torch.testing.assert_close(by_gram[:3], by_svd[:3], atol=1e-10 * float(by_svd[0]), rtol=0)


def test_layer_spectrum_refuses_what_it_cannot_decompose():
    with pytest.raises(ValueError, match="2-D"):
        singular_values(torch.ones(2, 3, 4))
    with pytest.raises(ValueError, match="unknown spectrum method 'qr'"):
        singular_values(torch.ones(2, 3), "qr")


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


def test_layer_spectra_benchmark_runs_and_finds_the_routes_agree(tmp_path):
    """scripts/bench_layer_spectra.py at the CPU preset's shapes: a timing per route and shape,
    each route's probe-step total (also in its CSV), and a gap between the routes far below the
    Gram's floor."""
    import csv
    import re
    import subprocess
    import sys
    from pathlib import Path

    script = Path(__file__).resolve().parents[1] / "scripts" / "bench_layer_spectra.py"
    out = tmp_path / "spectra.csv"
    result = subprocess.run([sys.executable, str(script), "--shapes", "tiny", "--repeats", "1", "--threads", "1",
                             "--out", str(out)], capture_output=True, text=True, check=True, timeout=120)
    assert len(re.findall(r"^(gram|svd): \d+ x \d+ on cpu: ", result.stdout, re.M)) == 6, result.stdout
    gap = float(re.search(r"largest gap between the routes: ([0-9.e+-]+) sigma_1", result.stdout).group(1))
    assert gap < 1e-10, result.stdout
    with open(out, newline="") as handle:
        rows = list(csv.DictReader(handle))
    assert [row["method"] for row in rows] == ["gram"] * 4 + ["svd"] * 4  # 3 shapes, then the total
    totals = [row for row in rows if row["rows"] == "0"]
    assert [int(row["count"]) for row in totals] == [42, 42]  # 14 weights x 3 ways
    for total in totals:
        parts = [row for row in rows if row["method"] == total["method"] and row["rows"] != "0"]
        expected = sum(3 * int(row["count"]) * float(row["seconds"]) for row in parts)
        assert float(total["seconds"]) == pytest.approx(expected)


def test_top_energy_shares_of_a_gram_with_known_eigenvalues():
    """E_k of a Gram Q diag(lambda) Q^T (Q a random orthogonal basis), read off its eigenvalues as
    the probes do, is the closed form sum_{j<=k} lambda_j / sum lambda; the residual 1 - E_k the
    rest. The spectrum carries float64 eigensolver round-off, ~n eps lambda_1 on each lambda."""
    from grpo_cli.measures import top_energy_shares
    from grpo_cli.probes.rank_measures import singular_values_from_gram

    eigenvalues = torch.tensor([9.0, 4.0, 2.0, 0.5, 0.5, 0.0], dtype=torch.float64)
    basis, _ = torch.linalg.qr(torch.randn(6, 6, generator=torch.Generator().manual_seed(3), dtype=torch.float64))
    gram = basis @ torch.diag(eigenvalues) @ basis.T
    shares = top_energy_shares(singular_values_from_gram(gram).numpy())
    tolerance = 6 * 64 * np.finfo(np.float64).eps  # n x 64 eps, relative to lambda_1 / sum lambda ~ 1/2
    assert shares["top1_energy_share"] == pytest.approx(9 / 16, abs=tolerance)
    assert shares["top2_energy_share"] == pytest.approx(13 / 16, abs=tolerance)
    assert 1 - shares["top3_energy_share"] == pytest.approx(1 / 16, abs=tolerance)  # the residual


def test_top_energy_shares_named_edges():
    from grpo_cli.measures import top1_energy_share, top_energy_shares

    assert top_energy_shares([0.0, 0.0, 0.0, 0.0]) == dict.fromkeys(
        ("top1_energy_share", "top2_energy_share", "top3_energy_share"), 0.0)  # a zero gradient: 0
    assert top_energy_shares([3.0, 4.0]) == {  # fewer directions than k: all the energy
        "top1_energy_share": 16 / 25, "top2_energy_share": 1.0, "top3_energy_share": 1.0}
    assert top_energy_shares([1.0] * 8)["top3_energy_share"] == pytest.approx(3 / 8)  # orthonormal rows: k / n
    sigma = [5.0, 2.0, 0.5]
    assert top_energy_shares(sigma)["top1_energy_share"] == top1_energy_share(sigma)  # one owner agrees
