"""The sharded-sum logic of grpo_cli/integrations/sharded_gram.py on simulated shards, in one
process, against per-rollout autograd on the unsharded float64 model (issue 44)."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from grpo_cli.integrations.sharded_gram import ShardLayout, owned_rows, process_gram, row_slice
from grpo_cli.measures import batch_gradient_norm
from grpo_cli.probes.gradient_stats import gradient_metrics

ROLLOUTS, TOKENS, WIDTH, HIDDEN, GROUP = 6, 3, 4, 5, 3  # 5 hidden rows: uneven splits


class TiedNet(nn.Module):
    """A weight used twice under two names (a tied embedding / lm_head), two biased linears."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Linear(WIDTH, WIDTH, bias=False)
        self.up = nn.Linear(WIDTH, HIDDEN)
        self.down = nn.Linear(HIDDEN, WIDTH)
        self.head = self.embed  # tied

    def forward(self, x):  # [N, T, WIDTH] -> [N, T, WIDTH]
        return self.head(self.down(torch.tanh(self.up(torch.tanh(self.embed(x))))))


def rollout_losses(net, x, weights):  # [N]: f_i = sum_t w_it . out_it
    return (net(x) * weights).sum(dim=(1, 2))


@pytest.fixture(scope="module")
def case():
    torch.manual_seed(0)
    net = TiedNet().double()
    x = torch.randn(ROLLOUTS, TOKENS, WIDTH, dtype=torch.float64)
    weights = torch.randn(ROLLOUTS, TOKENS, WIDTH, dtype=torch.float64)
    params = dict(net.named_parameters())  # the tied weight once, as "embed.weight"
    rows = []  # reference: one autograd gradient per rollout, flattened over every parameter
    for i in range(ROLLOUTS):
        grads = torch.autograd.grad(rollout_losses(net, x[i:i + 1], weights[i:i + 1]).sum(), list(params.values()))
        rows.append(torch.cat([g.reshape(-1) for g in grads]))
    reference = torch.stack(rows)  # [N, P]

    # what a process captures: each linear's inputs and the gradient to its outputs, every use's
    # tokens side by side; differentiated to the outputs, .grad never touched
    inputs, outputs = {}, {}
    def keep(name):
        def hook(module, args, output):
            inputs.setdefault(name, []).append(args[0].detach())
            outputs.setdefault(name, []).append(output)
        return hook
    for name in ("embed", "up", "down"):
        getattr(net, name).register_forward_hook(keep(name))
    total = rollout_losses(net, x, weights).sum()
    captured = [out for name in ("embed", "up", "down") for out in outputs[name]]
    grads = iter(torch.autograd.grad(total, captured))
    output_grads = {name: [next(grads) for _ in outputs[name]] for name in ("embed", "up", "down")}
    assert all(p.grad is None for p in net.parameters())
    linear = {f"{name}.weight": (torch.cat(inputs[name], dim=1), torch.cat(output_grads[name], dim=1))
              for name in ("embed", "up", "down")}
    vectors = {f"{name}.bias": linear[f"{name}.weight"][1].sum(dim=1) for name in ("up", "down")}  # [N, rows]
    return dict(net=net, params=params, reference=reference, linear=linear, vectors=vectors)


def test_row_slice_is_fsdp2_chunk_split():
    for rows in range(10):
        for shards in range(1, 5):
            chunks = [len(c) for c in torch.chunk(torch.arange(rows), shards)] if rows else []
            expected = chunks + [0] * (shards - len(chunks))
            sizes = [row_slice(rows, s, shards).stop - row_slice(rows, s, shards).start for s in range(shards)]
            assert sizes == expected, (rows, shards)


@pytest.mark.parametrize("layout", [ShardLayout(1), ShardLayout(2), ShardLayout(3), ShardLayout(shards=2, replicas=2)],
                         ids=["1", "fsdp2", "fsdp3-uneven", "hsdp2x2"])
def test_shard_grams_sum_to_the_full_gram(case, layout):
    full = case["reference"] @ case["reference"].T  # [N, N]
    parts = [process_gram(layout, rank, case["linear"], case["vectors"], owners={}) for rank in range(layout.processes)]
    assert torch.allclose(sum(parts), full, rtol=1e-12, atol=1e-12 * float(full.abs().max()))
    for rank in range(layout.processes):
        if layout.position(rank)[0] > 0:  # an HSDP replica: counted once, by replica 0
            assert torch.equal(parts[rank], torch.zeros_like(full))
    if layout.shards > 1:  # no one shard holds the whole
        assert all(not torch.allclose(part, full) for part in parts)


def test_own_layers_and_whole_parameters_counted_once(case):
    full = case["reference"] @ case["reference"].T
    layout = ShardLayout(shards=3)
    owners = {"up.weight": 1, "up.bias": 1, "down.bias": 2}  # whole on one process (its own layer)
    parts = [process_gram(layout, rank, case["linear"], case["vectors"], owners) for rank in range(3)]
    assert torch.allclose(sum(parts), full, rtol=1e-12, atol=1e-12 * float(full.abs().max()))
    assert owned_rows(layout, 0, HIDDEN, owner=1) is None
    assert owned_rows(layout, 1, HIDDEN, owner=1) == slice(0, HIDDEN)


def test_tied_weight_under_both_names_would_count_twice(case):
    full = case["reference"] @ case["reference"].T
    both = dict(case["linear"], **{"head.weight": case["linear"]["embed.weight"]})
    doubled = process_gram(ShardLayout(1), 0, both, case["vectors"], owners={})
    tied = process_gram(ShardLayout(1), 0, {"embed.weight": case["linear"]["embed.weight"]}, {}, owners={})
    assert torch.allclose(doubled, full + tied)
    assert float(tied.diagonal().min()) > 0  # so counting it twice is visible


def test_partial_shard_norm_is_too_small_and_raises_the_alarm(case):
    full = case["reference"] @ case["reference"].T
    grad = case["reference"].sum(dim=0)  # [P] the batch gradient
    true_norm = float(grad.norm())
    assert batch_gradient_norm(full.numpy()) == pytest.approx(true_norm, rel=1e-12)
    layout = ShardLayout(2)
    params = list(case["params"].values())
    blocks = [g.reshape(p.shape) for g, p in zip(grad.split([p.numel() for p in params]), params, strict=True)]
    partials = []
    for rank in range(layout.processes):  # the norm of what each process's .grad shard holds
        squares = sum(float(block[owned_rows(layout, rank, block.shape[0], owner=None)].pow(2).sum())
                      for block in blocks)
        part = process_gram(layout, rank, case["linear"], case["vectors"], owners={})
        assert squares == pytest.approx(float(part.sum()), rel=1e-10)  # 1'K_p 1: the shard's share
        partials.append(math.sqrt(squares))
    # the shards' squares add up: their root-mean-square is the true norm / sqrt(shards)
    rms = math.sqrt(sum(p * p for p in partials) / layout.shards)
    assert rms == pytest.approx(true_norm / math.sqrt(layout.shards), rel=1e-10)
    informative = torch.ones(ROLLOUTS, dtype=torch.bool)
    for partial in partials:
        assert partial < true_norm
        metrics = gradient_metrics(full, informative, GROUP, trainer_norm=partial, rtol=1e-6)
        assert metrics["grad_norm_mismatch"] == 1.0
    reduced = gradient_metrics(full, informative, GROUP, trainer_norm=true_norm, rtol=1e-6)
    assert reduced["grad_norm_mismatch"] == 0.0
