"""The categorical draws of rollout/sampling.py: each samples softmax(filter_top_p(logits / T))."""

from __future__ import annotations

import pytest
import torch

from grpo_cli.rollout.sampling import DRAWS, inverse_cdf_tokens, sampling_probs

LOGITS = torch.tensor([2.0, 0.5, -1.0, 1.0, -30.0])  # one token of probability ~1e-14


@pytest.mark.parametrize("name", sorted(DRAWS))
@pytest.mark.parametrize(("temperature", "top_p"), [(1.0, 1.0), (0.7, 0.9), (1.3, 0.6)])
def test_draw_frequencies_match_the_sampling_probabilities(name, temperature, top_p):
    """200,000 draws: every token's frequency within 5 standard errors of its probability; tokens
    that top-p removes are never drawn."""
    rows = 200_000
    logits = LOGITS.expand(rows, -1).contiguous()
    generator = torch.Generator().manual_seed(0)
    tokens = DRAWS[name](logits, temperature, top_p, generator)
    assert tokens.shape == (rows,) and tokens.dtype == torch.long
    probs = sampling_probs(LOGITS[None], temperature, top_p)[0].double()
    frequency = torch.bincount(tokens, minlength=LOGITS.numel()).double() / rows
    error = (probs * (1 - probs) / rows).sqrt()
    assert ((frequency - probs).abs() <= 5 * error + 1e-12).all(), (frequency, probs)
    assert (frequency[probs == 0] == 0).all()
    if top_p < 1:
        assert (probs == 0).any()  # the filter removed something, and the draw respects it


def test_inverse_cdf_is_greedy_at_zero_temperature_and_reproducible():
    logits = torch.randn(6, 50, generator=torch.Generator().manual_seed(1))
    assert torch.equal(inverse_cdf_tokens(logits, 0.0, 1.0, torch.Generator()), logits.argmax(-1))
    first = inverse_cdf_tokens(logits, 1.0, 1.0, torch.Generator().manual_seed(3))
    again = inverse_cdf_tokens(logits, 1.0, 1.0, torch.Generator().manual_seed(3))
    assert torch.equal(first, again)


def test_inverse_cdf_picks_the_token_whose_interval_holds_the_uniform():
    """Closed form: probabilities (0.5, 0, 0.25, 0.25), a uniform u picks token 0 below 0.5,
    token 2 in [0.5, 0.75), token 3 above; the zero-probability token 1 never."""
    logits = torch.log(torch.tensor([[0.5, 0.0, 0.25, 0.25]]))
    generator = torch.Generator().manual_seed(7)
    uniforms = torch.rand(200, 1, dtype=torch.float64, generator=torch.Generator().manual_seed(7))
    tokens = torch.stack([inverse_cdf_tokens(logits, 1.0, 1.0, generator)[0] for _ in range(200)])
    expected = torch.where(uniforms[:, 0] < 0.5, 0, torch.where(uniforms[:, 0] < 0.75, 2, 3))
    assert torch.equal(tokens, expected)
