"""Routing a transformers model's attention through grpo-cli's own functions while decoding.

transformers looks attention up by `config._attn_implementation` in its `AttentionInterface`;
`attention_routed` sets that name for the duration of a decode (or, for train/autocast.py, of a
scoring forward) and restores it. `shared_prefix_attention` attends one new token per row over
its group's shared prompt part (decode_cache.SharedPrefixLayer) and its own completion;
`decode_math_attention` is one-query attention as plain matmuls (the compiled step).
"""

from __future__ import annotations

from contextlib import contextmanager

import torch
from transformers.cache_utils import Cache
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.modeling_utils import AttentionInterface

from grpo_cli.rollout.decode_attention import one_query_attention, two_part_attention
from grpo_cli.rollout.decode_cache import SharedPrefixLayer, full_attention_only

SHARED_PREFIX_ATTENTION = "grpo_shared_prefix"
_active_caches: list[Cache] = []  # the shared-prefix cache of the decode loop in progress
shared_prefix_calls = [0]  # layers that routed attention through shared_prefix_attention (static_decode resets and checks it)


def shared_prefix_attention(module, query, key, value, attention_mask, dropout=0.0, scaling=None,
                            **kwargs):
    """Attention of one new token per row over its group's shared prompt and its own completion.

    query [N, H, 1, D]; key/value [N, H_kv, t, D] (completion part); the prompt part
    [B, H_kv, P, D] comes from the layer's cache; attention_mask [N, 1, 1, P + t] bool. Scores
    of both parts go through one softmax, so this is exact attention over prompt + completion.
    Anything else (the prefill) goes to SDPA. Returns ([N, 1, H, D], None).
    """
    shared_prefix_calls[0] += 1
    layer = _active_caches[-1].layers[module.layer_idx] if _active_caches else None
    # no completion buffer yet: the prefill (the prompt part is stored before any buffer)
    if not isinstance(layer, SharedPrefixLayer) or query.shape[2] != 1 or layer.key_buffer is None:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout,
                                      scaling=scaling, **kwargs)
    scaling = query.shape[-1] ** -0.5 if scaling is None else scaling
    output = two_part_attention(query, layer.prompt_keys, layer.prompt_values, key, value,
                                attention_mask, scaling)
    return output, None


AttentionInterface.register(SHARED_PREFIX_ATTENTION, shared_prefix_attention)

DECODE_MATH_ATTENTION = "grpo_decode_math"


def decode_math_attention(module, query, key, value, attention_mask, dropout=0.0, scaling=None,
                          **kwargs):
    """One-query attention as matmul + softmax (compiled decode: inductor fuses it; CPU SDPA
    kernels are slow for a single query). Anything else goes to SDPA."""
    if query.shape[2] != 1 or attention_mask is None or attention_mask.dtype != torch.bool:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout,
                                      scaling=scaling, **kwargs)
    scaling = query.shape[-1] ** -0.5 if scaling is None else scaling
    return one_query_attention(query, key, value, attention_mask, scaling), None


AttentionInterface.register(DECODE_MATH_ATTENTION, decode_math_attention)


def supports_shared_prefix(model) -> bool:
    config = model.config.get_text_config(decoder=True)
    return (
        full_attention_only(model.config)
        and getattr(config, "attn_logit_softcapping", None) is None
        and model.config._attn_implementation in ("sdpa", "eager")
    )


@contextmanager
def attention_routed(model, name: str, cache: Cache | None = None):
    """Route the model's attention through the registered function `name` while decoding (or,
    for train/autocast.py, while scoring)."""
    config = model.config
    previous = config._attn_implementation
    config._attn_implementation = name
    if cache is not None:
        _active_caches.append(cache)
    try:
        yield
    finally:
        if cache is not None:
            _active_caches.pop()
        config._attn_implementation = previous
