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


def mixed_model(seed: int = 0, device: str = "cpu"):
    """Every kind of parameter the optimizer groups: bf16 with a master, bf16 with stochastic
    rounding, float32; a matrix larger than a slice, a non-contiguous weight, two param groups."""
    generator = torch.Generator().manual_seed(seed)

    def param(*shape, dtype=torch.bfloat16):
        return torch.nn.Parameter((torch.randn(*shape, generator=generator) * 0.02).to(device, dtype))

    transposed = torch.nn.Parameter(param(24, 10).detach().t())  # [10, 24], non-contiguous
    params = {"big_master": param(40, 30), "small_master": param(7), "big_rounded": param(50, 9),
              "small_rounded": param(5), "transposed": transposed,
              "fp32": param(13, 11, dtype=torch.float32), "late": param(17)}
    assert not params["transposed"].is_contiguous()
    master = [params[name] for name in ("big_master", "small_master", "transposed")]
    groups = [{"params": [params[name] for name in ("big_master", "big_rounded", "fp32", "late")]},
              {"params": [params[name] for name in ("small_master", "small_rounded", "transposed")],
               "lr": 3e-3, "weight_decay": 0.0}]
    return params, groups, master


def run_steps(optimizer, params, steps, first_step=0):
    for step in range(first_step, first_step + steps):
        generator = torch.Generator().manual_seed(100 + step)
        for name, param in params.items():
            if name == "late" and step < 2:
                param.grad = None  # no gradient yet: skipped, its step count lags the others
                continue
            param.grad = torch.randn(param.shape, generator=generator).to(param.device, param.dtype)
        optimizer.step()


def assert_same_state(ours, reference, ours_params, reference_params):
    for name, param in ours_params.items():
        other = reference_params[name]
        assert torch.equal(param.detach(), other.detach()), name
        state, other_state = ours.state[param], reference.state[other]
        assert state.keys() == other_state.keys(), name
        for key, value in state.items():
            if key == "step":
                assert value == other_state[key], name
            else:
                assert value.dtype == other_state[key].dtype, (name, key)
                assert torch.equal(value, other_state[key]), (name, key)
    assert set(ours._generators) == set(reference._generators)
    for key, generator in ours._generators.items():
        assert torch.equal(generator.get_state(), reference._generators[key].get_state())


@pytest.mark.parametrize("slice_elements", [2**24, 64, 7])
def test_multi_tensor_update_equals_the_per_parameter_loop_bit_for_bit(slice_elements):
    """On CPU the chunked foreach path runs the per-parameter loop's elementwise kernels and
    draws the same rounding noise (one draw per chunk = one per slice: CPU draws are serial):
    parameters, moments, masters, step counts and the generator agree exactly after 4 steps."""
    optimizers, all_params = [], []
    for foreach in (True, False):
        params, groups, master = mixed_model()
        optimizers.append(MixedPrecisionAdamW(groups, lr=1e-2, weight_decay=0.1, seed=5,
                                              master_params=master, foreach=foreach,
                                              slice_elements=slice_elements))
        all_params.append(params)
        run_steps(optimizers[-1], params, steps=4)
    assert optimizers[0].state[all_params[0]["late"]]["step"] == 2
    start, _, _ = mixed_model()
    for name, param in all_params[0].items():  # every parameter moved, bf16 ones included
        assert not torch.equal(param.detach(), start[name].detach()), name
    assert_same_state(optimizers[0], optimizers[1], all_params[0], all_params[1])


def test_chunks_cover_every_element_once_within_the_bound():
    """Small tensors share a chunk whole, larger ones are cut into slices; no chunk exceeds
    `slice_elements` and every element of every parameter lies in exactly one piece."""
    params, groups, master = mixed_model()
    optimizer = MixedPrecisionAdamW(groups, master_params=master, slice_elements=64, foreach=True)
    run_steps(optimizer, params, steps=3)
    contiguous = [p for name, p in params.items() if name != "transposed"]
    with torch.no_grad():
        for param in params.values():
            param.zero_()
        chunks = list(optimizer._chunks(contiguous))
        for chunk in chunks:
            assert sum(piece.param.numel() for piece in chunk) <= 64
            for piece in chunk:
                piece.param.add_(1)  # the parameter or a view of it: writes through
        whole = list(optimizer._chunks([params["transposed"]]))  # no flat view: one piece
    for param in contiguous:
        assert torch.equal(param, torch.ones_like(param))
    pieces = [piece.param for chunk in chunks for piece in chunk]
    assert any(piece is params["small_rounded"] for piece in pieces)  # fits: not cut
    assert sum(piece.numel() == 64 for piece in pieces) == 1200 // 64 + 450 // 64 + 143 // 64
    assert len(chunks) < len(pieces)  # small tensors packed together
    assert len(whole) == 1 and whole[0][0].param is params["transposed"]


@pytest.mark.parametrize("saved_with", [False, True], ids=["per_parameter", "foreach"])
def test_checkpoint_from_either_path_resumes_the_uninterrupted_run(saved_with):
    """The state dict is the same for both paths: a checkpoint written by the per-parameter loop
    (older runs) resumes under the foreach path exactly as the run would have continued."""
    params, groups, master = mixed_model()
    optimizer = MixedPrecisionAdamW(groups, lr=1e-2, seed=5, master_params=master,
                                    foreach=saved_with, slice_elements=64)
    run_steps(optimizer, params, steps=3)
    saved_params = {name: p.detach().clone() for name, p in params.items()}
    saved_state = copy.deepcopy(optimizer.state_dict())
    run_steps(optimizer, params, steps=2, first_step=3)

    resumed, groups, master = mixed_model(seed=1)  # other initial values, overwritten below
    with torch.no_grad():
        for name, param in resumed.items():
            param.copy_(saved_params[name])
    fresh = MixedPrecisionAdamW(groups, lr=1e-2, seed=5, master_params=master, slice_elements=64,
                                foreach=True)
    fresh.load_state_dict(saved_state)
    run_steps(fresh, resumed, steps=2, first_step=3)
    assert_same_state(fresh, optimizer, resumed, params)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_multi_tensor_update_on_cuda_agrees_with_the_per_parameter_loop():
    """On CUDA the foreach kernels may round float32 differently by ulps, and the rounding noise
    is drawn once per chunk (other Philox offsets than one draw per slice): float32 values agree
    to float32 round-off, bf16 ones within one bf16 step per update."""
    runs = []
    for foreach in (True, False):
        params, groups, master = mixed_model(device="cuda")
        optimizer = MixedPrecisionAdamW(groups, lr=1e-2, weight_decay=0.1, seed=5,
                                        master_params=master, foreach=foreach, slice_elements=64)
        run_steps(optimizer, params, steps=4)
        runs.append((optimizer, params))
    (ours, ours_params), (reference, reference_params) = runs
    bf16_step = 2.0**-7  # bf16 keeps 8 significant bits: neighbours lie 2^-7 |w| apart or closer
    for name, param in ours_params.items():
        other = reference_params[name]
        state, other_state = ours.state[param], reference.state[other]
        for key in ("exp_avg", "exp_avg_sq", "master"):
            if key in state and state[key].dtype == torch.float32:
                torch.testing.assert_close(state[key], other_state[key], rtol=1e-5, atol=1e-7)
        if "master" in state:
            assert torch.equal(param.detach(), state["master"].to(param.dtype)), name
        if param.dtype == torch.float32:
            torch.testing.assert_close(param.detach(), other.detach(), rtol=1e-5, atol=1e-7)
        else:  # stochastic rounding (other draws), or a master rounded to nearest
            a, b = param.detach().float(), other.detach().float()
            scale = torch.maximum(a.abs().max(), b.abs().max())  # values may cross zero
            assert (a - b).abs().max() <= 4 * bf16_step * scale, name  # <= a step per update


def test_optim_fused_builds_torch_fused_adamw_within_round_off():
    """optim.fused=true: torch's fused AdamW for fp32 weights, the default loop's parameters
    within round-off after three steps; refused for bf16 weights (MixedPrecisionAdamW)."""
    from grpo_cli.algorithm.optim import build_optimizer
    from grpo_cli.config.schema import OptimConfig

    generator = torch.Generator().manual_seed(0)
    start = [torch.randn(64, 32, generator=generator), torch.randn(32, generator=generator)]
    grads = [[torch.randn(p.shape, generator=generator) for p in start] for _ in range(3)]
    finals = {}
    for fused in (False, True):
        params = [torch.nn.Parameter(p.clone()) for p in start]
        optimizer = build_optimizer(params, OptimConfig(lr=1e-2, weight_decay=0.1, fused=fused), seed=0)
        assert type(optimizer) is torch.optim.AdamW and bool(optimizer.defaults["fused"]) == fused
        for step_grads in grads:
            for param, grad in zip(params, step_grads, strict=True):
                param.grad = grad.clone()
            optimizer.step()
        finals[fused] = params
    assert not torch.equal(finals[False][0], start[0])  # the steps moved the weights
    for loop, fused in zip(finals[False], finals[True], strict=True):
        torch.testing.assert_close(fused, loop, atol=1e-6, rtol=0)
    with pytest.raises(ValueError, match="optim.fused"):
        build_optimizer([torch.nn.Parameter(torch.zeros(4, dtype=torch.bfloat16))],
                        OptimConfig(fused=True), seed=0)


def test_optim_fused_by_default_for_fp32_weights_and_mixed_precision_for_bf16():
    """optim.fused's default (null, auto): torch's fused AdamW for fp32 weights, the
    mixed-precision AdamW for bf16 weights (which refuses an explicit fused=true above)."""
    from grpo_cli.algorithm.optim import MixedPrecisionAdamW, build_optimizer
    from grpo_cli.config.schema import OptimConfig

    assert OptimConfig().fused is None
    fp32 = build_optimizer([torch.nn.Parameter(torch.zeros(4, 4))], OptimConfig(), seed=0)
    assert type(fp32) is torch.optim.AdamW and fp32.defaults["fused"] is True
    bf16 = build_optimizer([torch.nn.Parameter(torch.zeros(4, 4, dtype=torch.bfloat16))], OptimConfig(), seed=0)
    assert type(bf16) is MixedPrecisionAdamW
    plain = build_optimizer([torch.nn.Parameter(torch.zeros(4, 4))], OptimConfig(fused=False), seed=0)
    assert not plain.defaults["fused"]
