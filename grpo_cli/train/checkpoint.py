"""Resumable checkpoints: policy, optimizer (fp32 masters and rounding generators included),
value head, alarm counters, per-problem success counts, the probes' running sums and the next
step."""

from __future__ import annotations

from pathlib import Path

import torch


def save_checkpoint(path: Path, next_step: int, trainer, monitor, probes=None) -> None:
    state = {
        "probes": probes.state_dict() if probes is not None else None,
        "next_step": next_step,
        "model": trainer.model.state_dict(),
        "optimizer": trainer.optimizer.state_dict(),
        "value_head": trainer.value_head.state_dict() if trainer.value_head is not None else None,
        "alarms": monitor.state_dict(),
        "problem_success": trainer.problem_success.state_dict(),
    }
    temporary = path.with_suffix(".tmp")
    torch.save(state, temporary)
    temporary.replace(path)


def load_checkpoint(path: Path, trainer, monitor, probes=None) -> int:
    """Restore a run's state in place; return the step to continue from."""
    state = torch.load(path, map_location=trainer.device, weights_only=False)
    trainer.model.load_state_dict(state["model"])
    trainer.optimizer.load_state_dict(state["optimizer"])
    if trainer.value_head is not None and state["value_head"] is not None:
        trainer.value_head.load_state_dict(state["value_head"])
    monitor.load_state_dict(state["alarms"])
    if "problem_success" in state:  # absent in checkpoints written before it existed
        trainer.problem_success.load_state_dict(state["problem_success"])
    if probes is not None and state.get("probes") is not None:
        probes.load_state_dict(state["probes"])
    trainer.backend.sync_weights(trainer.model)
    return int(state["next_step"])
