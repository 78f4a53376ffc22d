"""The output head's and the input embedding's share of the gradient's squared norm (DGG,
arXiv 2605.19425: the lm_head gradient's norm bounds how far one update moves the policy).

    grad_share_head_embedding = (||g_head||^2 + ||g_embedding||^2) / ||g||^2
    grad_share_head           = ||g_head||^2 / ||g||^2
    grad_share_embedding      = ||g_embedding||^2 / ||g||^2

g is the step's gradient before clipping (||g|| = metrics.csv `grad_norm`), g_head the gradient of
the output head's parameters (`get_output_embeddings()`), g_embedding the input embedding's.

A tied head (SmolLM2, `tie_word_embeddings`) is one parameter, counted once: its `.grad` is the sum
of what the head and the embedding lookup give it, which no `.grad` separates. Then
`grad_share_head_embedding` is that parameter's share, and the two parts are NaN (empty cells).
A model with neither has NaN throughout; a zero gradient (||g|| = 0) leaves every share NaN.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from grpo_cli.runtime.sharded import whole

HEAD_SHARE_COLUMNS = ("grad_share_head_embedding", "grad_share_head", "grad_share_embedding")


def _own_parameters(module: nn.Module | None) -> list[torch.Tensor]:
    return [] if module is None else [p for p in module.parameters() if p.requires_grad]


def head_and_embedding(model: nn.Module) -> tuple[list[torch.Tensor], list[torch.Tensor], bool]:
    """(head parameters, embedding parameters, tied): the tied weight, where the two share it,
    sits in the head's list alone."""
    head = _own_parameters(model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None)
    embedding = _own_parameters(model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else None)
    head_ids = {id(p) for p in head}
    tied = any(id(p) in head_ids for p in embedding)
    return head, [p for p in embedding if id(p) not in head_ids], tied


def _squares(params: list[torch.Tensor], device: torch.device) -> torch.Tensor:  # 0-d float64
    total = torch.zeros((), dtype=torch.float64, device=device)
    for p in params:
        if p.grad is not None:
            total = total + whole(p.grad.detach().double().square().sum())
    return total


def head_gradient_squares(model: nn.Module) -> torch.Tensor:  # [3] float64, on the weights' device
    """(||g_head||^2 + ||g_embedding||^2, ||g_head||^2, ||g_embedding||^2) of the current `.grad`
    (tied: the first only, the parts NaN; no head nor embedding: NaN). No host read; under FSDP2
    a collective (every process calls it)."""
    head, embedding, tied = head_and_embedding(model)
    device = next(model.parameters()).device
    if not head and not embedding:
        return torch.full((3,), math.nan, dtype=torch.float64, device=device)
    head_sq, embedding_sq = _squares(head, device), _squares(embedding, device)
    if tied:
        nan = head_sq.new_full((), math.nan)
        return torch.stack([head_sq + embedding_sq, nan, nan])
    return torch.stack([head_sq + embedding_sq, head_sq, embedding_sq])


def head_shares(squares, grad_norm: float) -> dict[str, float]:
    """HEAD_SHARE_COLUMNS from `head_gradient_squares`' three values and ||g||; NaN where ||g||
    is 0 or not finite (no gradient to share) or the squares are not measured (None).

    >>> head_shares([1.0, 0.25, 0.75], 2.0)["grad_share_head"]
    0.0625
    """
    if squares is None or not math.isfinite(grad_norm) or grad_norm <= 0:
        return dict.fromkeys(HEAD_SHARE_COLUMNS, math.nan)
    total = grad_norm * grad_norm
    return {column: float(value) / total for column, value in zip(HEAD_SHARE_COLUMNS, squares, strict=True)}
