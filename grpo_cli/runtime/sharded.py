"""Tensors of a model sharded by FSDP2 (`torch.distributed.fsdp.fully_shard`): its parameters
and their `.grad` are DTensors, each process holding a row slice (grpo_cli/integrations/sharded_gram.py).

`whole` is the one place a DTensor's value is read as the unsharded tensor; it is a collective,
so every process must call it on the same tensors in the same order.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch


def is_sharded(tensor: torch.Tensor) -> bool:
    """Whether `tensor` is a DTensor (an FSDP2 parameter, its gradient, or a value derived from them)."""
    return hasattr(tensor, "full_tensor")


def any_sharded(tensors: Iterable[torch.Tensor]) -> bool:
    return any(is_sharded(t) for t in tensors)


def whole(tensor: torch.Tensor) -> torch.Tensor:
    """A DTensor's full value on every process (an all-gather of shards, an all-reduce of a
    partial sum or max: DTensor knows which, HSDP replicas counted once); a plain tensor as is."""
    return tensor.full_tensor() if is_sharded(tensor) else tensor
