"""Gradient statistics of a probe step, read off the per-rollout Gram (docs/results.md).

K_adv [N, N] holds <g_i, g_j> for the rows g_i = -sum_t w_it A_it grad log pi(y_it), which carry
the loss's aggregation weights: their plain sum is the step's gradient over the probed
parameters wherever the loss is the rows' sum (`ProbedStep.row_sum_rtol`). The maths is numpy in
grpo_cli/measures.py; this module turns one step's K into the metrics.csv columns and the
grad_norms.csv rows, and compares the batch norm with the trainer's own (the partial-shard norm
alarm). Per layer: the diagonals of the per-parameter Grams, [P, N], summed over each transformer
block's parameters; and the trainer's batch gradient G over the same layers (grad_norms.csv rows
with no rollout), with the largest layer's share of ||G||^2 in metrics.csv.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence

import torch

from grpo_cli.measures import (
    GRAD_NORM_SUMMARY,
    batch_gradient_norm,
    gradient_snr,
    group_abs_cosine,
    noise_scale,
    norm_summary,
    norms_disagree,
    rollout_gradient_norms,
)
from grpo_cli.probes.gram import group_sum_gram

LAYER_BLOCK = re.compile(r"(.*\blayers\.\d+)\.")  # a transformer block's parameters: one layer


def gradient_metrics(
    gram: torch.Tensor,  # [N, N] K_adv
    informative: torch.Tensor,  # [N] bool: rollouts with a non-zero advantage
    group_size: int,
    trainer_norm: float,  # ||grad|| over the probed parameters, from the trainer's .grad
    rtol: float | None,  # relative round-off between the two; None: not comparable
) -> dict[str, float]:
    """The gradient columns of metrics.csv (grpo_cli/results/writer.py METRIC_COLUMNS)."""
    k = gram.detach().cpu().double()  # [N, N]
    summary = norm_summary(rollout_gradient_norms(k.numpy())[informative.cpu().numpy()])
    batch_norm = batch_gradient_norm(k.numpy())
    mismatch = math.nan if rtol is None else float(norms_disagree(batch_norm, trainer_norm, rtol))
    return {
        **{f"grad_norm_rollout_{name}": summary[name] for name in GRAD_NORM_SUMMARY},
        "grad_norm_batch_gram": batch_norm,
        "grad_norm_probed": trainer_norm,
        "grad_norm_mismatch": mismatch,
        "grad_noise_scale": noise_scale(k.numpy()),
        "grad_noise_scale_groups": noise_scale(group_sum_gram(k, group_size).numpy()),
        "grad_group_abs_cosine": group_abs_cosine(k.numpy(), group_size),
        "grad_snr": gradient_snr(k.numpy()),
    }


def mismatch_message(step: int, metrics: dict[str, float], rtol: float) -> str:
    """The warning line of a step whose two batch norms disagree."""
    gram_norm, trainer_norm = metrics["grad_norm_batch_gram"], metrics["grad_norm_probed"]
    ratio = trainer_norm / gram_norm if gram_norm > 0 else math.inf
    return (f"step {step}: the gradient norm over the probed parameters is {trainer_norm:.6g} by "
            f"the trainer but {gram_norm:.6g} from the per-rollout Gram (ratio {ratio:.4g}, "
            f"tolerance {rtol:g}): a partial norm (one shard's of a sharded model) or a gradient "
            "the rows do not add up to")


def layer_squares(names: Sequence[str], diagonals: torch.Tensor) -> dict[str, torch.Tensor]:
    """{layer: ||g_i||^2 over its parameters [N]} from each parameter's K_adv diagonal
    (diagonals [P, N], rows in `names` order): one transformer block's parameters
    (`...layers.<k>`) together, each parameter outside the blocks on its own."""
    layers: dict[str, torch.Tensor] = {}
    for name, diagonal in zip(names, diagonals.detach().double().cpu(), strict=True):
        block = LAYER_BLOCK.match(name)
        key = block.group(1) if block else name
        layers[key] = layers[key] + diagonal if key in layers else diagonal.clone()
    return layers


def rollout_rows(
    step: int,
    squares: dict[str, torch.Tensor],  # layer -> [N] squared norms ("all": K_adv's diagonal)
    group_size: int,
    rewards: list[float],  # [N]
    advantages: list[float] | None,  # [N] each rollout's advantage; None: per-token advantages
) -> list[dict]:
    """grad_norms.csv rows (GRAD_NORM_COLUMNS): one per layer and rollout."""
    rows = []
    for layer, square in squares.items():
        for i, norm in enumerate(square.clamp(min=0).sqrt().tolist()):
            rows.append({"step": step, "layer": layer, "rollout": i, "group": i // group_size,
                         "reward": rewards[i], "advantage": math.nan if advantages is None else advantages[i],
                         "grad_norm": norm})
    return rows


def layer_batch_norms(
    step: int,
    names: Sequence[str],
    squares: torch.Tensor,  # [P] ||G_p||^2 of the trainer's batch gradient, rows in `names` order
) -> tuple[list[dict], dict[str, float]]:
    """The batch gradient per layer: grad_norms.csv rows with no rollout, ||G_l|| over each
    layer's probed parameters (the layers of `layer_squares`) and over all of them (`all`, which is
    `grad_norm_probed`); and metrics.csv's grad_norm_layer_max_share = max_l ||G_l||^2 / ||G||^2
    (NaN when G = 0)."""
    layers = {layer: float(square) for layer, square in layer_squares(names, squares.unsqueeze(1)).items()}
    total = float(squares.double().sum())
    rows = [{"step": step, "layer": layer, "grad_norm": math.sqrt(max(square, 0.0))}
            for layer, square in {"all": total, **layers}.items()]
    share = max(layers.values()) / total if total > 0 else math.nan
    return rows, {"grad_norm_layer_max_share": share}
