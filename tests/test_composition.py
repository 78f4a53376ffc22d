import math

import pytest
import torch
from conftest import outcome_advantages

from grpo_cli.measures import (
    RANK_MEASURES,
    composition_spectrum,
    numerical_rank,
    predicted_rank_measures,
    rank_measures,
)
from grpo_cli.probes.composition import (
    composition_applies,
    count_distinct_rows,
    distinct_per_group,
    distinct_rows,
    distinct_spectrum,
    group_composition,
)
from grpo_cli.probes.rank_measures import all_rank_measures


def orthonormal_rows(rows, columns, seed=0):  # [rows, columns]
    generator = torch.Generator().manual_seed(seed)
    q, _ = torch.linalg.qr(torch.randn(columns, rows, generator=generator, dtype=torch.float64))
    return q.T


def group_matrix(rewards, normalise=False):
    """Rows = zero-sum advantage x orthonormal score vector."""
    advantages = rewards - rewards.mean()
    if normalise and advantages.abs().sum() > 0:
        advantages = advantages / rewards.std(correction=0)
    return advantages[:, None] * orthonormal_rows(len(rewards), 3 * len(rewards), seed=len(rewards))


@pytest.mark.parametrize("group_size", [2, 3, 4, 5, 8, 10])
def test_predictions_match_exact_spectra(group_size):
    for successes in range(group_size + 1):
        rewards = torch.zeros(group_size, dtype=torch.float64)
        rewards[
            torch.randperm(group_size, generator=torch.Generator().manual_seed(successes))[
                :successes
            ]
        ] = 1.0
        minority, majority = group_composition(rewards)
        assert minority == min(successes, group_size - successes)
        assert minority + majority == group_size

        sigma = torch.linalg.svdvals(group_matrix(rewards))
        spectrum = torch.from_numpy(composition_spectrum(minority, majority))
        torch.testing.assert_close(sigma * group_size, spectrum, atol=1e-9, rtol=0)

        predicted = predicted_rank_measures(minority, majority)
        for matrix in (group_matrix(rewards), group_matrix(rewards, normalise=True)):
            exact = all_rank_measures(torch.linalg.svdvals(matrix))
            for name in RANK_MEASURES:
                assert predicted[name] == pytest.approx(exact[name], abs=1e-9), (successes, name)


def test_hand_values_one_against_three():
    predicted = predicted_rank_measures(1, 3)
    assert composition_spectrum(1, 3).tolist() == [3.0, 1.0, 1.0, 1.0]
    assert predicted["erank_entropy"] == pytest.approx(2 * math.sqrt(3))  # p = [1/2, 1/6, 1/6, 1/6]
    assert predicted["stable_rank"] == pytest.approx(1 + 1 / 3)  # (9 + 3) / 9
    assert predicted["participation_ratio"] == pytest.approx(144 / 84)  # 12^2 / (81 + 3)
    # energies 9, 1, 1, 1 of 12: 0.9 needs 10.8 (k=3), 0.99 needs 11.88 (k=4)
    assert predicted["energy_rank_90"] == 3.0
    assert predicted["energy_rank_99"] == 4.0
    assert predicted["numerical_rank"] == 4.0


def test_balanced_group_has_full_rank():
    predicted = predicted_rank_measures(4, 4)
    for name in RANK_MEASURES:
        assert predicted[name] == pytest.approx(8.0), name


def test_zero_variance_group_predicts_zeros():
    assert predicted_rank_measures(0, 6) == {name: 0.0 for name in RANK_MEASURES}
    assert rank_measures(composition_spectrum(0, 6)) == predicted_rank_measures(0, 6)


def test_minority_must_not_exceed_majority():
    with pytest.raises(ValueError, match="minority <= majority"):
        predicted_rank_measures(3, 1)


def test_group_composition_cases():
    assert group_composition(torch.tensor([1.0, 0, 0, 0])) == (1, 3)
    assert group_composition(torch.tensor([1.0, 1, 0, 0])) == (2, 2)
    assert group_composition(torch.tensor([1.0, 1, 1, 0])) == (1, 3)
    assert group_composition(torch.tensor([0.3, 0.3, 0.3])) == (0, 3)
    assert group_composition(torch.tensor([0.5, 0.5, -1.0, 0.5])) == (1, 3)


def test_count_distinct_rows_with_and_without_mask():
    tokens = torch.tensor([[5, 6, 7, 0], [5, 6, 7, 9], [5, 6, 7, 0], [5, 6, 8, 0]])
    assert count_distinct_rows(tokens) == 3
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 1, 0], [1, 1, 1, 0], [1, 1, 1, 0]])
    assert count_distinct_rows(tokens, mask) == 2  # rows 0-2 agree on their completions
    shorter = mask.clone()
    shorter[2, 2] = 0  # row 2 stops one token earlier
    assert count_distinct_rows(tokens, shorter) == 3


def test_distinct_per_group_counts_each_group_as_count_distinct_rows_does():
    tokens = torch.tensor([[5, 6, 7, 0], [5, 6, 7, 9], [5, 6, 7, 0], [5, 6, 8, 0]])
    mask = torch.tensor([[1, 1, 1, 0]] * 4)
    shorter = mask.clone()
    shorter[2, 2] = 0
    # two groups of 4: the rows above under `mask`, then under `shorter`
    both = distinct_per_group(torch.cat([tokens, tokens]), torch.cat([mask, shorter]), 4)
    assert both.tolist() == [2, 3]
    assert distinct_per_group(tokens, mask, 2).tolist() == [1, 2]  # groups of 2: rows 0-1, 2-3
    generator = torch.Generator().manual_seed(0)
    random_tokens = torch.randint(0, 2, (24, 3), generator=generator)  # many repeats
    random_mask = torch.randint(0, 2, (24, 3), generator=generator)
    expected = [count_distinct_rows(random_tokens[i : i + 6], random_mask[i : i + 6]) for i in range(0, 24, 6)]
    assert distinct_per_group(random_tokens, random_mask, 6).tolist() == expected


def test_duplicated_rows_have_numerical_rank_equal_to_distinct_rows():
    generator = torch.Generator().manual_seed(3)
    completion_of_row = torch.tensor([0, 0, 1, 2, 2, 2, 3, 1])
    tokens = torch.randint(1, 50, (4, 6), generator=generator)[completion_of_row]  # [8, 6]
    scores = torch.randn(4, 40, generator=generator, dtype=torch.float64)[completion_of_row]
    rewards = (completion_of_row == 0).double()  # completion 0 is the only correct one
    matrix = (rewards - rewards.mean())[:, None] * scores
    distinct = count_distinct_rows(tokens)
    assert distinct == 4
    assert numerical_rank(torch.linalg.svdvals(matrix)) == distinct


@pytest.mark.parametrize("estimator", ["grpo", "dr_grpo", "rloo"])
def test_composition_applies_to_group_zero_sum_estimators(estimator):
    rewards = torch.tensor([1.0, 0, 0, 0, 1, 1, 0, 1])  # two groups of 4
    advantages = outcome_advantages(estimator, rewards, 4).reshape(2, 4)
    for group in range(2):
        assert composition_applies(advantages[group], rewards.reshape(2, 4)[group])


def test_composition_does_not_apply_elsewhere():
    rewards = torch.tensor([1.0, 0, 0, 0, 1, 1, 0, 1])
    batch_baseline = outcome_advantages("reinforce", rewards, 4).reshape(2, 4)  # batch mean 0.5: groups not zero-sum
    assert not composition_applies(batch_baseline[0], rewards[:4])
    # an overlong penalty makes the rewards that set the advantages non-binary
    penalised = torch.tensor([1.0, -0.3, 0, 0])
    correct = torch.tensor([1.0, 0, 0, 0])
    assert not composition_applies(penalised - penalised.mean(), correct)
    assert not composition_applies(-(correct - correct.mean()), correct)  # sign flipped
    assert not composition_applies(torch.full((4,), -0.5), torch.zeros(4))  # all wrong, a != 0
    assert composition_applies(torch.zeros(4), torch.zeros(4))  # zero group, zero matrix
    assert not composition_applies(torch.tensor([0.5, -0.5]), torch.tensor([0.7, 0.2]))


def test_distinct_spectrum_is_the_svd_of_duplicated_orthonormal_rows():
    completion_of_row = torch.tensor([0, 0, 1, 2, 2, 2, 3, 1])  # [8] completions 0..3
    tokens = torch.randint(1, 50, (4, 6), generator=torch.Generator().manual_seed(4))
    inverse = distinct_rows(tokens[completion_of_row])  # [8]
    assert torch.equal(inverse.unique(return_counts=True)[1].sort().values,
                       torch.tensor([1, 2, 2, 3]))
    rewards = (completion_of_row == 2).double()  # completion 2 (3 copies) is the correct one
    advantages = rewards - rewards.mean()  # [8]
    scores = orthonormal_rows(4, 20)[completion_of_row]  # [8, 20], orthonormal per completion
    measured = torch.linalg.svdvals(advantages[:, None] * scores)[:4]  # rank 4
    predicted = distinct_spectrum(advantages, inverse)
    assert torch.allclose(predicted, measured, atol=1e-12)
    # with R distinct completions it is the composition spectrum (up to the common scale)
    m, big_m = 3, 5
    rewards = torch.tensor([1.0] * m + [0.0] * big_m)
    spectrum = distinct_spectrum(rewards - rewards.mean(), torch.arange(8))
    assert torch.allclose(
        spectrum / spectrum[-1] * m, torch.from_numpy(composition_spectrum(m, big_m))
    )


def test_distinct_completions_averages_informative_groups_only():
    from grpo_cli.probes.composition import informative_distinct_mean

    # three groups of R = 2: distinct (informative), identical (zero-variance), distinct (informative)
    tokens = torch.tensor([[1, 2], [1, 3], [4, 4], [4, 4], [5, 6], [5, 6]])
    mask = torch.tensor([[1, 1], [1, 1], [1, 1], [1, 1], [1, 1], [1, 0]])
    rewards = torch.tensor([1.0, 0.0, 0.0, 0.0, 0.0, 1.0])
    assert float(informative_distinct_mean(tokens, mask, rewards, 2)) == 2.0
    assert math.isnan(float(informative_distinct_mean(tokens, mask, torch.zeros(6), 2)))
