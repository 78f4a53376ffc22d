"""What the probes read from one training step, whoever trained it (kept light: the trainer
imports it without the probes' machinery)."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from grpo_cli.algorithm.scored import ScoredBatch
from grpo_cli.rollout.batch import RolloutBatch


@dataclass
class ProbedStep:
    """What a probe reads from one training step: grpo-cli's trainer returns one
    (grpo_cli.train.step_data.StepOutput adds the metrics row), the TRL callback builds one."""

    batch: RolloutBatch
    advantages: torch.Tensor  # [N, L]
    scored: ScoredBatch  # its `correct` [N] splits groups into minority and majority
    loss_weights: torch.Tensor  # [N, L] the loss's aggregation weights
    layer_grads: dict[str, torch.Tensor] = field(default_factory=dict)  # batch gradients before the update
    # per-rollout Grams from the training pass ("advantage" [N, N], "score_blocks" [B, R, R]; empty: computed here)
    rollout_grams: dict[str, torch.Tensor] = field(default_factory=dict)
    # the trainer's gradient on the probed parameters is the per-rollout rows' sum, up to this
    # relative round-off (grad_norm_mismatch); None: it is not (a KL or value term, several passes)
    row_sum_rtol: float | None = None
