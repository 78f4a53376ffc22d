"""Candidate step speed-ups measured by `grpo bench` before they move into the trainer.

`sorted_micro_batches` and `trimmed_forward_policy` are the trainer change proposed for
grpo_cli/train/trainer.py (length-sorted micro-batches, each cut to the columns some row uses);
the bench applies them by patching one trainer instance and the trainer module's
`forward_policy` for the life of the process. Both leave the loss and gradients unchanged up to
float summation order: trimmed columns are padding in every row of the micro-batch, and the
loss weights use whole-batch token and sequence counts.
"""

from __future__ import annotations

import torch

from grpo_cli.rollout.batch import RolloutBatch


def sorted_micro_batches(attention_mask: torch.Tensor, size: int) -> list[torch.Tensor]:
    """Row indices grouped into micro-batches of `size` rows of similar length (longest first).

    >>> mask = torch.tensor([[1, 0, 0], [1, 1, 1], [1, 1, 0]])
    >>> [rows.tolist() for rows in sorted_micro_batches(mask, 2)]
    [[1, 2], [0]]
    """
    lengths = attention_mask.sum(dim=1).cpu()  # [N]
    order = torch.sort(lengths, descending=True, stable=True).indices
    return [order[start : start + size] for start in range(0, len(order), size)]


def used_columns(attention_mask: torch.Tensor) -> tuple[int, int]:
    """[first, last) columns where at least one row has a real token."""
    present = attention_mask.any(dim=0).nonzero().flatten()  # [L'] column indices
    if present.numel() == 0:
        return 0, attention_mask.shape[1]
    return int(present[0]), int(present[-1]) + 1


def trim_columns(batch: RolloutBatch, first: int, last: int) -> RolloutBatch:
    return RolloutBatch(
        input_ids=batch.input_ids[:, first:last],
        attention_mask=batch.attention_mask[:, first:last],
        completion_mask=batch.completion_mask[:, first:last],
        sampler_logprobs=batch.sampler_logprobs[:, first:last],
        group_size=batch.group_size,
        prompt_length=batch.prompt_length - first,
    )


def make_trimmed_forward(forward_policy):
    """Wrap trainer.forward_policy: run on the used columns only, pad the outputs back to [n, L]."""

    def trimmed_forward_policy(model, batch: RolloutBatch, want_hidden: bool = False, **kwargs):
        width = batch.input_ids.shape[1]
        first, last = used_columns(batch.attention_mask)
        if first == 0 and last == width:
            return forward_policy(model, batch, want_hidden, **kwargs)
        trimmed = trim_columns(batch, first, last)
        logprobs, entropy, hidden = forward_policy(model, trimmed, want_hidden, **kwargs)
        pad = (first, width - last)
        logprobs = torch.nn.functional.pad(logprobs, pad)  # [n, L]
        entropy = torch.nn.functional.pad(entropy, pad)  # [n, L]
        if hidden is not None:
            hidden = torch.nn.functional.pad(hidden, (0, 0) + pad)  # [n, L, H]
        return logprobs, entropy, hidden

    trimmed_forward_policy.original = forward_policy
    return trimmed_forward_policy


def apply_sorted_micro_batches(trainer, size: int) -> None:
    """Patch one trainer: sorted, trimmed micro-batches of `size` rows (bench prototype)."""
    import grpo_cli.train.trainer as trainer_module

    if not hasattr(trainer_module.forward_policy, "original"):
        trainer_module.forward_policy = make_trimmed_forward(trainer_module.forward_policy)
    collect = trainer.collect
    current: dict[str, torch.Tensor] = {}

    def collect_and_remember(step: int):
        batch, scored, dropped = collect(step)
        current["attention_mask"] = batch.attention_mask
        return batch, scored, dropped

    def micro_batches(num_rows: int) -> list[torch.Tensor]:
        mask = current.get("attention_mask")
        if mask is None or mask.shape[0] != num_rows:
            return type(trainer).micro_batches(trainer, num_rows)
        return sorted_micro_batches(mask, size)

    trainer.collect = collect_and_remember
    trainer.micro_batches = micro_batches
