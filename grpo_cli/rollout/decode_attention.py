"""Attention of one new query per row, as plain tensor functions (the decode loop's hot path).

`two_part_attention` reads a group's prompt keys once for its R rows (grpo_cli/rollout/
decode_cache.py's shared-prefix cache); `one_query_attention` reads one cache per row.

Half-precision (bf16/fp16) inputs are attended in float32 and the output cast back, as fused
SDPA kernels accumulate: bf16 scores would round each logit to ~3 significant digits. On CPU
(tests/test_static_decode.py, bf16 tiny Llama) this halved the largest gap between the
sampler's and the training forward's log-probs, 0.026 -> 0.015 nats. Autocast is off inside:
under `model.autocast=bf16` the matmuls below used to run in bf16 after all. With float32 here
and in the CPU training forward (train/autocast.py), the tiny Llama's mean sampler-trainer gap
went 0.00075-0.00125 -> 0.00046-0.0009 nats (6 seeds); a bf16 SmolLM2 rollout costs about the
same (4 rollouts, CPU s: 18.8 / 19.1 before, 22.1 / 19.9 after, interleaved).
"""

from __future__ import annotations

import torch


def _float32(*tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
    return tuple(t.float() for t in tensors)  # no copy for float32 inputs


def two_part_attention(query, prompt_keys, prompt_values, keys, values, attention_mask, scaling):
    """Exact softmax attention of one query per row over its group's prompt keys and its own
    completion keys (module docstring). query [N, H, 1, D]; prompt_keys/values [B, H_kv, P, D];
    keys/values [N, H_kv, t, D]; attention_mask [N, 1, 1, P + t] bool. Returns [N, 1, H, D]."""
    with torch.autocast(query.device.type, enabled=False):
        return _two_part_attention(query, prompt_keys, prompt_values, keys, values, attention_mask, scaling)


def _two_part_attention(query, prompt_keys, prompt_values, keys, values, attention_mask, scaling):
    out_dtype = query.dtype
    query, prompt_keys, prompt_values, keys, values = _float32(
        query, prompt_keys, prompt_values, keys, values
    )
    rows, heads, _, head_dim = query.shape
    groups, kv_heads, prompt_length, _ = prompt_keys.shape
    per_group, per_kv = rows // groups, heads // kv_heads  # R, query heads per kv head
    q = query.reshape(rows, kv_heads, per_kv, head_dim)  # [N, H_kv, G, D]
    stacked = q.view(groups, per_group, kv_heads, per_kv, head_dim).transpose(1, 2)
    stacked = stacked.reshape(groups, kv_heads, per_group * per_kv, head_dim)  # [B, H_kv, R*G, D]
    prompt_scores = torch.matmul(stacked, prompt_keys.transpose(2, 3)) * scaling  # [B, H_kv, R*G, P]
    prompt_scores = prompt_scores.view(groups, kv_heads, per_group, per_kv, prompt_length)
    prompt_scores = prompt_scores.transpose(1, 2).reshape(rows, kv_heads, per_kv, prompt_length)
    own_scores = torch.matmul(q, keys.transpose(2, 3)) * scaling  # [N, H_kv, G, t]
    scores = torch.cat([prompt_scores, own_scores], dim=-1)  # [N, H_kv, G, P + t]
    scores = torch.where(attention_mask, scores, torch.finfo(scores.dtype).min)
    weights = torch.softmax(scores, dim=-1)  # [N, H_kv, G, P + t] float32
    prompt_weights = weights[..., :prompt_length].reshape(
        groups, per_group, kv_heads, per_kv, prompt_length
    ).transpose(1, 2).reshape(groups, kv_heads, per_group * per_kv, prompt_length)
    from_prompt = torch.matmul(prompt_weights, prompt_values)  # [B, H_kv, R*G, D]
    from_prompt = from_prompt.view(groups, kv_heads, per_group, per_kv, head_dim).transpose(1, 2)
    output = from_prompt.reshape(rows, kv_heads, per_kv, head_dim)
    output = output + torch.matmul(weights[..., prompt_length:], values)  # [N, H_kv, G, D]
    return output.reshape(rows, 1, heads, head_dim).to(out_dtype)


def one_query_attention(query, keys, values, attention_mask, scaling):
    """query [N, H, 1, D]; keys/values [N, H_kv, S, D]; attention_mask [N, 1, 1, S] bool.
    Returns [N, 1, H, D]."""
    with torch.autocast(query.device.type, enabled=False):
        return _one_query_attention(query, keys, values, attention_mask, scaling)


def _one_query_attention(query, keys, values, attention_mask, scaling):
    out_dtype = query.dtype
    query, keys, values = _float32(query, keys, values)
    rows, heads, _, head_dim = query.shape
    kv_heads = keys.shape[1]
    q = query.reshape(rows, kv_heads, heads // kv_heads, head_dim)  # [N, H_kv, G, D]
    scores = torch.matmul(q, keys.transpose(2, 3)) * scaling  # [N, H_kv, G, S]
    scores = torch.where(attention_mask, scores, torch.finfo(scores.dtype).min)
    weights = torch.softmax(scores, dim=-1)  # [N, H_kv, G, S] float32
    output = torch.matmul(weights, values)  # [N, H_kv, G, D]
    return output.reshape(rows, 1, heads, head_dim).to(out_dtype)
