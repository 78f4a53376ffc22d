"""The data one GRPO step hands from phase to phase (trainer.py): what the advantages phase
gives the update (`Targets`), what every pass shares (`UpdatePlan`), what a micro-batch and an
update return, the probes' hook (`ProbeCapture`), and the step's result (`StepOutput`).
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Protocol

import torch

from grpo_cli.probes.step import ProbedStep
from grpo_cli.probes.step_metrics import LossTotals
from grpo_cli.rollout.batch import RolloutBatch


@dataclass
class StepOutput(ProbedStep):
    """One GRPO step: what the probes read (batch, advantages, scores, loss weights; on probe
    steps the gradients captured before the update) and its metrics.csv row."""

    metrics: dict = field(default_factory=dict)  # one row of metrics.csv (grpo_cli/results/rows.py)


@dataclass
class Targets:
    """What the update trains toward, from the advantages phase."""

    advantages: torch.Tensor  # [N, L] each token's advantage
    returns: torch.Tensor | None  # [N, L] the value head's targets (estimators with values)
    tis: torch.Tensor  # [N, L] truncated importance weights (ones when algorithm.tis_cap <= 0)
    old_logprobs: torch.Tensor | None  # [N, L] None with one pass: the training forward's own serve
    ref_logprobs: torch.Tensor | None  # [N, L] the reference's, for the KL term (None when off)
    single_pass: bool  # one pass at ratio 1, no value head, no TIS


@dataclass(frozen=True)
class UpdatePlan:
    """What every pass of one step's update shares, fixed before the first (`_plan_update`)."""

    micro: list[slice]  # the micro-batches' row ranges
    shares: list[float]  # each micro-batch's share of the batch's completion tokens
    batch_tokens: float  # completion tokens in the batch (mask sum)
    completion_positions: int  # ... as positions: the size of the metrics' log-prob gather
    constant: int  # loss normaliser of algorithm.loss_agg=constant
    weights: torch.Tensor  # [N, L] the loss's aggregation weights (the probes read them)
    fused: bool  # the probes take their per-rollout factors from this forward and backward
    shared_prompt_forward: bool  # one prompt forward per distinct prompt (off when fused)
    prompt_keys: list[tuple[int, ...]] | None  # [N] each row's prompt tokens
    widths: list[int] | None  # [N] each row's completion columns through its last token (buckets > 1)
    live: list[bool] | None  # [N] rows whose loss has a gradient (train.backward_live_rows), else None
    nan_loss: bool  # fault.kind=nan_loss: the last micro-batch's loss becomes NaN (fault.py)


@dataclass(frozen=True)
class UpdateResult:
    """What one step's update returns: its first pass's readings, what every pass adds to the
    token-weight counts, and on probe steps what the probes captured before the optimizer."""

    grad_norm: float  # the first pass's gradient norm, before clipping
    losses: LossTotals  # the first pass's logged terms (`logged_totals`)
    policy_logprobs: torch.Tensor  # [N, L] the first pass's log-probs, for the log-prob guard
    # every pass: (informative rollouts with uniform token loss weights, informative rollouts,
    # their summed relative weight spread) [3], `uniform_weight_rollouts` summed
    token_weight_counts: torch.Tensor
    layer_grads: dict[str, torch.Tensor]  # probe steps: batch gradients (else empty)
    rollout_grams: dict[str, torch.Tensor]  # ... and per-rollout Grams
    entropy_sums: torch.Tensor  # [6] the first pass's `entropy_sign_sums`, summed over micro-batches
    head_squares: torch.Tensor  # [3] the first pass's `head_gradient_squares`, before clipping
    step_changed: torch.Tensor | None  # [3] the update's step_changed_frac* (None: not measured)


@dataclass(frozen=True)
class MicroBatchOutput:
    """What one micro-batch's forward and backward give its pass (no host read)."""

    terms: torch.Tensor  # [6] LOGGED_TERMS, float64
    logprobs: torch.Tensor  # [n, L] the policy's log-probs of its rows, detached
    token_weight_counts: torch.Tensor  # [3] `uniform_weight_rollouts` of its rows
    entropy_sums: torch.Tensor  # [6] `entropy_sign_sums` of its rows


class ProbeCapture(Protocol):
    """Everything the probes ask of a step's update, the one hook between trainer and probes
    (grpo_cli/probes/capture.py: StepCapture). Probe steps read the first pass's gradients;
    `grad_sum` reads every pass's raw gradient."""

    training_pass: bool  # wants the per-rollout factors of the training forward and backward
    unshare_prompts: bool  # ... even where that means each row's own prompt forward

    def micro_batch(self, rows: list[int]) -> AbstractContextManager:
        """Around one micro-batch's forward and backward of the batch rows `rows` (in order):
        every row of the micro-batch, or with train.backward_live_rows those with a gradient."""

    def before_update(self, batch: RolloutBatch, advantages: torch.Tensor, loss_weights: torch.Tensor,
                      fused: bool) -> tuple[dict, dict]:
        """After the first pass's backward, before the optimizer: (layer_grads, rollout_grams),
        both empty on a step that probes nothing."""

    def after_backward(self) -> None:
        """After every pass's backward, before clipping (grad_sum += G_t)."""

    def after_update(self) -> torch.Tensor | None:
        """After the step's last optimizer step: the step_changed_frac* values [3] on the device
        (probes/step_change.py), None where not measured."""
