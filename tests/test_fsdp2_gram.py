"""The sharded-sum design on a real FSDP2 run: 2 CPU processes (gloo), `fully_shard` on every
linear layer (issue 44). Each process replays the same global batch through the sharded model,
differentiates to the captured layer outputs (never `.grad`), computes the Gram of its own row
slice of each weight (grpo_cli/integrations/sharded_gram.py) and an all-reduce sums the N x N
parts; the spectrum equals the unsharded one-process run's. The TRL callback does not do this
yet (docs/trl.md)."""

from __future__ import annotations

import math
import os
import socket

import pytest
import torch
from torch import nn

from grpo_cli.integrations.sharded_gram import ShardLayout, process_gram, row_slice
from grpo_cli.probes.gradient_stats import gradient_metrics
from grpo_cli.probes.rank_measures import singular_values_from_gram

ROLLOUTS, TOKENS, WIDTH, HIDDEN, GROUP, PROCESSES = 6, 3, 4, 5, 3, 2
LINEARS = ("up", "mid", "down")


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.up, self.mid, self.down = nn.Linear(WIDTH, HIDDEN), nn.Linear(HIDDEN, HIDDEN), nn.Linear(HIDDEN, WIDTH)

    def forward(self, x):  # [N, T, WIDTH]
        return self.down(torch.tanh(self.mid(torch.tanh(self.up(x)))))


def build():
    """The same weights and global batch on every process."""
    torch.manual_seed(0)
    net = Net().double()
    x = torch.randn(ROLLOUTS, TOKENS, WIDTH, dtype=torch.float64)
    weights = torch.randn(ROLLOUTS, TOKENS, WIDTH, dtype=torch.float64)
    return net, x, weights


def rollout_losses(net, x, weights):  # [N]
    return (net(x) * weights).sum(dim=(1, 2))


def fsdp2_worker(rank: int, port: int, out: str) -> None:
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=PROCESSES)
    try:
        net, x, weights = build()
        # A CPU mesh by name: without it, fully_shard's default mesh takes cuda:0 wherever CUDA
        # is visible (the H200 report of 2026-11-27), and the CPU inputs meet CUDA shards
        mesh = init_device_mesh("cpu", (PROCESSES,))
        for name in LINEARS:
            fully_shard(getattr(net, name), mesh=mesh)
        fully_shard(net, mesh=mesh)
        inputs, outputs = {}, {}
        for name in LINEARS:
            def hook(module, args, output, name=name):
                inputs[name], outputs[name] = args[0].detach(), output
            getattr(net, name).register_forward_hook(hook)
        total = rollout_losses(net, x, weights).sum()
        output_grads = dict(zip(LINEARS, torch.autograd.grad(total, [outputs[n] for n in LINEARS], retain_graph=True),
                                strict=True))
        untouched = all(p.grad is None for p in net.parameters())
        local_rows_match = True  # FSDP2's own shard is the row slice sharded_gram assumes
        for param in net.parameters():
            whole = param.full_tensor()  # collective: same order on every process
            local_rows_match &= torch.equal(param.to_local(), whole[row_slice(whole.shape[0], rank, PROCESSES)])
        linear = {f"{n}.weight": (inputs[n], output_grads[n]) for n in LINEARS}
        vectors = {f"{n}.bias": output_grads[n].sum(dim=1) for n in LINEARS}
        gram = process_gram(ShardLayout(PROCESSES), rank, linear, vectors, owners={})
        dist.all_reduce(gram)
        total.backward()  # the trainer's own backward: .grad holds this process's shard
        partial = math.sqrt(sum(float(p.grad.to_local().pow(2).sum()) for p in net.parameters()))
        clipped = float(torch.nn.utils.clip_grad_norm_(list(net.parameters()), 1e9))  # DTensor: the whole norm
        if rank == 0:
            torch.save({"gram": gram, "untouched": untouched, "local_rows_match": local_rows_match,
                        "partial": partial, "clipped": clipped}, out)
    finally:
        dist.destroy_process_group()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_fsdp2_row_slice_grams_sum_to_the_one_process_spectrum(tmp_path):
    import torch.distributed as dist
    import torch.multiprocessing as mp

    if not dist.is_available() or not dist.is_gloo_available():
        pytest.skip("torch.distributed with gloo is not available")
    out = tmp_path / "rank0.pt"
    mp.spawn(fsdp2_worker, args=(free_port(), str(out)), nprocs=PROCESSES, join=True)
    sharded = torch.load(out, weights_only=True)

    net, x, weights = build()  # one process, unsharded: per-rollout autograd
    params = list(net.parameters())
    rows = torch.stack([torch.cat([g.reshape(-1) for g in torch.autograd.grad(
        rollout_losses(net, x[i:i + 1], weights[i:i + 1]).sum(), params)]) for i in range(ROLLOUTS)])  # [N, P]
    full = rows @ rows.T
    sigma, sigma_sharded = singular_values_from_gram(full), singular_values_from_gram(sharded["gram"])
    assert (sigma_sharded - sigma).abs().max() <= 1e-6 * sigma[0]
    assert sharded["untouched"] and sharded["local_rows_match"]

    true_norm = float(rows.sum(dim=0).norm())
    assert sharded["clipped"] == pytest.approx(true_norm, rel=1e-10)
    assert sharded["partial"] < true_norm  # rank 0's own shard of .grad
    informative = torch.ones(ROLLOUTS, dtype=torch.bool)
    assert gradient_metrics(sharded["gram"], informative, GROUP, sharded["partial"], 1e-6)["grad_norm_mismatch"] == 1.0
    assert gradient_metrics(sharded["gram"], informative, GROUP, sharded["clipped"], 1e-6)["grad_norm_mismatch"] == 0.0
