"""One step's part in the trainer's update: what a probe step captures before the optimizer.

`step_capture` hands the trainer a `StepCapture` for a `ProbeSuite` (runner.py). On a probe step
it takes the per-rollout Gram factors from the training forward and backward where that is exact
(fused.py), else it asks the suite for its separate pass; on every step it adds the pass's
gradient to `grad_sum`, off probe steps it measures the gradient's sparsity where due, and where
`probes.changed_every` says it copies the layer weights before the update and counts what the
update changed (`after_update`, step_change.py).
"""

from __future__ import annotations

import math
from contextlib import contextmanager
from typing import TYPE_CHECKING

import torch

from grpo_cli.probes.chunked_gram import ShareBuilder, check_rtol
from grpo_cli.probes.fused import (
    TrainingPassFactors,
    per_rollout_advantage,
    score_blocks_from_advantage,
    score_groups_to_recompute,
)
from grpo_cli.probes.gram import group_blocks
from grpo_cli.probes.per_sample import CHUNK_ELEMS
from grpo_cli.probes.step_change import StepChange, step_change_due
from grpo_cli.runtime.timing import PhaseTimer

if TYPE_CHECKING:
    from grpo_cli.probes.runner import ProbeSuite


class StepCapture:
    """One probe step's part in the trainer's update (`GRPOTrainer.step(capture=...)`).

    `training_pass`: this step takes the per-rollout factors from the training forward and
    backward (fused.py); the trainer says whether its loss allows it. `unshare_prompts`: it may
    also run each row's prompt forward where training shares prompts (probes.fused_gram=always;
    under `auto` such steps take the separate pass: on the CPU preset, whose prompts are longer
    than its completions, the unshared forward costs what the separate pass saves, docs/speed_log.md).
    `micro_batch(rows)` wraps one micro-batch's forward and backward of the batch rows `rows`
    (with train.backward_live_rows, only the rows that have a gradient); `before_update` runs after
    the last backward and before the optimizer: the batch gradients of the layer matrices and the
    per-rollout Grams, all at the weights the loss was computed at.
    """

    def __init__(self, suite: ProbeSuite, step: int, model: torch.nn.Module,
                 timer: PhaseTimer | None = None, probe: bool = True, sparsity: bool = False,
                 changed: bool = False):
        self.suite, self.step, self.model, self.timer = suite, step, model, timer
        self.probe = probe  # False: a step that only adds to grad_sum and/or measures sparsity
        self.sparsity = sparsity  # off a probe step: grad_sparsity / grad_hoyer (metrics)
        # step_changed_frac*: the layer weights before the update, compared after it
        self.step_change = StepChange(suite.layer_params, suite.optimizer) if changed else None
        self.metrics: dict[str, float] = {}  # what an off-probe step measured, for metrics.csv
        self.per_rollout = probe and suite.per_rollout_matrices
        self.training_pass = suite.fuse_training_pass and self.per_rollout
        self.unshare_prompts = suite.cfg.fused_gram == "always"
        self.source = ""  # where the per-rollout Grams came from: training_pass | separate_pass
        self._factors: TrainingPassFactors | None = None

    @contextmanager
    def micro_batch(self, rows: list[int]):  # the batch rows this forward and backward hook, in order
        if self._factors is None:
            cfg = self.suite.cfg
            device = next(self.model.parameters()).device
            builder = ShareBuilder(cfg.gram_method, check_rtol(self.model), device, cfg.sketch_dim,
                                   self.step, CHUNK_ELEMS)
            self._factors = TrainingPassFactors(self.model, self.suite.gram_params, builder)
        with self._factors.micro_batch(rows):
            yield
            if self.timer is not None:  # turning the factors into Gram shares is probe time
                self.timer.start("probes")
        if self.timer is not None:
            self.timer.stop("probes")

    def before_update(self, batch, advantages, loss_weights, fused: bool) -> tuple[dict, dict]:
        """(layer batch gradients, per-rollout Grams) for `StepOutput` (empty off probe steps)."""
        suite = self.suite
        if self.step_change is not None:  # before the first optimizer step: W_t
            self.step_change.before()
        if not self.probe:
            if self.sparsity:
                self.metrics = suite.measure_sparsity()
            return {}, {}
        layer_grads = suite.capture_layer_grads()
        if not self.per_rollout:
            return layer_grads, {}
        grams = self._fused_grams(batch, advantages, loss_weights) if fused else None
        self.source = "separate_pass" if grams is None else "training_pass"
        if grams is None:
            grams = suite.rollout_grams(self.step, batch, loss_weights, advantages, self.model)
        return layer_grads, grams

    def after_update(self) -> torch.Tensor | None:
        """After the step's last optimizer step: its step_changed_frac* values [3] on the device
        (None where not due), timed as probes."""
        if self.step_change is None:
            return None
        if self.timer is None:
            return self.step_change.after()
        with self.timer.phase("probes"):
            return self.step_change.after()

    def after_backward(self) -> None:
        """Every pass of every step, before clipping: grad_sum += G_t."""
        if "grad_sum" in self.suite.matrices:
            self.suite.accumulate_gradients()

    def _fused_grams(self, batch, advantages, weights) -> dict[str, torch.Tensor] | None:
        suite = self.suite
        factors, self._factors = self._factors, None
        if factors is None:  # nothing hooked: no row had a gradient (train.backward_live_rows)
            gram = torch.zeros(batch.num_rollouts, batch.num_rollouts, dtype=torch.float64,
                               device=next(self.model.parameters()).device)
        else:
            gram, _ = factors.gram(not suite.hooks_verified, batch.num_rollouts)
        if gram is None:  # a use the hooks missed: the separate pass from now on
            suite.fall_back_to_separate_pass()
            return None
        if factors is not None:
            suite.hooks_passed()
        grams = {"advantage": gram,  # [N, N]
                 "param_diagonals": suite.param_diagonals({} if factors is None else factors.diagonals,
                                                          batch.num_rollouts, gram.device)}
        if not suite.needs_score:
            return grams
        size = batch.group_size
        per_rollout = per_rollout_advantage(advantages, batch.completion_mask)  # [N] or None
        recompute = score_groups_to_recompute(per_rollout, batch.num_rollouts // size)
        blocks = (
            score_blocks_from_advantage(group_blocks(gram, size), per_rollout)
            if per_rollout is not None
            else gram.new_full((len(recompute), size, size), math.nan)
        )  # [B, R, R]
        groups = recompute.nonzero().flatten()  # [G]
        if groups.numel():
            rows = (groups.unsqueeze(1) * size + torch.arange(size)).flatten()  # [G * R]
            separate = suite.score_rows_gram(self.step, batch, weights, rows, self.model)
            blocks[groups.to(blocks.device)] = group_blocks(separate, size).to(blocks.device)
        grams["score_blocks"] = blocks
        return grams


def step_capture(suite: ProbeSuite, step: int, model: torch.nn.Module, timer: PhaseTimer | None = None,
                 probe: bool = True, update: bool = True) -> StepCapture | None:
    """What step `step` asks of the trainer's update (`GRPOTrainer.step(capture=...)`): on a
    probe step the pre-update gradients, on every step grad_sum's running sum, off probe
    steps the gradient's sparsity where `suite.sparsity_due`, on a step that updates (`update`)
    the weights it changes where `probes.changed_every` says; None when it asks nothing."""
    sparsity = not probe and suite.sparsity_due(step)
    changed = update and step_change_due(suite.cfg.changed_every, step)
    if not probe and not sparsity and not changed and "grad_sum" not in suite.matrices:
        return None
    return StepCapture(suite, step, model, timer, probe=probe, sparsity=sparsity, changed=changed)
