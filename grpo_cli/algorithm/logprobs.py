"""Per-token log-probs and entropies of a causal LM from one forward pass.

At paper scale the logits dominate the training forward's memory: a micro-batch of 2 rollouts of
~760 tokens over Nemotron's 256,000-token vocabulary is [2, 760, 256000], 1.5 GB in float32 for
each of the logits, their log-softmax terms and, in backward, their gradient. `logprobs_from_hidden`
takes the final hidden states instead and runs lm_head + log-softmax + gather + entropy over chunks
of positions, each chunk under `torch.utils.checkpoint`, so at most one chunk's [N, c, V] logits
exist at a time, in forward and in backward (where the chunk's logits are recomputed). Values are
those of `token_logprobs_and_entropy` (the same float32 operations per position); the lm_head
gradient is summed over chunks, so it agrees to float32 rounding.
"""

from __future__ import annotations

import inspect

import torch
from torch.utils.checkpoint import checkpoint

# Causal LMs whose forward is exactly `logits = lm_head(decoder(...).last_hidden_state)` in
# transformers 5.x (checked in their modeling files): no soft-capping or logit scaling, so
# log-probs can be taken from the decoder's hidden states chunk by chunk. Others (Gemma 2, Cohere,
# Granite, ...) take the full-logits path.
PLAIN_HEAD_MODEL_TYPES = frozenset(
    {"llama", "mistral", "nemotron", "qwen2", "qwen3", "phi3", "olmo2", "smollm3", "gemma"}
)


def log_softmax_terms(
    logits: torch.Tensor,  # [N, T, V] logits[:, t] is the distribution of targets[:, t]
    targets: torch.Tensor,  # [N, T]
    block_rows: int | None = None,  # positions per block (None: CPU_BLOCK_BYTES on a CPU, one on CUDA)
) -> tuple[torch.Tensor, torch.Tensor]:  # (logprobs [N, T], entropy [N, T]) in float32
    """log p(targets) under softmax(logits) and the entropy of that distribution, in float32.

    The entropy carries no gradient (it is recorded, never optimised), so no [N, T, V] tensors are
    kept for its backward. On a CPU the positions run in blocks of ~CPU_BLOCK_BYTES of logits
    (`block_rows` positions, if given): every step of the log-softmax, forward and backward,
    then works on a few MiB that the allocator reuses, instead of fresh [N, T, V] tensors whose
    first touch the kernel pays per page (SmolLM2's one head pass, 565 x 49,152 logits: ~1.2 s
    of forward and backward in one block, ~0.5 s in blocks). Each position's values and
    gradient are computed by the same operations either way, so the results are identical.
    """
    scores = logits.float()  # [N, T, V]
    positions = scores.shape[0] * scores.shape[1]
    if block_rows is None:  # CUDA's caching allocator reuses its blocks: one block there
        on_cpu = scores.device.type == "cpu"
        block_rows = max(1, CPU_BLOCK_BYTES // (4 * scores.shape[-1])) if on_cpu else positions
    if positions <= block_rows:
        return _log_softmax_block(scores, targets)
    flat, flat_targets = scores.reshape(positions, -1), targets.reshape(positions)
    parts = [_log_softmax_block(block, block_targets)  # split: one gradient buffer in backward
             for block, block_targets in zip(flat.split(block_rows), flat_targets.split(block_rows), strict=True)]
    return tuple(torch.cat([part[i] for part in parts]).reshape(targets.shape) for i in range(2))


CPU_BLOCK_BYTES = 4 << 20  # float32 logits per block of log_softmax_terms on a CPU


def _log_softmax_block(scores: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """`log_softmax_terms` of float32 `scores` [..., V] in one block."""
    log_norm = torch.logsumexp(scores, dim=-1)  # [...]
    picked = scores.gather(-1, targets.unsqueeze(-1)).squeeze(-1) - log_norm  # [...]
    with torch.no_grad():
        log_p = scores - log_norm.unsqueeze(-1)  # [..., V]
        entropy = -(log_p.exp() * log_p).sum(-1)  # [...]
    return picked, entropy


def token_logprobs_and_entropy(
    logits: torch.Tensor,  # [N, L, V] logits[:, t] predicts token t+1
    input_ids: torch.Tensor,  # [N, L]
) -> tuple[torch.Tensor, torch.Tensor]:
    """Return (logprobs [N, L], entropy [N, L]) aligned with input_ids; column 0 is zero.

    logprobs[:, t] = log p(input_ids[:, t] | input_ids[:, :t]); entropy[:, t] is the entropy of that
    predictive distribution. Computed in float32 whatever the logits dtype.
    """
    picked, entropy = log_softmax_terms(logits[:, :-1], input_ids[:, 1:])  # [N, L-1] each
    pad = picked.new_zeros(picked.shape[0], 1)
    return torch.cat([pad, picked], dim=1), torch.cat([pad, entropy], dim=1)


def logits_head(model: torch.nn.Module) -> torch.nn.Module | None:
    """The output projection when the model's logits are exactly `head(decoder(...)
    .last_hidden_state)` (see PLAIN_HEAD_MODEL_TYPES), else None."""
    config = getattr(model, "config", None)
    if getattr(config, "model_type", None) not in PLAIN_HEAD_MODEL_TYPES:
        return None
    if not (hasattr(model, "get_decoder") and hasattr(model, "get_output_embeddings")):
        return None
    return model.get_output_embeddings()


def positions_per_chunk(rows: int, vocab: int, chunk_mb: float) -> int:
    """Positions whose float32 logits [rows, c, vocab] fit in `chunk_mb` MiB (at least 1);
    chunk_mb <= 0 means no limit."""
    if chunk_mb <= 0:
        return 2**62
    return max(1, int(chunk_mb * 2**20) // (4 * max(1, rows) * max(1, vocab)))


def _chunk_terms(head: torch.nn.Module, hidden: torch.Tensor, targets: torch.Tensor):
    return log_softmax_terms(head(hidden), targets)


def logprobs_from_hidden(
    head: torch.nn.Module,  # hidden [..., H] -> logits [..., V], e.g. lm_head
    hidden: torch.Tensor,  # [N, T, H] final hidden states; column t predicts targets[:, t]
    targets: torch.Tensor,  # [N, T]
    chunk_mb: float,  # float32 logits per chunk, MiB (<= 0: one pass)
) -> tuple[torch.Tensor, torch.Tensor]:  # (logprobs [N, T], entropy [N, T]) float32
    """`log_softmax_terms(head(hidden), targets)` in chunks of positions (module docstring)."""
    rows, width = targets.shape
    vocab = getattr(head, "out_features", None) or head.weight.shape[0]
    chunk = positions_per_chunk(rows, vocab, chunk_mb)
    if chunk >= width:
        return _chunk_terms(head, hidden, targets)
    needs_graph = torch.is_grad_enabled() and (
        hidden.requires_grad or any(p.requires_grad for p in head.parameters())
    )
    picked, entropy = [], []
    for start in range(0, width, chunk):
        part = (head, hidden[:, start : start + chunk], targets[:, start : start + chunk])
        if needs_graph:  # keep only the chunk's inputs; its logits are recomputed in backward
            terms = checkpoint(_chunk_terms, *part, use_reentrant=False)
        else:
            terms = _chunk_terms(*part)
        picked.append(terms[0])
        entropy.append(terms[1])
    return torch.cat(picked, dim=1), torch.cat(entropy, dim=1)


def _picked_logprobs(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    scores = logits.float()  # [N, c, V]
    return scores.gather(-1, targets.unsqueeze(-1)).squeeze(-1) - torch.logsumexp(scores, dim=-1)


def logprobs_from_logits(
    logits: torch.Tensor,  # [N, T, V] that already exist (e.g. a hooked lm_head's output)
    targets: torch.Tensor,  # [N, T] logits[:, t] is the distribution of targets[:, t]
    chunk_mb: float,  # float32 copy per chunk, MiB (<= 0: one pass)
) -> torch.Tensor:  # [N, T] float32, no entropy
    """log p(targets) with the float32 log-softmax in chunks of positions, each under
    `torch.utils.checkpoint`: the float32 copy of the logits and its gradient exist one chunk at a
    time, in forward and backward, and nothing but the logits themselves is kept for backward.
    Values and gradients per position are those of one pass."""
    rows, width = targets.shape
    chunk = positions_per_chunk(rows, logits.shape[-1], chunk_mb)
    if chunk >= width or not (torch.is_grad_enabled() and logits.requires_grad):
        return _picked_logprobs(logits, targets)
    return torch.cat([
        checkpoint(_picked_logprobs, logits[:, start : start + chunk],
                   targets[:, start : start + chunk], use_reentrant=False)
        for start in range(0, width, chunk)
    ], dim=1)


def logprob_and_sum_pi_squared(
    logits: torch.Tensor,  # [N, T, V] logits[:, t] is the distribution of targets[:, t]
    targets: torch.Tensor,  # [N, T]
) -> tuple[torch.Tensor, torch.Tensor]:  # (logprobs [N, T], sum_pi_squared [N, T]) float32
    """log p(targets) and sum_v p_v^2 under softmax(logits), in float32, with no gradient.

    sum_v p_v^2 = exp(logsumexp(2 z) - 2 logsumexp(z)), as verl's `sum_pi_squared` (the
    Optimal Token Baseline's score-norm proxy, grpo_cli/algorithm/advantages.py: otb).
    """
    with torch.no_grad():
        scores = logits.float()  # [N, T, V]
        log_norm = torch.logsumexp(scores, dim=-1)  # [N, T]
        picked = scores.gather(-1, targets.unsqueeze(-1)).squeeze(-1) - log_norm  # [N, T]
        return picked, (torch.logsumexp(2 * scores, dim=-1) - 2 * log_norm).exp()


def sum_pi_squared_terms(
    scores: torch.Tensor,  # [N, T, H] hidden states (head given) or [N, T, V] logits (head None)
    head: torch.nn.Module | None,
    targets: torch.Tensor,  # [N, T]
    chunk_mb: float,  # float32 logits per chunk, MiB (<= 0: one pass)
) -> tuple[torch.Tensor, torch.Tensor]:  # (logprobs [N, T], sum_pi_squared [N, T]) float32
    """`logprob_and_sum_pi_squared` in chunks of positions, no gradient (see the module docstring)."""
    rows, width = targets.shape
    vocab = scores.shape[-1] if head is None else (getattr(head, "out_features", None) or head.weight.shape[0])
    chunk = min(width, positions_per_chunk(rows, vocab, chunk_mb)) or 1
    parts = []
    with torch.no_grad():
        for start in range(0, width, chunk):
            part = scores[:, start : start + chunk]
            parts.append(logprob_and_sum_pi_squared(
                part if head is None else head(part), targets[:, start : start + chunk]
            ))
    return torch.cat([p[0] for p in parts], dim=1), torch.cat([p[1] for p in parts], dim=1)


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
