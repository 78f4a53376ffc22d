"""What a non-finite loss or gradient norm says about where the NaN or inf came from.

A step stops on a non-finite loss or gradient norm before any weight moves (pass_reading.py
`read_pass`). The bare number does not say where to look: a NaN in the rollout (the sampler's
log-probs or tokens), in the training forward (its log-probs, possibly only where the completion
mask hides them from the loss but not from the backward: 0 * NaN is NaN), in the advantages, or in
the gradients of some layers only. This module reads those tensors once, on the failure path
only (its host reads cost nothing on a step that goes on), and says which are finite.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

from grpo_cli.rollout.batch import RolloutBatch

NAMED = 4  # gradients named in the message; the rest are counted


def _count(values: torch.Tensor, where: torch.Tensor | None = None) -> tuple[int, int]:
    """(NaN entries, inf entries) of `values`, within `where` (bool, same shape) if given."""
    nan, inf = torch.isnan(values), torch.isinf(values)
    if where is not None:
        nan, inf = nan & where, inf & where
    return int(nan.sum()), int(inf.sum())


def _describe(nan: int, inf: int) -> str:
    parts = [f"{nan} NaN" if nan else "", f"{inf} inf" if inf else ""]
    return ", ".join(part for part in parts if part) or "finite"


def gradient_report(named_parameters: Iterable[tuple[str, torch.Tensor]], norm_failed: bool = False) -> str:
    """Which parameters' gradients hold a NaN or inf: 'non-finite gradients in 2 of 20 tensors:
    lm_head.weight (3 NaN of 4096); ...', or that every gradient is finite (with `norm_failed`,
    the step stopped on the norm: then the norm itself overflowed)."""
    with_grad = [(name, p.grad) for name, p in named_parameters if p.grad is not None]
    bad = []
    for name, grad in with_grad:
        nan, inf = _count(grad.detach())
        if nan or inf:
            bad.append(f"{name} ({_describe(nan, inf)} of {grad.numel()})")
    if not with_grad:
        return "no parameter has a gradient"
    if not bad:
        overflow = " (their norm overflowed: lower optim.lr)" if norm_failed else ""
        return f"every gradient of the {len(with_grad)} tensors is finite{overflow}"
    named = "; ".join(bad[:NAMED]) + (f"; and {len(bad) - NAMED} more" if len(bad) > NAMED else "")
    return f"non-finite gradients in {len(bad)} of {len(with_grad)} tensors: {named}"


def batch_report(batch: RolloutBatch, policy_logprobs: torch.Tensor | None,
                 advantages: torch.Tensor | None, vocab_size: int | None) -> str:
    """Which of the step's inputs hold a NaN or inf, on the completion tokens that count (the
    loss reads them) and elsewhere (the backward may still: 0 * NaN is NaN). `policy_logprobs`
    [N, L] are the training forward's (None: not computed yet); `advantages` [N, L]."""
    counted = batch.completion_mask.bool()  # [N, L]
    parts = [f"sampler log-probs {_describe(*_count(batch.sampler_logprobs.detach(), counted))}"]
    if policy_logprobs is not None:
        on = _describe(*_count(policy_logprobs, counted))
        off = _describe(*_count(policy_logprobs, ~counted))
        parts.append(f"the training forward's log-probs {on} on completion tokens, {off} elsewhere")
    if advantages is not None:
        parts.append(f"advantages {_describe(*_count(advantages.detach(), counted))}")
    if vocab_size is not None:
        ids = batch.input_ids
        outside = int(((ids < 0) | (ids >= vocab_size)).sum())
        parts.append(f"token ids outside the vocabulary ({vocab_size}): {outside}")
    return "the batch: " + "; ".join(parts)
