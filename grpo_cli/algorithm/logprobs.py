"""Per-token log-probs and entropies of a causal LM from one forward pass."""

from __future__ import annotations

import inspect

import torch


def token_logprobs_and_entropy(
    logits: torch.Tensor,  # [N, L, V] logits[:, t] predicts token t+1
    input_ids: torch.Tensor,  # [N, L]
) -> tuple[torch.Tensor, torch.Tensor]:
    """Return (logprobs [N, L], entropy [N, L]) aligned with input_ids; column 0 is zero.

    logprobs[:, t] = log p(input_ids[:, t] | input_ids[:, :t]); entropy[:, t] is the entropy of that
    predictive distribution. Computed in float32 whatever the logits dtype. The entropy carries no
    gradient (it is recorded, never optimised).
    """
    shifted = logits[:, :-1].float()  # [N, L-1, V]
    log_norm = torch.logsumexp(shifted, dim=-1)  # [N, L-1]
    targets = input_ids[:, 1:].unsqueeze(-1)  # [N, L-1, 1]
    picked = shifted.gather(-1, targets).squeeze(-1) - log_norm  # [N, L-1]
    with torch.no_grad():  # entropy is a metric: no graph, so no [N, L, V] tensors kept for backward
        log_p = shifted - log_norm.unsqueeze(-1)  # [N, L-1, V]
        entropy = -(log_p.exp() * log_p).sum(-1)  # [N, L-1]
    pad = picked.new_zeros(picked.shape[0], 1)
    return torch.cat([pad, picked], dim=1), torch.cat([pad, entropy], dim=1)


def token_logprobs(
    model: torch.nn.Module,
    input_ids: torch.Tensor,  # [N, L]
    attention_mask: torch.Tensor,  # [N, L]
) -> torch.Tensor:  # [N, L]
    """log p_theta(input_ids[:, t] | prefix) for every column (column 0 is zero)."""
    position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)
    logits = model(
        input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids
    ).logits
    return token_logprobs_and_entropy(logits, input_ids)[0]


def accepts_logits_to_keep(model: torch.nn.Module) -> bool:
    """Whether `model(...)` takes transformers' `logits_to_keep` (logits of the last k columns)."""
    return "logits_to_keep" in inspect.signature(model.forward).parameters
