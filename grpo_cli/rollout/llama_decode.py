"""The one-token decode step of a Llama-architecture model as plain tensor functions.

On a CPU, decoding a small model is bound by per-call overhead, not arithmetic: transformers'
module stack (hooks, keyword plumbing, mask and output objects) costs more than the matmuls. This
step reads the same parameters (no copies; they change in place between optimizer steps) and does
the same arithmetic as `LlamaDecoderLayer` with `shared_prefix_attention`:

    x <- x + o_proj(attention(rope(q_proj(n1(x))), rope(k_proj(n1(x))), v_proj(n1(x))))
    x <- x + down_proj(act(gate_proj(n2(x))) * up_proj(n2(x)))
    logits = lm_head(norm(x))

It is used only where that is exactly the model's computation (`supports_llama_step`): model
types llama, qwen2 (q/k/v biases) and mistral without a sliding window, plain `nn.Linear`
projections (no LoRA or quantized layers), RMSNorm layers of transformers' Llama form. Also
nemotron (the paper's Nemotron-Mini-4B): its MLP has no gate (x <- x + down_proj(act(up_proj(
n2(x)))), act = relu^2), its norms are LayerNorm1P (run by their own `forward`), and RoPE turns
only the first `partial_rotary_factor` of each head's dims. Anything else decodes through the
model's own forward. tests/test_static_decode.py and tests/test_llama_decode.py check that both
give the same tokens and log-probs.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from grpo_cli.rollout.decode_attention import two_part_attention

SUPPORTED_MODEL_TYPES = ("llama", "qwen2", "mistral", "nemotron")
ATTENTION_PROJECTIONS = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj")
GATED_MLP = ("mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")  # act(gate) * up, then down
PLAIN_MLP = ("mlp.up_proj", "mlp.down_proj")  # act(up), then down (nemotron)


def _submodule(root: nn.Module, path: str) -> nn.Module | None:
    try:
        return root.get_submodule(path)
    except AttributeError:
        return None


def supports_llama_step(model: nn.Module) -> bool:
    config = model.config
    if getattr(config, "model_type", None) not in SUPPORTED_MODEL_TYPES:
        return False
    if getattr(config, "sliding_window", None) and getattr(config, "use_sliding_window", True):
        return False
    body = getattr(model, "model", None)
    if body is None or not hasattr(body, "layers") or not hasattr(body, "rotary_emb"):
        return False
    head = model.get_output_embeddings()
    if type(head) is not nn.Linear or type(body.embed_tokens) is not nn.Embedding:
        return False
    norms = [body.norm] + [getattr(layer, name, None) for layer in body.layers
                           for name in ("input_layernorm", "post_attention_layernorm")]
    if not (all(_is_llama_rms_norm(norm) for norm in norms)
            or all(_is_layer_norm_1p(norm) for norm in norms)):
        return False
    return all(type(_submodule(layer, path)) is nn.Linear
               for layer in body.layers for path in ATTENTION_PROJECTIONS + _mlp_projections(layer))


def _mlp_projections(layer: nn.Module) -> tuple[str, ...]:
    return GATED_MLP if _submodule(layer, "mlp.gate_proj") is not None else PLAIN_MLP


def rope_depends_on_position_only(model: nn.Module) -> bool:
    """Whether the rotary embedding at a position depends on that position only (a table can
    hold it), unlike the rope types that rescale with the sequence length (dynamic, longrope)."""
    rotary = model.model.rotary_emb
    return getattr(rotary, "rope_type", "default") not in ("dynamic", "longrope")


def _is_llama_rms_norm(module) -> bool:
    return (module is not None and type(module).__name__.endswith("RMSNorm")
            and hasattr(module, "variance_epsilon") and isinstance(module.weight, nn.Parameter))


def _is_layer_norm_1p(module) -> bool:
    """transformers' NemotronLayerNorm1P: F.layer_norm with weight + 1 (the step calls its own
    `forward`, so any autocast handling it has is kept)."""
    return (module is not None and type(module).__name__.endswith("LayerNorm1P")
            and isinstance(module, nn.LayerNorm))


def _fused_parts(module: nn.Module, names: tuple[str, ...]):
    """Weights and biases (None: no bias anywhere) of several nn.Linear with the same input."""
    linears = [getattr(module, name) for name in names]
    weights = [linear.weight for linear in linears]
    if all(linear.bias is None for linear in linears):
        return weights, None
    return weights, [linear.bias if linear.bias is not None else linear.weight.new_zeros(linear.out_features)
                     for linear in linears]


def _fused(module: nn.Module, names: tuple[str, ...]) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(weight, bias) of several nn.Linear with the same input, stacked along the output dim."""
    weights, biases = _fused_parts(module, names)
    return torch.cat(weights), None if biases is None else torch.cat(biases)


def _fuse_into(fused: tuple[torch.Tensor, torch.Tensor | None], module: nn.Module,
               names: tuple[str, ...]) -> None:
    """`_fused` written into existing buffers (same storage before and after)."""
    weights, biases = _fused_parts(module, names)
    torch.cat(weights, out=fused[0])
    if biases is not None:
        torch.cat(biases, out=fused[1])


def mkl_packable(weight: torch.Tensor) -> bool:
    """Whether MKL can run `F.linear` with `weight` from a pre-packed copy (fp32 on a CPU, torch
    built with MKL)."""
    return (weight.device.type == "cpu" and weight.dtype == torch.float32
            and torch.backends.mkl.is_available() and hasattr(torch.ops.mkl, "_mkl_linear"))


def onednn_bf16_packable(weight: torch.Tensor) -> bool:
    """Whether oneDNN can run `F.linear` with `weight` from a copy reordered once into its blocked
    layout (bf16 on a CPU with oneDNN's bf16 kernels: AVX512-BF16 or AMX)."""
    return (weight.device.type == "cpu" and weight.dtype == torch.bfloat16
            and torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")
            and torch.ops.mkldnn._is_mkldnn_bf16_supported())


class RolloutLinear:
    """`F.linear(x, weight, bias)` for a weight that stays fixed over many calls (one rollout's
    decode steps), prepared once (`rows` > 0) in the fastest form that gives the same product:

    - under autocast (`autocast_dtype`): the weight and bias cast once to that dtype. Autocast
      casts them on every call (it caches casts of leaf parameters only, not of the fused q/k/v
      and gate/up copies): on SmolLM2 in bf16 on CPU the casts took as long as the matmuls.
    - fp32 on a CPU with MKL: a copy packed by MKL for `rows` input rows (`cblas_sgemm_pack`).
      A decode step's matmul has few rows and plain `sgemm` packs the whole weight again on every
      call (~30% of its time at 32 rows on SmolLM2's shapes); the packed product runs MKL's same
      kernel (tests/test_static_decode.py: tokens and log-probs equal to the unpacked step). The
      packed product needs exactly `rows` input rows: fewer (a rollout that dropped finished
      rows without repacking, as the fp32 head under autocast does) are padded with zero rows,
      whose outputs are dropped: the kept rows are `F.linear`'s on the padded input bit for bit
      (tested), and differ from `F.linear` on the rows alone by round-off (~6e-7 relative on
      SmolLM2's shapes: MKL picks its kernel by the row count, as a repack for fewer rows
      would). Plain `sgemm` on the rows alone would pack the weight again on every call:
      SmolLM2's head took 36 ms a token at 10 rows that way, 19 ms packed at 32.
    - bf16 on a CPU with oneDNN's bf16 kernels (`onednn_bf16_packable`, after the cast above):
      a copy reordered once into oneDNN's blocked layout; `F.linear` reorders the weight on
      every call. Same kernel, the same product bit for bit (tested), for any number of rows;
      15-35% less time per call on SmolLM2's decode shapes.
    - else (or `rows` = 0): `F.linear` on the live weight, as transformers' module would.
    """

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, rows: int = 0,
                 autocast_dtype: torch.dtype | None = None):
        self.weight, self.bias, self.rows, self.packed, self.onednn = weight, bias, rows, None, None
        if rows <= 0:
            return
        if autocast_dtype is not None:
            self.weight = weight.detach().to(autocast_dtype)
            self.bias = None if bias is None else bias.detach().to(autocast_dtype)
        if mkl_packable(self.weight):
            self.packed = torch.ops.mkl._mkl_reorder_linear_weight(self.weight.detach(), rows)
        elif onednn_bf16_packable(self.weight):
            self.onednn = torch.ops.mkldnn._reorder_linear_weight(self.weight.detach(), rows)
            self.bias = None if self.bias is None else self.bias.detach()

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.onednn is not None:  # the op takes no autocast: cast x as autocast's F.linear would
            return torch.ops.mkldnn._linear_pointwise(x.to(self.weight.dtype), self.onednn, self.bias,
                                                      "none", [], "")
        if self.packed is None:
            return F.linear(x, self.weight, self.bias)
        flat = x.reshape(-1, x.shape[-1])  # [M, in]: mkl_linear's rows are all but the last dim
        rows = flat.shape[0]
        if rows < self.rows:  # pad to the packed rows (class docstring)
            padded = torch.cat([flat, flat.new_zeros(self.rows - rows, flat.shape[1])])
            product = torch.ops.mkl._mkl_linear(padded, self.packed, self.weight, self.bias, self.rows)
            return product[:rows].reshape(*x.shape[:-1], product.shape[-1])
        return torch.ops.mkl._mkl_linear(x, self.packed, self.weight, self.bias, self.rows)


class FP32Head:
    """The output head kept fp32 under autocast (`train.autocast.keep_lm_head_fp32`), prepared as a
    `RolloutLinear` in the head's dtype and called with autocast off, as that head's forward does."""

    def __init__(self, head: nn.Linear, rows: int):
        self.linear = RolloutLinear(head.weight, head.bias, rows)

    def __call__(self, hidden: torch.Tensor) -> torch.Tensor:
        with torch.autocast(hidden.device.type, enabled=False):
            return self.linear(hidden.to(self.linear.weight.dtype))


def rms_norm(x: torch.Tensor, norm: nn.Module) -> torch.Tensor:
    """transformers' LlamaRMSNorm: normalise in float32, cast back, then scale."""
    normalised = F.rms_norm(x.float(), (x.shape[-1],), eps=norm.variance_epsilon)
    return norm.weight * normalised.to(x.dtype)


def layer_norm_1p(x: torch.Tensor, norm: nn.Module) -> torch.Tensor:
    """NemotronLayerNorm1P, by its own forward (without the module call's hook dispatch)."""
    return norm.forward(x)


class LlamaDecodeStep:
    """Callable with `StaticDecodeBackend._decode_step`'s signature, on the shared-prefix cache
    (`decode_cache.SharedPrefixLayer`: prompt keys once per group, completion keys per row)."""

    def __init__(self, model: nn.Module, max_positions: int = 0, rollout_rows: int = 0):
        """`rollout_rows` > 0: the step serves one rollout of that many rows, and its matmul
        weights are prepared once for it (`RolloutLinear`: cast under autocast, MKL-packed in
        fp32 on a CPU). 0 (CUDA graphs, whose step outlives optimizer steps): live weights."""
        self.model = model
        config = model.config
        self.heads = config.num_attention_heads
        self.kv_heads = getattr(config, "num_key_value_heads", None) or self.heads
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // self.heads
        first = model.model.layers[0]
        self.act = first.mlp.act_fn
        self.gated = _mlp_projections(first) == GATED_MLP  # else act(up) (nemotron)
        self.norm = rms_norm if _is_llama_rms_norm(first.input_layernorm) else layer_norm_1p
        # The policy does not change during a rollout: q/k/v and gate/up run as one matmul each.
        # Concatenated copies cost one pass over the layer weights per rollout (built here).
        with torch.no_grad():
            self.qkv = [_fused(layer.self_attn, ("q_proj", "k_proj", "v_proj"))
                        for layer in model.model.layers]
            self.gate_up = [_fused(layer.mlp, ("gate_proj", "up_proj")) if self.gated else None
                            for layer in model.model.layers]
        # The rotated dims of a head: all of them, or its first partial_rotary_factor (nemotron)
        hidden_dtype = model.model.embed_tokens.weight.dtype
        probe = torch.zeros(1, dtype=hidden_dtype, device=model.device)
        self.rotary_dim = model.model.rotary_emb(probe, torch.zeros(1, 1, dtype=torch.long,
                                                                    device=model.device))[0].shape[-1]
        # +-1 is exact in any dtype; in the hidden states' dtype it keeps RoPE's q and k there
        # (a float32 sign would promote bf16 q/k to float32 and break the bf16 prompt-key matmul).
        half = torch.ones(self.rotary_dim // 2, device=model.device, dtype=hidden_dtype)
        self.rotation_sign = torch.cat([-half, half])  # [D_rot]
        self.rope_table = self._rope_table(model, max_positions)
        self.prepare(rollout_rows)

    def prepare(self, rows: int) -> None:
        """The step's matmuls (`RolloutLinear`) for `rows` rows: per layer (qkv, o, gate_up, down),
        then the output head. Called again when a rollout drops finished rows, to repack."""
        model = self.model
        device_type = model.model.embed_tokens.weight.device.type
        autocast_dtype = (torch.get_autocast_dtype(device_type)
                          if rows > 0 and torch.is_autocast_enabled(device_type) else None)
        self.linears = None  # the old packs are freed before the new ones are built
        with torch.no_grad():
            self.linears = [
                (RolloutLinear(*qkv, rows, autocast_dtype),
                 RolloutLinear(layer.self_attn.o_proj.weight, layer.self_attn.o_proj.bias, rows, autocast_dtype),
                 RolloutLinear(*(gate_up or (layer.mlp.up_proj.weight, layer.mlp.up_proj.bias)), rows,
                               autocast_dtype),
                 RolloutLinear(layer.mlp.down_proj.weight, layer.mlp.down_proj.bias, rows, autocast_dtype))
                for layer, qkv, gate_up in zip(model.model.layers, self.qkv, self.gate_up, strict=True)]
            head = model.get_output_embeddings()
            if rows <= 0:
                self.head = head  # a module call: it may be kept fp32 under autocast
            elif autocast_dtype is not None and getattr(head, "_fp32_under_autocast", False):
                self.head = FP32Head(head, rows)
            else:
                self.head = RolloutLinear(head.weight, head.bias, rows, autocast_dtype)
        self.packed = any(linear.packed is not None for linear in self.linears[0])

    def refresh_weights(self) -> None:
        """Copy the policy's current q/k/v and gate/up weights into the fused buffers in place:
        their storage stays put, so a CUDA graph that reads them stays valid after an
        optimizer step (graph_decode.py). Every other tensor the step reads is the policy's own
        parameter, updated in place by the optimizer."""
        with torch.no_grad():
            for layer, qkv, gate_up in zip(self.model.model.layers, self.qkv, self.gate_up, strict=True):
                _fuse_into(qkv, layer.self_attn, ("q_proj", "k_proj", "v_proj"))
                if gate_up is not None:
                    _fuse_into(gate_up, layer.mlp, ("gate_proj", "up_proj"))

    def _rope_table(self, model, max_positions: int):
        """(cos [S, D], signed sin [S, D]) for positions 0..S-1, or None: per-step rotary calls.

        The rotary module's value at a position depends on that position only, except for the
        rope types that rescale with the sequence length (dynamic, longrope)."""
        rotary = model.model.rotary_emb
        if max_positions <= 0 or not rope_depends_on_position_only(model):
            return None
        dtype = model.model.embed_tokens.weight.dtype  # the hidden states' dtype, autocast or not
        probe = torch.zeros(1, dtype=dtype, device=model.device)
        positions = torch.arange(max_positions, device=model.device)[None]  # [1, S]
        cos, sin = rotary(probe, positions)  # [1, S, D]
        return cos[0], sin[0] * self.rotation_sign

    def __call__(self, model, tokens, mask, positions, cache) -> torch.Tensor:
        """tokens [N, 1], mask [N, 1, 1, S] bool, positions [N, 1] -> raw logits [N, V] float32."""
        body = model.model
        rows = tokens.shape[0]
        x = F.embedding(tokens, body.embed_tokens.weight)  # [N, 1, H]
        # rotate_half(x) = roll(x, D/2) * [-1]*(D/2) + [1]*(D/2): RoPE in three ops, q and k at once
        if self.rope_table is not None:
            cos, signed_sin = self.rope_table[0][positions], self.rope_table[1][positions]  # [N, 1, D]
        else:
            cos, sin = body.rotary_emb(x, positions)  # [N, 1, D] each, broadcast over heads below
            signed_sin = sin * self.rotation_sign
        qk_heads, rotary = self.heads + self.kv_heads, self.rotary_dim
        norm = self.norm
        for index, layer in enumerate(body.layers):
            qkv_proj, o_proj, gate_up_proj, down_proj = self.linears[index]
            attn = layer.self_attn
            normed = norm(x, layer.input_layernorm)
            qkv = qkv_proj(normed).view(rows, qk_heads + self.kv_heads, self.head_dim)
            qk = qkv[:, :qk_heads]  # [N, H + H_kv, D]
            if rotary == self.head_dim:
                qk = torch.addcmul(qk * cos, qk.roll(rotary // 2, dims=-1), signed_sin)
            else:  # partial RoPE: the first `rotary` dims turn, the rest pass
                turned = qk[..., :rotary]
                turned = torch.addcmul(turned * cos, turned.roll(rotary // 2, dims=-1), signed_sin)
                qk = torch.cat([turned, qk[..., rotary:]], dim=-1)
            q = qk[:, : self.heads].unsqueeze(2)  # [N, H, 1, D]
            k = qk[:, self.heads :].unsqueeze(2)  # [N, H_kv, 1, D]
            v = qkv[:, qk_heads:].unsqueeze(2)  # [N, H_kv, 1, D]
            cached = cache.layers[index]
            keys, values = cached.update(k, v)  # completion part [N, H_kv, t, D]
            attended = two_part_attention(q, cached.prompt_keys, cached.prompt_values, keys,
                                          values, mask, attn.scaling)  # [N, 1, H, D]
            attended = attended.reshape(rows, 1, self.heads * self.head_dim)
            x = x + o_proj(attended)
            normed = norm(x, layer.post_attention_layernorm)
            if self.gated:
                gate, up = gate_up_proj(normed).chunk(2, dim=-1)
                x = x + down_proj(self.act(gate) * up)
            else:
                x = x + down_proj(self.act(gate_up_proj(normed)))
        return self.head(norm(x, body.norm))[:, -1].float()  # [N, V]
