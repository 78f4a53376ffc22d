"""`model.autocast=bf16`: bf16 matmuls under torch.autocast, fp32 master weights, fp32 log-probs.

The rollout, old-log-prob and training forwards run inside `policy_autocast`; the output
projection is kept out of it (`keep_lm_head_fp32`) so that log-probs, entropies and the PPO ratio
come from float32 logits. `model.autocast_head=true` runs the head under autocast too, as TRL's
bf16 mode (its default) does: bf16 logits (log-softmax still in float32 from them), a cheaper
head (SmolLM2's 49,152 x 576 head was ~1.7 s of a ~11 s bf16 CPU step in fp32; a Nemotron-size
vocabulary makes it matter more on a GPU), and sampler/trainer log-prob gaps of bf16 logits
(docs/speed.md). Probes never run under it: their Grams stay float64. Helps on CUDA and
on CPUs with AVX512-BF16/AMX; elsewhere bf16 matmuls are emulated and slower (measure with
`grpo bench --autocast bf16`).

On a CPU the training-side forwards (`policy_forward_autocast`) also attend in float32: torch's
CPU flash attention is 3-4x slower in bf16 than in float32, forward and backward (SmolLM2's
shapes: 25 against 9 ms for 8 prompts of 57 tokens). The log-probs stay within bf16 rounding of
fp32's, as with bf16 attention (tests/test_bf16_runs.py); the decode loop attends in float32 too
(rollout/decode_attention.py).
"""

from __future__ import annotations

from contextlib import contextmanager, nullcontext

import torch
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask
from transformers.modeling_utils import AttentionInterface

from grpo_cli.rollout.attention_routing import attention_routed

AUTOCAST_KINDS = ("none", "bf16")


def policy_autocast(device: torch.device, kind: str):
    """torch.autocast(bf16) when kind == "bf16", else a disabled (no-op) autocast."""
    if kind not in AUTOCAST_KINDS:
        raise ValueError(f"model.autocast={kind!r} is not one of {', '.join(AUTOCAST_KINDS)}")
    return torch.autocast(device.type, dtype=torch.bfloat16, enabled=kind == "bf16")


def keep_lm_head_fp32(model: torch.nn.Module) -> None:
    """Under autocast, run the output projection outside it, in the head's dtype (fp32 for the
    fp32 master weights autocast is meant for), so log-probs come from unrounded logits."""
    head = model.get_output_embeddings()
    if head is None or getattr(head, "_fp32_under_autocast", False):
        return
    original = head.forward

    def forward(hidden: torch.Tensor) -> torch.Tensor:
        # fp32 weights: fp32 logits. bf16 weights (model.dtype=bfloat16): bf16 logits, as
        # without autocast (input, output and weight in one dtype, as the probes' hooks expect);
        # log-probs are taken in float32 from the logits either way.
        with torch.autocast(hidden.device.type, enabled=False):
            return original(hidden.to(head.weight.dtype))

    head.forward = forward
    head._fp32_under_autocast = True


FLOAT32_ATTENTION = "grpo_sdpa_float32"


def sdpa_in_float32(module, query, key, value, attention_mask, **kwargs):
    """transformers' SDPA attention on float32 copies of query, key and value, autocast off (it
    would cast them back to bf16), the output in the query's dtype."""
    with torch.autocast(query.device.type, enabled=False):
        output, weights = sdpa_attention_forward(module, query.float(), key.float(), value.float(),
                                                 attention_mask, **kwargs)
    return output.to(query.dtype), weights


AttentionInterface.register(FLOAT32_ATTENTION, sdpa_in_float32)
AttentionMaskInterface.register(FLOAT32_ATTENTION, sdpa_mask)  # the masks SDPA gets


@contextmanager
def policy_forward_autocast(model: torch.nn.Module, device: torch.device, kind: str):
    """`policy_autocast` for forwards that train or score the policy; on a CPU under bf16 it also
    routes the model's SDPA attention through `sdpa_in_float32` (module docstring)."""
    reroute = kind == "bf16" and device.type == "cpu" and model.config._attn_implementation == "sdpa"
    with attention_routed(model, FLOAT32_ATTENTION) if reroute else nullcontext(), policy_autocast(device, kind):
        yield
