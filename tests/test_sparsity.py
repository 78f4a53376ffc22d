import math

import pytest
import torch

from grpo_cli.probes.sparsity import (
    changed_entries,
    combined_sparsity,
    gradient_sparsity,
    hoyer_sparsity,
)


def test_thresholded_sparsity_by_hand():
    g = torch.tensor([0.0, 1e-4, 0.5, -1.0, 2e-3])
    assert gradient_sparsity(g, rtol=1e-3) == pytest.approx(2 / 5)  # 0 and 1e-4 fall below 1e-3
    assert gradient_sparsity(g, rtol=1e-2) == pytest.approx(3 / 5)
    assert gradient_sparsity(g.reshape(1, 5), rtol=0.0) == 0.0  # strict: nothing is < 0


def test_zero_and_empty_gradients_are_fully_sparse():
    for g in (torch.zeros(3, 4), torch.zeros(0)):
        assert gradient_sparsity(g) == 1.0
        assert hoyer_sparsity(g) == 1.0


def test_hoyer_by_hand():
    assert hoyer_sparsity(torch.tensor([0.0, 0.0, 3.0, 0.0])) == pytest.approx(1.0)
    assert hoyer_sparsity(torch.tensor([[1.0, -1.0], [1.0, -1.0]])) == pytest.approx(0.0, abs=1e-12)
    # n = 4, L1 = 2, L2 = sqrt(2): (2 - sqrt(2)) / (2 - 1)
    assert hoyer_sparsity(torch.tensor([1.0, 1.0, 0.0, 0.0])) == pytest.approx(2 - math.sqrt(2))
    assert hoyer_sparsity(torch.tensor([5.0])) == 0.0


def test_combined_equals_the_concatenation():
    generator = torch.Generator().manual_seed(0)
    tensors = [
        torch.randn(4, 5, generator=generator) ** 3,
        torch.zeros(7),
        100 * torch.randn(3, generator=generator),
    ]
    flat = torch.cat([t.reshape(-1) for t in tensors])
    combined = combined_sparsity(tensors, rtol=1e-2)
    assert combined["sparsity"] == pytest.approx(gradient_sparsity(flat, rtol=1e-2))
    assert combined["hoyer"] == pytest.approx(hoyer_sparsity(flat))
    assert combined["sparsity"] >= 7 / 30  # the zero block alone
    assert combined_sparsity([torch.zeros(2), torch.zeros(3)]) == {"sparsity": 1.0, "hoyer": 1.0}
    assert combined_sparsity([]) == {"sparsity": 1.0, "hoyer": 1.0}


def test_changed_entries_exact_and_after_bf16_rounding():
    initial = torch.ones(2, 3)
    current = initial.clone()
    current[0, 0] += 2**-10  # below half of bf16's spacing at 1 (2^-7): lost in a bf16 copy
    current[0, 1] += 2**-7  # one bf16 step: kept
    current[1, 2] = -1.0
    assert changed_entries(current, initial) == 3
    assert changed_entries(current, initial, torch.bfloat16) == 2
    assert changed_entries(initial, initial) == 0
    assert changed_entries(current.to(torch.bfloat16), initial) == 2  # bf16 weights compared in bf16
    with pytest.raises(ValueError, match="shapes differ"):
        changed_entries(current, torch.ones(3, 2))
