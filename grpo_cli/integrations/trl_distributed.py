"""The TRL callback under DDP (`accelerate launch --num_processes N`): every process sees the
global batch, each computes a share of the per-rollout Grams, the main process records.

TRL hands each process N / P consecutive rows of the optimizer step's N rollouts (a group may
sit on two processes), with advantages computed over all N. The probes need every pair of rows,
so the callback

1. gathers every process's rows (`gather_rows`): token ids, masks, advantages and loss weights,
   padded to common lengths (prompts on the left, completions on the right), in process order,
   i.e. the order of the global batch. Nothing model-sized crosses processes;
2. splits the Gram's work by parameter (`parameter_share`): K = sum over parameters of each
   parameter's Gram, so process p computes the Gram of its share of `probes.param_regex` over
   all N rows (the existing Gram code, on the unwrapped, DDP-replicated model, with
   `torch.autograd.grad`: no DDP hook fires and `.grad` is untouched), and an all-reduce sums
   the shares (N x N float64 entries);
3. lets the main process do the SVDs and write the run directory (it alone holds the run lock).

Row-block splits would need both rows' activations on one process for every off-diagonal
block, so each process would run the whole batch anyway; the parameter split does the same
forward on every process and divides the backward's per-parameter Gram products.

Positions: TRL's forward passes no position_ids, so a row's positions count from its process's
own left padding; the gathered batch pads prompts to the longest prompt over all processes.
With rotary position embeddings (Llama, Qwen, SmolLM) a common shift of every position changes
nothing but rounding; models with absolute position embeddings would see shifted positions.
"""

from __future__ import annotations

import torch
from torch import nn

from grpo_cli.integrations.trl_batch import ROW_FIELDS
from grpo_cli.probes.runner import ProbeSuite
from grpo_cli.probes.step import ProbedStep


def gather_rows(rows: dict[str, torch.Tensor], pad_token_id: int) -> dict[str, torch.Tensor]:
    """Every process's `trl_rows`, padded to common lengths and concatenated in process order."""
    from accelerate.utils import gather, pad_across_processes

    gathered = {}
    for name, (pad_value, left) in ROW_FIELDS.items():
        value = pad_token_id if pad_value is None else pad_value
        padded = pad_across_processes(rows[name].contiguous(), dim=1, pad_index=value, pad_first=left)
        gathered[name] = gather(padded)
    return gathered


def parameter_share(params: dict[str, nn.Parameter], rank: int, processes: int) -> dict[str, nn.Parameter]:
    """Process `rank`'s parameters: largest first, each to the process with the fewest elements
    so far (the same split on every process)."""
    load = [0] * processes
    share = {}
    for name, param in sorted(params.items(), key=lambda item: (-item[1].numel(), item[0])):
        owner = min(range(processes), key=lambda p: (load[p], p))
        load[owner] += param.numel()
        if owner == rank:
            share[name] = param
    return share


def sum_over_processes(grams: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The Gram shares of every process, summed (an all-reduce; every process gets the sum)."""
    from accelerate.utils import reduce

    return {key: reduce(value.contiguous(), reduction="sum") for key, value in grams.items()}


def shared_grams(probes: ProbeSuite, step: int, output: ProbedStep, forward: nn.Module, rank: int,
                 processes: int, lockstep: bool = False) -> dict[str, torch.Tensor]:
    """The per-rollout Grams of the global batch `output`: process `rank`'s parameter share
    (`ProbeSuite.rollout_grams(params=...)`), summed over the processes; every process calls it.

    `lockstep` (FSDP2): every process hooks and differentiates every probed parameter, so that
    all run the same forward and backward through the sharded model (each layer's all-gathers
    are collectives), and computes the Grams of its share only (`rollout_grams(own=...)`).
    """
    batch = output.batch
    share = parameter_share(probes.gram_params, rank, processes)
    if lockstep:
        grams = probes.rollout_grams(step, batch, output.loss_weights, output.advantages, forward, own=set(share))
    elif share:
        grams = probes.rollout_grams(step, batch, output.loss_weights, output.advantages, forward, params=share)
    else:  # more processes than parameters
        rows, size = batch.num_rollouts, batch.group_size
        device = next(iter(probes.gram_params.values())).device
        grams = {"advantage": torch.zeros(rows, rows, dtype=torch.float64, device=device),
                 "score_blocks": torch.zeros(rows // size, size, size, dtype=torch.float64, device=device),
                 "param_diagonals": torch.zeros(len(probes.gram_params), rows, dtype=torch.float64, device=device)}
    return sum_over_processes(grams)
