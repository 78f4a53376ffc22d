"""The update's trajectory over a run's kept checkpoints: D_t = W_t - W_0 per layer
(trajectory.csv, docs/results.md; `grpo trajectory`, grpo_cli/train/trajectory_run.py).

AlphaRL (arXiv 2510.00553) reports two properties of an LLM's RL update: rank-1 dominance (the
top singular direction of each weight's update carries the gain) and rank-1 linear dynamics (that
direction's part grows linearly over training). RELEX (arXiv 2605.21468) stacks the deltas of the
checkpoints, finds them near rank 1, and extrapolates the coordinate along the first direction,
"whose magnitude evolves near-linearly with training steps", by linear regression. Per layer and
kept step t (T the last kept one; s runs over the kept steps up to t):

    update_norm       ||D_t||_F
    rank1_share       sigma_1(D_t)^2 / ||D_t||_F^2: the energy the best rank-1 approximation of the
                      matrix keeps (= ranks.csv `update` top1_energy_share at the same weights)
    cosine_to_last    <D_t, D_T> / (||D_t|| ||D_T||)
    path_rank1_share  lambda_1 / sum lambda of M = [<D_s, D_u>]_{s,u<=t}: the share of
                      sum_s ||D_s||^2 along the trajectory's best direction V in weight space
                      (uncentred PCA of the stacked vec D_s; W_0, the origin, is on the path);
                      1 iff every D_s is a multiple of one matrix
    path_linearity    R^2 of the least-squares line c ~ a + b step through (0, 0) and the
                      (s, c_s), c_s = <D_s, V> = sqrt(lambda_1) u_1[s] the coordinate along V;
                      1 iff the path moves along V at a constant rate per step

Both path measures need two kept steps (else empty). A layer that never moved has shares 0 (as
every spectrum measure, grpo_cli/measures.py) and no linearity. Layer `all`: every selected
weight together (M summed over layers; no rank1_share, D_t is not one matrix).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import torch

from grpo_cli.measures import top1_energy_share
from grpo_cli.probes.rank_measures import singular_values

ALL_LAYERS = "all"


def path_measures(gram: torch.Tensor, steps: Sequence[int]) -> tuple[float, float]:  # gram [T, T]
    """(path_rank1_share, path_linearity) of a trajectory from its Gram M_su = <D_s, D_u> and the
    kept steps (module docstring)."""
    if len(steps) < 2:
        return math.nan, math.nan
    symmetric = gram.detach().double().cpu()
    eigenvalues, vectors = torch.linalg.eigh((symmetric + symmetric.mT) / 2)  # ascending
    energy = eigenvalues.clamp(min=0.0)
    total = float(energy.sum())
    if total <= 0:
        return 0.0, math.nan
    coordinate = vectors[:, -1] * energy[-1].sqrt()  # [T] c_s = <D_s, V>
    x = torch.tensor([0.0, *map(float, steps)], dtype=torch.float64)
    y = torch.cat([coordinate.new_zeros(1), coordinate])
    x, y = x - x.mean(), y - y.mean()
    spread = float(x.square().sum() * y.square().sum())
    linearity = float((x @ y).square()) / spread if spread > 0 else math.nan  # R^2 = corr^2
    return float(energy[-1]) / total, linearity


def layer_rows(layer: str, steps: Sequence[int], deltas: Sequence[torch.Tensor]) -> tuple[list[dict], torch.Tensor]:
    """trajectory.csv's rows of one weight from its updates D_t [m, n] at the kept steps, and
    the trajectory's Gram M [T, T] (float64; the layers' Grams add up to `all`'s)."""
    flat = [delta.detach().double().reshape(-1) for delta in deltas]  # T views [m n], no stacked copy
    gram = torch.tensor([[float(a @ b) for b in flat] for a in flat], dtype=torch.float64)  # [T, T]
    shares = [top1_energy_share(singular_values(delta.double(), "gram").cpu().numpy()) for delta in deltas]
    return _rows(layer, steps, gram, shares), gram.cpu()


def _rows(layer: str, steps: Sequence[int], gram: torch.Tensor, shares: Sequence[float]) -> list[dict]:
    norms = gram.diagonal().clamp(min=0.0).sqrt()  # [T]
    last = len(steps) - 1
    rows = []
    for t, step in enumerate(steps):
        denominator = float(norms[t] * norms[last])
        share, linearity = path_measures(gram[: t + 1, : t + 1], steps[: t + 1])
        rows.append({
            "step": int(step), "layer": layer, "update_norm": float(norms[t]), "rank1_share": shares[t],
            "cosine_to_last": float(gram[t, last]) / denominator if denominator > 0 else math.nan,
            "path_rank1_share": share, "path_linearity": linearity,
        })
    return rows


def trajectory_rows(
    initial: Mapping[str, torch.Tensor],  # W_0 per selected weight
    steps: Sequence[int],  # the kept steps, ascending
    weights: Sequence[Mapping[str, torch.Tensor]],  # W_t per step (state dicts; may be memory-mapped)
) -> list[dict]:
    """Every row of trajectory.csv: each weight of `initial`, then `all` (module docstring)."""
    if not steps:
        raise ValueError("a trajectory needs at least one kept checkpoint")
    rows, total = [], torch.zeros(len(steps), len(steps), dtype=torch.float64)
    for name, start in initial.items():
        base = start.detach().double()
        deltas = [state[name].detach().double() - base for state in weights]  # each [m, n]
        layer, gram = layer_rows(name, steps, deltas)
        rows.extend(layer)
        total += gram
    rows.extend(_rows(ALL_LAYERS, steps, total, [math.nan] * len(steps)))
    return rows
