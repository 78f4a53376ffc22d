"""The update reads nothing back per micro-batch, and a non-finite loss still stops the step
before the optimizer applies it."""

from __future__ import annotations

import sys

import pytest
import torch
from step_parity import setup_for

from grpo_cli.train import trainer as trainer_module
from grpo_cli.train.trainer import NonFiniteLossError

# Tensor methods that copy a value to the host (a device sync on CUDA)
READS = ("item", "tolist", "__bool__", "__float__", "__int__")


def trainer_reads(setup, monkeypatch) -> int:
    """Host reads made by grpo_cli/train/trainer.py itself during one step."""
    count = 0
    for name in READS:
        original = getattr(torch.Tensor, name)

        def counting(self, *args, _original=original, **kwargs):
            nonlocal count
            if sys._getframe(1).f_code.co_filename == trainer_module.__file__:
                count += 1
            return _original(self, *args, **kwargs)

        monkeypatch.setattr(torch.Tensor, name, counting)
    setup.trainer.step(0)
    monkeypatch.undo()
    return count


def test_host_reads_do_not_grow_with_micro_batches(tmp_path, monkeypatch):
    """12 rollouts in one micro-batch or in four: the same number of reads per step."""
    reads = {
        size: trainer_reads(setup_for(tmp_path, f"train.micro_batch_size={size}"), monkeypatch)
        for size in (12, 3)
    }
    assert reads[3] == reads[12] > 0


@pytest.mark.parametrize("micro_batch_size", [12, 5])
def test_non_finite_loss_stops_the_step_before_the_update(tmp_path, monkeypatch, micro_batch_size):
    setup = setup_for(tmp_path, f"train.micro_batch_size={micro_batch_size}")
    before = {name: p.detach().clone() for name, p in setup.model.named_parameters()}
    calls = 0
    original = trainer_module.policy_loss

    def nan_in_the_last_micro_batch(logprobs, *args, **kwargs):
        nonlocal calls
        calls += 1
        loss, stats = original(logprobs, *args, **kwargs)
        return (loss * float("nan") if calls == -(-12 // micro_batch_size) else loss), stats

    monkeypatch.setattr(trainer_module, "policy_loss", nan_in_the_last_micro_batch)
    with pytest.raises(NonFiniteLossError, match="step 3: loss is nan"):
        setup.trainer.step(3)
    for name, p in setup.model.named_parameters():
        assert torch.equal(p.detach(), before[name]), name  # no NaN update applied
