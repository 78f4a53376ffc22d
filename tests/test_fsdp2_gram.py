"""The sharded-sum design on a real FSDP2 run: 2 CPU processes (gloo), `fully_shard` on every
linear layer (issue 44). Each process replays the same global batch through the sharded model,
differentiates to the captured layer outputs (never `.grad`), computes the Gram of its own row
slice of each weight (grpo_cli/integrations/sharded_gram.py) and an all-reduce sums the N x N
parts; the spectrum equals the unsharded one-process run's. Then the TRL callback's own sharded
probe, which splits the same sum by parameter instead of by rows (docs/trl.md "Sharded runs")."""

from __future__ import annotations

import math
import os
import socket
import sys

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
        dist.barrier()  # rank 0's file is written before either process tears down
    finally:
        dist.destroy_process_group()
    exit_without_teardown()


def exit_without_teardown() -> None:
    """End a worker that has finished (its result is on disk) without the interpreter's
    teardown. The DeviceMesh outlives `destroy_process_group` (DTensorSpec objects still hold
    it), so its gloo threads are still running when the interpreter's teardown destroys them:
    "terminate called without an active exception", SIGABRT, in about one worker run of four
    (measured 5 of 20 on 2026-11-29; 0 of 40 with this exit). Reached only when the work
    succeeded: a failing worker raises through its `finally` as before."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


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


# ---- the TRL callback's sharded probe on a fully_shard-ed tiny Llama ------------------------------

MATRICES = ["rollout_batch", "rollout_group", "group_batch", "layer"]


def llama_step():
    """The tiny Llama, one probe step's batch (2 groups of 2, padded) and a loss to train on."""
    from test_probe_runner import padded_batch, step_output, tiny_model

    batch = padded_batch()
    return tiny_model(), batch, step_output(batch, torch.tensor([1.0, 0.0, 0.0, 1.0]))


def trained_probe(model, batch, output, rank: int, processes: int):
    """The TRL callback's `_probe` on `model` after a backward: every process reads `.grad`
    (capture_layer_grads) and computes its share of the per-rollout Grams (shared_grams, in
    lockstep when sharded); rank 0 records. Returns rank 0's ProbeRows."""
    from grpo_cli.config.schema import ProbesConfig
    from grpo_cli.integrations.trl_distributed import shared_grams
    from grpo_cli.probes.per_sample import rollout_objectives
    from grpo_cli.probes.runner import ProbeSuite

    # the loss whose gradient is the per-rollout rows' sum (FSDP2 reduce-scatters it into .grad)
    (rows,) = rollout_objectives(model, batch.input_ids, batch.attention_mask,
                                 [-(output.loss_weights * output.advantages)])  # [N]
    rows.sum().backward()
    output.row_sum_rtol = 1e-6  # so grad_norm_mismatch compares .grad's norm with 1'K1
    suite = ProbeSuite(ProbesConfig(matrices=MATRICES), model, None)
    output.layer_grads = suite.capture_layer_grads()
    if processes > 1:
        output.rollout_grams = shared_grams(suite, 0, output, model, rank, processes, lockstep=True)
    return suite.record(0, output, model) if rank == 0 else None


def llama_worker(rank: int, port: int, out: str) -> None:
    import torch.distributed as dist
    from accelerate import PartialState
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), LOCAL_RANK=str(rank),
                      WORLD_SIZE=str(PROCESSES), LOCAL_WORLD_SIZE=str(PROCESSES))
    state = PartialState(cpu=True)  # the callback's all-reduce is accelerate's: gloo, as under torchrun
    assert dist.is_initialized() and state.num_processes == PROCESSES
    try:
        model, batch, output = llama_step()
        mesh = init_device_mesh("cpu", (PROCESSES,))
        for layer in model.model.layers:  # as accelerate's FSDP2 plugin wraps: each decoder layer, then the root
            fully_shard(layer, mesh=mesh)
        fully_shard(model, mesh=mesh)
        sharded = all(hasattr(p, "full_tensor") for p in model.parameters())
        rows = trained_probe(model, batch, output, rank, PROCESSES)
        if rank == 0:
            torch.save({"rows": rows, "sharded": sharded}, out)
        dist.barrier()  # rank 0's file is written before either process tears down
    finally:
        dist.destroy_process_group()
    exit_without_teardown()


def test_the_callbacks_sharded_probe_records_the_one_process_rows(tmp_path):
    """2 gloo processes, the tiny Llama `fully_shard`-ed per decoder layer and at the root (as
    accelerate's FSDP2 plugin wraps it): the rows rank 0 records (spectra of the per-rollout and
    layer matrices, grad_norms.csv, the metrics: norms, sparsity, mismatch) equal those of one
    unsharded process on the same batch and loss."""
    import torch.distributed as dist
    import torch.multiprocessing as mp

    if not dist.is_available() or not dist.is_gloo_available():
        pytest.skip("torch.distributed with gloo is not available")
    out = tmp_path / "rank0.pt"
    mp.spawn(llama_worker, args=(free_port(), str(out)), nprocs=PROCESSES, join=True)
    saved = torch.load(out, weights_only=False)
    assert saved["sharded"]
    model, batch, output = llama_step()
    one = trained_probe(model, batch, output, 0, 1)
    sharded = saved["rows"]

    assert one.metrics.keys() == sharded.metrics.keys()
    for key, value in one.metrics.items():
        assert sharded.metrics[key] == pytest.approx(value, rel=1e-9, abs=1e-12, nan_ok=True), key
    assert one.metrics["grad_norm_mismatch"] == 0.0 and 0 < one.metrics["grad_sparsity"] < 1
    assert len(one.grad_norms) == len(sharded.grad_norms) > 0
    for mine, theirs in zip(one.grad_norms, sharded.grad_norms, strict=True):
        assert theirs.keys() == mine.keys()
        for key, value in mine.items():
            assert theirs[key] == (value if isinstance(value, str) else pytest.approx(value, rel=1e-9, nan_ok=True))
    spectra = {(r["matrix"], r["layer"], r["group"], r["k"]): r["sigma"] for r in one.spectra}
    assert spectra.keys() == {(r["matrix"], r["layer"], r["group"], r["k"]) for r in sharded.spectra}
    assert {key[0] for key in spectra} == {"rollout_batch", "rollout_group", "group_batch", "layer"}
    for matrix, layer in {(key[0], key[1]) for key in spectra}:
        keys = [key for key in spectra if key[:2] == (matrix, layer)]
        top = max(spectra[key] for key in keys)
        assert top > 0, (matrix, layer)
        gap = max(abs(spectra[key] - r["sigma"]) for r in sharded.spectra for key in keys
                  if key == (r["matrix"], r["layer"], r["group"], r["k"]))
        assert gap <= 1e-6 * top, (matrix, layer, gap / top)
