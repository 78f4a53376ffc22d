"""The per-rollout Gram of a sharded model as a sum of per-process parts (issue 44).

FSDP2 (`torch.distributed.fsdp.fully_shard`) splits every weight by rows over the processes of
a shard group (`Shard(0)`: process s holds the rows `torch.chunk` gives it) and, under HSDP,
repeats that split on `replicas` copies; rank = replica * shards + shard. The per-rollout
gradient of a weight is the stack of its row slices' gradients, so for every pair of rollouts

    <g_i, g_j> = sum over shards s of <g_i[rows_s], g_j[rows_s]>

and the N x N Gram of the whole model is the sum over processes of the Grams of what each one
owns: its row slice of each sharded weight, every parameter it alone holds (its own layers),
and nothing of a parameter another process already counts (an HSDP replica; a weight every
process holds whole, which the shard-0 process counts; a tied weight, counted under one name).
An all-reduce (sum) of the N x N parts then gives every process the whole K.

For a linear weight the row slice's Gram needs only the slice of the output gradient: with the
layer's inputs A_i [T, a] and output gradients B_i [T, b] of rollout i (ghost identity,
grpo_cli/probes/gram.py), g_i[rows] = B_i[:, rows]^T A_i and

    <g_i[rows], g_j[rows]> = sum_{t,s} (A_i,t . A_j,s) (B_i,t[rows] . B_j,s[rows]).

The logged gradient norm under FSDP2 is the other side of the same sum: a process's own
squared norm is only its slice's share of 1'K1, so a norm taken before the all-reduce is
too small (by sqrt(shards) when the squares spread evenly) and `grad_norm_mismatch`
(grpo_cli/probes/gradient_stats.py) flags it.

These are plain functions on captured tensors, the row-slice form of the sum. The TRL callback
under FSDP2 splits the same sum by parameter instead (trl_distributed.shared_grams with
lockstep: every process captures every layer's whole inputs and output gradients, as the
forward runs on gathered weights, and takes the whole Grams of its parameter share), which
needs no row-slice form of embeddings or norm weights. Tied weights and HSDP replicas are
counted once there by construction (the share is over parameter names, and a tied weight has
one; DTensor reduces replicated norms once), though HSDP was not run here. The logged norm is
read whole (runtime/sharded.whole), so the alarm above stays quiet.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class ShardLayout:
    """Processes as FSDP2 / HSDP place them: `replicas` copies of a `shards`-way row split."""

    shards: int  # processes one weight's rows are split over
    replicas: int = 1  # HSDP's replicate dimension (1: plain FSDP)

    @property
    def processes(self) -> int:
        return self.shards * self.replicas

    def position(self, rank: int) -> tuple[int, int]:
        """(replica, shard) of process `rank`."""
        if not 0 <= rank < self.processes:
            raise ValueError(f"rank {rank} outside {self.processes} processes")
        return divmod(rank, self.shards)


def row_slice(rows: int, shard: int, shards: int) -> slice:
    """The rows shard `shard` of `shards` holds under `Shard(0)`: torch.chunk's split
    (ceil(rows / shards) each, the last ones shorter or empty).

    >>> row_slice(5, 1, 2), row_slice(5, 1, 4), row_slice(2, 3, 4)
    (slice(3, 5, None), slice(2, 4, None), slice(2, 2, None))
    """
    size = -(-rows // shards)
    return slice(min(shard * size, rows), min((shard + 1) * size, rows))


def owned_rows(layout: ShardLayout, rank: int, rows: int, owner: int | None) -> slice | None:
    """The rows of a parameter that process `rank` counts in the Gram sum, None for none.

    owner None: the parameter is row-split over the shard group (FSDP2) and each shard counts
    its slice; otherwise it is whole on shard `owner` (its own layer, or a weight every process
    holds, whose share `trl_distributed.parameter_share` assigns) and that shard counts it all.
    Only replica 0 counts anything: HSDP's replicas hold the same weights and see the same
    (gathered) batch.
    """
    replica, shard = layout.position(rank)
    if replica != 0:
        return None
    if owner is None:
        return row_slice(rows, shard, layout.shards)
    return slice(0, rows) if shard == owner else None


def row_slice_gram(
    inputs: torch.Tensor,  # [N, T, a] a linear layer's inputs per rollout (every use's tokens)
    output_grads: torch.Tensor,  # [N, T, b] d loss / d output at the same tokens
    rows: slice,  # the weight's output rows (b) this process holds
) -> torch.Tensor:  # [N, N] float64
    """<g_i[rows], g_j[rows]> for a linear weight W [b, a] by the ghost identity, no [N, b, a]."""
    a = inputs.double()
    b = output_grads[..., rows].double()
    token_inputs = torch.einsum("ita,jsa->ijts", a, a)  # [N, N, T, T]
    token_grads = torch.einsum("itb,jsb->ijts", b, b)  # [N, N, T, T]
    return (token_inputs * token_grads).sum(dim=(2, 3))


def vector_slice_gram(
    rollout_grads: torch.Tensor,  # [N, rows, ...] a parameter's per-rollout gradients
    rows: slice,
) -> torch.Tensor:  # [N, N] float64
    """<g_i[rows], g_j[rows]> from formed per-rollout gradients (biases, norm weights)."""
    flat = rollout_grads[:, rows].double().flatten(start_dim=1)  # [N, rows * ...]
    return flat @ flat.T


def process_gram(
    layout: ShardLayout,
    rank: int,
    linear: dict[str, tuple[torch.Tensor, torch.Tensor]],  # name -> (inputs [N,T,a], output_grads [N,T,b])
    vectors: dict[str, torch.Tensor],  # name -> per-rollout gradients [N, rows, ...]
    owners: dict[str, int],  # name -> the shard holding it whole; names not here are row-split
) -> torch.Tensor:  # [N, N] float64
    """Process `rank`'s part of the per-rollout Gram; the sum over every process is K.

    A tied weight must appear once (under one name): its captured tokens are every use's.
    """
    parts = [
        (name, factors[1].shape[-1], lambda rows, f=factors: row_slice_gram(*f, rows)) for name, factors in linear.items()
    ] + [(name, grads.shape[1], lambda rows, g=grads: vector_slice_gram(g, rows)) for name, grads in vectors.items()]
    rollouts = next(iter(linear.values()))[0].shape[0] if linear else next(iter(vectors.values())).shape[0]
    total = torch.zeros(rollouts, rollouts, dtype=torch.float64)
    for name, rows, gram in parts:
        mine = owned_rows(layout, rank, rows, owners.get(name))
        if mine is not None and mine.stop > mine.start:
            total += gram(mine)
    return total
