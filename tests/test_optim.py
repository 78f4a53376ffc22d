"""Stochastic-rounding AdamW: plain AdamW in float32, unbiased and not stuck in bf16."""

from __future__ import annotations

import torch

from grpo_cli.algorithm.optim import StochasticRoundingAdamW, stochastic_round_to_bf16


def test_matches_torch_adamw_in_float32():
    torch.manual_seed(0)
    ours, reference = torch.nn.Parameter(torch.randn(50)), torch.nn.Parameter(torch.empty(50))
    reference.data.copy_(ours.data)
    optimizers = [StochasticRoundingAdamW([ours], lr=1e-2, weight_decay=0.1),
                  torch.optim.AdamW([reference], lr=1e-2, weight_decay=0.1)]
    for _ in range(5):
        grad = torch.randn(50)
        for param, optimizer in zip((ours, reference), optimizers, strict=True):
            param.grad = grad.clone()
            optimizer.step()
    assert torch.allclose(ours, reference, rtol=1e-6, atol=1e-7)


def test_stochastic_rounding_is_unbiased_and_brackets_the_value():
    value = torch.full((200_000,), 1.0 + 2.0**-10)  # between bf16 neighbours 1.0 and 1.0078125
    rounded = stochastic_round_to_bf16(value, torch.Generator().manual_seed(0)).float()
    assert set(rounded.unique().tolist()) == {1.0, 1.0078125}
    assert abs(rounded.mean().item() - value[0].item()) < 2e-5  # std of the mean ~9e-6
    exact = torch.tensor([1.0, -2.5, 0.0])
    assert torch.equal(stochastic_round_to_bf16(exact).float(), exact)  # representable: unchanged


def test_bf16_weights_move_at_rl_learning_rates():
    """At lr 1e-6 round-to-nearest loses most of Adam's first step; stochastic rounding keeps it."""
    torch.manual_seed(0)
    start = (torch.randn(100_000) * 0.02).to(torch.bfloat16)
    grad = torch.randn(100_000).to(torch.bfloat16)
    mean_step = {}
    for name, cls in (("torch", torch.optim.AdamW), ("ours", StochasticRoundingAdamW)):
        param = torch.nn.Parameter(start.clone())
        optimizer = cls([param], lr=1e-6)
        param.grad = grad.clone()
        optimizer.step()
        # Adam's first step moves every weight by lr against its gradient's sign
        mean_step[name] = ((start.float() - param.float()) * grad.float().sign()).mean().item()
    assert abs(mean_step["ours"] - 1e-6) < 1e-7  # unbiased
    assert mean_step["torch"] < 0.5e-6  # most of the update rounded away


def test_update_in_slices_is_the_whole_update():
    """Slicing the elementwise update changes nothing in float32; in bf16 it stays unbiased."""
    torch.manual_seed(0)
    start = torch.randn(3, 1000)
    grads = [torch.randn(3, 1000) for _ in range(3)]
    finals = []
    for slice_elements in (2**24, 7):
        param = torch.nn.Parameter(start.clone())
        optimizer = StochasticRoundingAdamW([param], lr=1e-2, weight_decay=0.1,
                                            slice_elements=slice_elements)
        for grad in grads:
            param.grad = grad.clone()
            optimizer.step()
        finals.append((param.detach().clone(), optimizer.state[param]["exp_avg_sq"].clone()))
    assert torch.equal(finals[0][0], finals[1][0]) and torch.equal(finals[0][1], finals[1][1])

    bf16 = (torch.randn(100_000) * 0.02).to(torch.bfloat16)
    grad = torch.randn(100_000).to(torch.bfloat16)
    param = torch.nn.Parameter(bf16.clone())
    optimizer = StochasticRoundingAdamW([param], lr=1e-6, slice_elements=999)
    param.grad = grad.clone()
    optimizer.step()
    mean_step = ((bf16.float() - param.float()) * grad.float().sign()).mean().item()
    assert abs(mean_step - 1e-6) < 1e-7
