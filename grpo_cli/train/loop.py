"""One step of the training loop, shared by `grpo run` and every benchmark:
GRPO step -> probes if due -> held-out evaluation if due, every phase timed by one PhaseTimer.

The trainer names its own phases (rollout, reward, old_log_prob, advantage, forward, backward,
optimizer, update, sync_weights; grpo_cli/train/trainer.py); this loop adds probes and eval, and
`other` for the rest of the step. The totals become one timings.csv row (docs/results.md).
What to write where (results, checkpoints, alarms) stays with the caller.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from grpo_cli.probes.capture import step_capture
from grpo_cli.probes.runner import ProbeRows
from grpo_cli.results.rows import timing_row
from grpo_cli.runtime.memory import PhaseMemory
from grpo_cli.train.evaluate import evaluate
from grpo_cli.train.step_data import StepOutput
from grpo_cli.train.trainer import step_seed

if TYPE_CHECKING:
    from omegaconf import DictConfig

    from grpo_cli.train.setup import RunComponents


@dataclass
class LoopStep:
    output: StepOutput  # the trainer's step: metrics (with the probes' on probe steps), batch, ...
    probe_rows: ProbeRows | None  # on probe steps
    eval_row: dict | None  # one eval.csv row when the held-out evaluation ran after this step
    timings: dict  # one timings.csv row


class TrainingLoop:
    """Runs steps of one set of RunComponents (grpo_cli/train/setup.py)."""

    def __init__(self, cfg: DictConfig, parts: RunComponents):
        self.cfg = cfg
        self.trainer = parts.trainer
        self.probes = parts.probes
        self.model = parts.model
        self.device = parts.device
        self.timer = parts.trainer.timer
        # Peak CUDA memory per phase, fed by the timer (a timer built without one: step peak only)
        self.memory = self.timer.memory or PhaseMemory(self.device)
        self.steps = cfg.train.steps
        self.eval_every = cfg.eval.every  # 0 = no held-out evaluation

    def evaluation_due(self, finished: int) -> bool:
        """After `finished` steps: every `eval_every` steps and after the last (0 = never)."""
        every = self.eval_every
        return every > 0 and (finished % every == 0 or finished == self.steps)

    def evaluate(self, finished: int, seed: int = 0) -> dict:
        """One eval.csv row for the policy after `finished` steps."""
        trainer = self.trainer
        with trainer.autocast():  # sample as training does (bf16 when model.autocast=bf16)
            row = evaluate(trainer.backend, trainer.tokenizer, trainer.task, self.cfg, seed)
        return {"step": finished, **row}

    def run_step(self, step: int, update: bool = True) -> LoopStep:
        """Step `step`: with `update=False` (`grpo probe`), its probes at the current weights,
        without the optimizer step or the held-out evaluation."""
        timer = self.timer
        timer.clear()
        self.memory.start_step()
        probe_now = self.probes is not None and (not update or self.probes.due(step, self.steps))
        probe_rows, eval_row = None, None
        with timer.phase("other"):
            # ---- the GRPO step (its phases are timed inside; the probes' hook reads its gradients;
            # update=False stops before the optimizer: grpo probe) ----
            capture = (None if self.probes is None
                       else step_capture(self.probes, step, self.model, timer, probe=probe_now, update=update))
            output = self.trainer.step(step, capture=capture, update=update)
            # ---- probes: spectra of this step's gradients ----
            if probe_now:
                with timer.phase("probes"):
                    probe_rows = self.probes.record(step, output, self.model)
                output.metrics.update(probe_rows.metrics)
            elif capture is not None:  # off a probe step: the gradient's sparsity (claim 3)
                output.metrics.update(capture.metrics)
            # ---- held-out evaluation ----
            finished = step + 1
            if update and self.evaluation_due(finished):
                with timer.phase("eval"):
                    eval_row = self.evaluate(finished, seed=step_seed(self.cfg.seed, finished, salt=7))
        timings = timing_row(step, timer.take(), self.memory.step_peak_mb(), self.memory.phase_peaks())
        return LoopStep(output, probe_rows, eval_row, timings)
