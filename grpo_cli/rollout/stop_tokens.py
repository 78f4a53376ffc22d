"""Which sampled tokens end a completion: the tokenizer's EOS, the model's generation-config EOS
ids, and any `model.stop_tokens` (e.g. Nemotron-Mini's `<extra_id_1>`, which closes an assistant
turn in its chat template but is not its tokenizer's EOS)."""

from __future__ import annotations

import torch


def stop_token_ids(tokenizer, model=None, extra_tokens=()) -> list[int]:
    """Ordered, de-duplicated ids; the first is the tokenizer's EOS (or the first one found)."""
    ids: list[int] = []

    def add(value) -> None:
        for item in value if isinstance(value, list | tuple) else [value]:
            if item is not None and int(item) not in ids:
                ids.append(int(item))

    add(tokenizer.eos_token_id)
    generation = getattr(model, "generation_config", None)
    if generation is not None:
        add(generation.eos_token_id)
    for token in extra_tokens:
        token_id = tokenizer.convert_tokens_to_ids(token)
        if token_id is None or token_id == getattr(tokenizer, "unk_token_id", None):
            raise ValueError(f"model.stop_tokens: {token!r} is not a token of this tokenizer")
        add(token_id)
    if not ids:
        raise ValueError("the tokenizer has no EOS token; name one in model.stop_tokens")
    return ids


def is_stop(tokens: torch.Tensor, stop_ids: list[int] | int | torch.Tensor) -> torch.Tensor:
    """Bool tensor, same shape as `tokens`: which tokens end a completion."""
    if isinstance(stop_ids, torch.Tensor):  # prebuilt for a hot loop
        # A broadcast compare, not torch.isin: isin may sort and `unique` (a host sync on CUDA),
        # and the decode step must run without one (CUDA graphs, graph_decode.py).
        return (tokens[..., None] == stop_ids).any(-1) if stop_ids.numel() > 1 else tokens == stop_ids
    if isinstance(stop_ids, int):
        return tokens == stop_ids
    if len(stop_ids) == 1:
        return tokens == stop_ids[0]
    return torch.isin(tokens, torch.tensor(stop_ids, device=tokens.device))
