"""`model.autocast=bf16`: bf16 matmuls under torch.autocast, fp32 master weights, fp32 log-probs.

The rollout, old-log-prob and training forwards run inside `policy_autocast`; the output
projection is kept out of it (`keep_lm_head_fp32`) so that log-probs, entropies and the PPO ratio
come from float32 logits. Probes never run under it: their Grams stay float64. Helps on CUDA and
on CPUs with AVX512-BF16/AMX; elsewhere bf16 matmuls are emulated and slower (measure with
`grpo bench --autocast bf16`).
"""

from __future__ import annotations

import torch

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
