"""Mixed-precision AdamW: plain AdamW in float32; bf16 weights with fp32 masters or unbiased
stochastic rounding; its state (masters, rounding generators) survives a checkpoint."""

from __future__ import annotations

import copy

import pytest
import torch

from grpo_cli.algorithm.optim import MixedPrecisionAdamW, master_params, stochastic_round_to_bf16


def test_matches_torch_adamw_in_float32():
    torch.manual_seed(0)
    ours, reference = torch.nn.Parameter(torch.randn(50)), torch.nn.Parameter(torch.empty(50))
    reference.data.copy_(ours.data)
    optimizers = [MixedPrecisionAdamW([ours], lr=1e-2, weight_decay=0.1),
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
    for name, cls in (("torch", torch.optim.AdamW), ("ours", MixedPrecisionAdamW)):
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
        optimizer = MixedPrecisionAdamW([param], lr=1e-2, weight_decay=0.1,
                                         slice_elements=slice_elements)
        for grad in grads:
            param.grad = grad.clone()
            optimizer.step()
        finals.append((param.detach().clone(), optimizer.state[param]["exp_avg_sq"].clone()))
    assert torch.equal(finals[0][0], finals[1][0]) and torch.equal(finals[0][1], finals[1][1])

    bf16 = (torch.randn(100_000) * 0.02).to(torch.bfloat16)
    grad = torch.randn(100_000).to(torch.bfloat16)
    param = torch.nn.Parameter(bf16.clone())
    optimizer = MixedPrecisionAdamW([param], lr=1e-6, slice_elements=999)
    param.grad = grad.clone()
    optimizer.step()
    mean_step = ((bf16.float() - param.float()) * grad.float().sign()).mean().item()
    assert abs(mean_step - 1e-6) < 1e-7


def test_fp32_master_weights_follow_float32_adamw_exactly():
    """bf16 compute copy + fp32 master: the master is fp32 AdamW's trajectory (to float32
    round-off), the bf16 weight its round-to-nearest, and W_t - W_0 read from the master has
    no bf16 rounding."""
    torch.manual_seed(0)
    start = (torch.randn(1000) * 0.02).to(torch.bfloat16)
    param = torch.nn.Parameter(start.clone())
    reference = torch.nn.Parameter(start.float())
    ours = MixedPrecisionAdamW([param], lr=1e-6, master_params=[param])
    plain = torch.optim.AdamW([reference], lr=1e-6)
    grad = torch.randn(1000)  # the same each step: Adam moves every weight by lr per step
    for _ in range(3):
        param.grad, reference.grad = grad.to(torch.bfloat16), grad.to(torch.bfloat16).float()
        ours.step()
        plain.step()
    master = ours.master_weight(param)
    assert master.dtype == torch.float32 and ours.state[param]["exp_avg"].dtype == torch.float32
    torch.testing.assert_close(master, reference.detach(), rtol=1e-6, atol=1e-9)
    assert torch.equal(param.detach(), master.to(torch.bfloat16))
    moved = (master - start.float()).abs()
    assert (moved > 2.9e-6).all() and (moved < 3.1e-6).all()  # three steps of lr, none lost


def make_pair(master: bool, seed: int = 3):
    torch.manual_seed(0)
    param = torch.nn.Parameter((torch.randn(64, 8) * 0.02).to(torch.bfloat16))
    return param, MixedPrecisionAdamW([param], lr=1e-3, seed=seed,
                                      master_params=[param] if master else ())


@pytest.mark.parametrize("master", [False, True], ids=["stochastic_rounding", "fp32_master"])
def test_state_dict_round_trip_continues_bit_for_bit(master):
    """A checkpoint keeps the rounding generators and the fp32 masters and moments (torch would
    cast them to the parameter's bf16 on load), so a resumed run equals an uninterrupted one."""
    grads = [torch.randn(64, 8, generator=torch.Generator().manual_seed(i)).to(torch.bfloat16)
             for i in range(4)]
    param, optimizer = make_pair(master)
    for grad in grads[:2]:
        param.grad = grad.clone()
        optimizer.step()
    saved_param, saved_state = param.detach().clone(), copy.deepcopy(optimizer.state_dict())
    for grad in grads[2:]:
        param.grad = grad.clone()
        optimizer.step()
    uninterrupted = param.detach().clone()

    resumed, fresh = make_pair(master, seed=3)
    with torch.no_grad():
        resumed.copy_(saved_param)
    fresh.load_state_dict(saved_state)
    if master:
        assert fresh.state[resumed]["master"].dtype == torch.float32
        assert fresh.state[resumed]["exp_avg_sq"].dtype == torch.float32
    for grad in grads[2:]:
        resumed.grad = grad.clone()
        fresh.step()
    assert torch.equal(resumed.detach(), uninterrupted)


def test_master_params_choice():
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 2))
    named = list(model.named_parameters())
    assert len(master_params(named, "fp32", "0")) == 4
    assert master_params(named, "probed", r"^0\.") == [model[0].weight]  # 2-D weights only
    assert master_params(named, "none", ".*") == []
    with pytest.raises(ValueError, match="model.master_weights='fp16'"):
        master_params(named, "fp16", ".*")
