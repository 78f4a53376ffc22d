"""Gradient spectra inside TRL's GRPOTrainer: one callback, grpo-cli's results contract.

    from grpo_cli.integrations.trl_spectra import SpectraCallback

    trainer = GRPOTrainer(model=..., reward_funcs=..., args=..., train_dataset=...)
    SpectraCallback(out_dir="results/my_sweep/R4", every=10).attach(trainer)
    trainer.train()

Under `accelerate launch --num_processes N` (DDP) every process attaches its own callback; the
main process alone writes `out_dir`, and the per-rollout matrices cover the global batch
(grpo_cli/integrations/trl_distributed.py). Under accelerate's FSDP2 plugin the same holds: every
process replays the gathered batch through the sharded model in lockstep, takes the Grams of its
share of the parameters from the captured layer inputs and output gradients (never `.grad`), and
reads `.grad` whole for the norms, sparsity and `layer` through collectives every process joins;
`update` and `grad_sum`, FSDP1 and DeepSpeed are refused (trl_batch.sharding_problems; docs/trl.md
"Sharded runs").

`grpo analyze results/my_sweep` then reads the runs as it reads its own (docs/results.md; the
files a TRL run writes differently are listed there under "Runs recorded inside TRL").

How it sees the batch. A transformers callback is handed no batch and no trainer, so `attach`
wraps seven methods of that one trainer instance (TRL's code, never grpo-cli's; each wrapper
calls the original and only records):

- `_generate_and_score_completions`: the step's rollouts before TRL shuffles them (groups
  contiguous): prompt and completion ids and masks, advantages, loss-token count;
- `_calculate_rewards`: each rollout's rewards (TRL's reward_weights applied, as it logs them);
- `compute_loss`: the loss value, and the entropy and clip fraction TRL records for the step;
- `_get_per_token_logps_and_entropies`, inside a training `compute_loss`: each token's entropy,
  which with that micro-batch's advantages gives the entropy split by the advantage's sign;
- `_clip_grad_norm`: called after the step's backward and before clipping and the optimizer:
  `grad_sum` adds the step's gradient here (every step, as `grpo run` does before clipping), the
  head's and embedding's squared gradient norms are taken, the layer weights are copied where
  `changed_every` is due (compared after the optimizer step: `on_optimizer_step`), and on probe
  steps the probes run here, at the weights the batch's loss was computed at;
- `train`: holds the run directory's lock (grpo_cli/results/lock.py, the one `grpo run` takes)
  for the whole run, and records `failed` in run.json when training raises;
- `log` (the Trainer's documented place to inject into the logs): a training log gets the probe
  steps' metrics.csv columns measured since the last one (the scalars `grpo run` sends to its
  trackers), so `report_to`'s loggers (TensorBoard, W&B, ...) and `state.log_history` have them.
  A callback's `on_log` could not: it runs after the loggers, which were added first. The
  per-step columns TRL does not log itself (LOGGED_STEP_COLUMNS) go the same way, every step.

The probes are grpo-cli's (`ProbeSuite`): the per-rollout rows are TRL's own per-rollout loss
gradients (trl_batch.py says which settings make that exact and refuses the others), their Grams
are exact float64 Grams with the ghost identity, computed with `torch.autograd.grad`, so TRL's
`.grad` is left as its backward made it. The forward they differentiate is TRL's: positions
0..L-1 whatever the left padding (TRL passes no position_ids) and logits / temperature
(`TrlLossForward`). They run in eval mode, in the model's dtype and without autocast: under
`bf16=True` they are the fp32-weights gradient, not the autocast one.
"""

from __future__ import annotations

import math
import time
from dataclasses import asdict, fields, replace
from pathlib import Path
from types import SimpleNamespace

import torch
import yaml
from torch import nn
from transformers import TrainerCallback

from grpo_cli.algorithm.advantages import get_estimator
from grpo_cli.algorithm.logprobs import accepts_logits_to_keep
from grpo_cli.algorithm.loss import uniform_weight_rollouts
from grpo_cli.algorithm.scored import ScoredBatch
from grpo_cli.config.schema import ProbesConfig
from grpo_cli.integrations.trl_batch import TrlStep, trl_rows, trl_step, unsupported_settings
from grpo_cli.integrations.trl_distributed import gather_rows, shared_grams
from grpo_cli.probes.head_share import HEAD_SHARE_COLUMNS, head_gradient_squares
from grpo_cli.probes.runner import PER_ROLLOUT_MATRICES, ProbeSuite, check_matrices
from grpo_cli.probes.step import ProbedStep
from grpo_cli.probes.step_change import STEP_CHANGED_COLUMNS, StepChange, step_change_due
from grpo_cli.probes.step_metrics import (
    ENTROPY_SIGN_COLUMNS,
    LossTotals,
    entropy_sign_sums,
    read_batch,
    step_metrics,
)
from grpo_cli.results.lock import RunLock
from grpo_cli.results.rows import metrics_row, run_record, timing_row, utc_now
from grpo_cli.results.writer import RunResults
from grpo_cli.runtime.files import load_plain
from grpo_cli.runtime.memory import peak_memory_mb
from grpo_cli.runtime.timing import PhaseTimer

# TRL's advantages, r_i - group mean (divided by a std under scale_rewards), are grpo's kind:
# outcome credit, zero-sum groups; run.json records grpo's estimator_facts
TRL_ESTIMATOR = "grpo"
TRL_METRICS = {"entropy": "entropy", "clip_frac": "clip_ratio/region_mean"}  # ours -> TRL's key
# timings.csv phases a TRL step is cut into (the loop's others, e.g. backward, stay blank:
# TRL's backward is counted in time_other)
TIMED = ("rollout", "reward", "forward", "optimizer", "probes", "other")
PROBE_STATE = "grpo_cli_probes.pt"  # grad_sum, saved inside each of TRL's checkpoint-N directories
# metrics.csv columns of every step that TRL's own logs lack, sent to its loggers (`_around_log`)
LOGGED_STEP_COLUMNS = (*HEAD_SHARE_COLUMNS, *STEP_CHANGED_COLUMNS, *ENTROPY_SIGN_COLUMNS, "distinct_correct")


class TrlLossForward(nn.Module):
    """The policy as TRL's loss calls it: no position_ids (so positions run 0..L-1 over left
    padding, as in TRL's `_get_per_token_logps_and_entropies`) and logits / temperature."""

    def __init__(self, policy: nn.Module, temperature: float):
        super().__init__()
        self.policy = policy
        self.temperature = temperature

    def forward(self, input_ids, attention_mask, position_ids=None, logits_to_keep: int = 0):
        del position_ids  # TRL's training forward passes none
        kwargs = {"logits_to_keep": logits_to_keep} if accepts_logits_to_keep(self.policy) else {}
        logits = self.policy(input_ids=input_ids, attention_mask=attention_mask, **kwargs).logits
        return SimpleNamespace(logits=logits / self.temperature)


class SpectraCallback(TrainerCallback):
    """Record grpo-cli's spectra, ranks and metrics of a TRL GRPOTrainer run into `out_dir`.

    every: probe when `global_step % every == 0` (and at the last step); matrices: any of
    rollout_group, rollout_batch, score_group, group_batch, layer, update, grad_sum (default all); other
    keyword arguments are `probes.*` settings (grpo_cli/config/schema.py: layer_regex,
    param_regex, gram_method, rank_rtol, ...). experiment / task name the run in config.yaml;
    a rollout counts as correct (accuracy_train, group composition) when its reward exceeds
    `success_threshold`.
    """

    def __init__(self, out_dir, every: int = 10, matrices: list[str] | None = None, *,
                 experiment: str | None = None, task: str = "unknown",
                 success_threshold: float = 0.5, **probes):
        known = {f.name for f in fields(ProbesConfig)}
        unknown = sorted(set(probes) - known)
        if unknown:
            raise ValueError(f"SpectraCallback: unknown probes setting(s) {unknown}; known: {sorted(known)}")
        if every < 1:
            raise ValueError(f"SpectraCallback: every={every} must be >= 1")
        self.probe_settings = ProbesConfig(every=every, **probes)
        if matrices is not None:
            self.probe_settings.matrices = list(matrices)
        check_matrices(self.probe_settings.matrices)
        self.run_dir = Path(out_dir)
        self.results: RunResults | None = None  # created when training begins
        self.experiment = experiment or self.run_dir.parent.name
        self.task = task
        self.success_threshold = success_threshold
        self.trainer = None
        self.probes: ProbeSuite | None = None
        self._lock: RunLock | None = None  # held from on_train_begin until train returns or raises
        self._originals: dict[str, object] = {}
        self._record: dict = {}
        # finite probe-step metrics.csv values since TRL's last training log: column -> values
        self._unlogged: dict[str, list[float]] = {}
        self._reset_step()

    # ---- installation ---------------------------------------------------------------------------
    def attach(self, trainer) -> SpectraCallback:
        """Check that the probes reproduce this trainer's loss, wrap its methods, add the callback."""
        if self.trainer is not None:
            raise RuntimeError("SpectraCallback is already attached to a trainer; make one per run")
        problems = unsupported_settings(trainer.args, trainer, self.probe_settings.matrices)
        if problems:
            raise ValueError("SpectraCallback cannot record this GRPOTrainer run:\n- " + "\n- ".join(problems))
        self.trainer = trainer
        wrappers = {  # TRL method -> what records around it
            "_generate_and_score_completions": self._around_generation,
            "_calculate_rewards": self._around_rewards,
            "compute_loss": self._around_compute_loss,
            "_get_per_token_logps_and_entropies": self._around_token_logps,
            "_clip_grad_norm": self._around_clip_grad_norm,
        }
        wrappers["train"] = self._around_train
        wrappers["log"] = self._around_log
        for name, around in wrappers.items():
            self._originals[name] = trainer.__dict__.get(name)  # None: the class's method
            setattr(trainer, name, _wrapped(around, getattr(trainer, name)))
        trainer.add_callback(self)
        return self

    def _detach(self) -> None:
        """Unwrap: the trainer is TRL's again."""
        for name, original in self._originals.items():
            if original is None:
                delattr(self.trainer, name)
            else:
                setattr(self.trainer, name, original)
        self._originals.clear()

    def _require_trainer(self):
        if self.trainer is None:
            raise RuntimeError(
                "SpectraCallback was passed to the trainer but never attached: call "
                "SpectraCallback(...).attach(trainer) after building the GRPOTrainer"
            )

    @property
    def _policy(self) -> nn.Module:
        return self.trainer.accelerator.unwrap_model(self.trainer.model)

    @property
    def _processes(self) -> int:  # DDP processes (trl_distributed.py); 1 without
        return self.trainer.accelerator.num_processes

    @property
    def _main(self) -> bool:  # the process that holds the run lock and writes
        return self.trainer.accelerator.is_main_process

    @property
    def _sharded(self) -> bool:  # FSDP2 (unsupported_settings refuses FSDP1 and DeepSpeed)
        return self.trainer.accelerator.distributed_type.name == "FSDP"

    def _reset_step(self) -> None:
        self._step_data: TrlStep | None = None
        self._rewards: torch.Tensor | None = None  # [N]
        self._loss = 0.0
        self._trl_metrics: dict[str, list[float]] = {key: [] for key in TRL_METRICS}
        self._grad_norm = math.nan
        self._probe_rows = None
        self._before_update_done = False
        self._entropy_sums: torch.Tensor | None = None  # [6] entropy_sign_sums over the micro-batches
        self._loss_entropies: torch.Tensor | None = None  # [n, Lc] inside a training compute_loss
        self._in_loss = False
        self._head_squares: torch.Tensor | None = None  # [3] before clipping
        self._step_change: StepChange | None = None  # W_t copied before the optimizer step
        self._step_changed: torch.Tensor | None = None  # [3] StepChange.after

    # ---- wrapped TRL methods --------------------------------------------------------------------
    def _around_train(self, original, *args, **kwargs):
        try:
            return original(*args, **kwargs)
        except BaseException as error:
            if self._lock is not None and self._record.get("status") == "running":
                self._record.update(status="failed", error=f"{type(error).__name__}: {error}",
                                    ended_at=utc_now())
                self.results.write_status(self._record)
            raise
        finally:
            if self._lock is not None:
                self._lock.__exit__(None, None, None)
                self._lock = None
            self._detach()

    def _around_log(self, original, logs, *args, **kwargs):
        """Add to a training log the mean of each probe metric over the probe steps since the
        last one (TRL's own metrics are means over the logging window too); NaN values (a metric
        not measured there) are left out, as `grpo run`'s trackers leave them out."""
        if self.trainer.model.training and self._unlogged:
            logs.update({column: sum(values) / len(values) for column, values in self._unlogged.items()})
            self._unlogged = {}
        return original(logs, *args, **kwargs)

    def _around_generation(self, original, *args, **kwargs):
        if not self.trainer.model.training:  # evaluation: not a training step
            return original(*args, **kwargs)
        with self.timer.phase("rollout"):
            output = original(*args, **kwargs)
        args_ = self.trainer.args
        rows = trl_rows(output, args_.loss_type, args_.max_completion_length, self._processes)
        if self._processes > 1:  # every process's rows, in the global batch's order
            rows = gather_rows(rows, self._policy.generation_config.pad_token_id)
        self._step_data = trl_step(rows, args_.num_generations)
        return output

    def _around_rewards(self, original, *args, **kwargs):
        if not self.trainer.model.training:
            return original(*args, **kwargs)
        with self.timer.phase("reward"):
            per_func = original(*args, **kwargs)  # [N, F]
        weights = self.trainer.reward_weights.to(per_func.device)  # [F]
        rewards = (per_func * weights).nansum(dim=1)  # [N], as TRL logs them
        self._rewards = rewards.masked_fill(per_func.isnan().all(dim=1), math.nan)
        return per_func

    def _around_compute_loss(self, original, *args, **kwargs):
        if not self.trainer.model.training:
            return original(*args, **kwargs)
        self._in_loss, self._loss_entropies = True, None
        try:
            with self.timer.phase("forward"):
                loss = original(*args, **kwargs)
        finally:
            self._in_loss = False
        self._loss += float(loss.detach())
        inputs = args[1] if len(args) > 1 else kwargs["inputs"]
        if self._loss_entropies is not None:  # EAPO's split over this micro-batch's loss tokens
            mask = inputs["completion_mask"].float()  # [n, Lc], as TRL's entropy metric
            if inputs.get("tool_mask") is not None:
                mask = mask * inputs["tool_mask"].float()
            advantages = inputs["advantages"]  # [n] (or [n, Lc])
            advantages = advantages.unsqueeze(1) if advantages.dim() == 1 else advantages
            sums = entropy_sign_sums(self._loss_entropies, advantages.expand_as(mask), mask)  # [6]
            self._entropy_sums = sums if self._entropy_sums is None else self._entropy_sums + sums
        logged = self.trainer._metrics["train"]  # what TRL logs for this micro-batch
        for ours, theirs in TRL_METRICS.items():
            if logged.get(theirs):
                self._trl_metrics[ours].append(float(logged[theirs][-1]))
        return loss

    def _around_token_logps(self, original, *args, **kwargs):
        """TRL's per-token log-probs and entropies; inside a training compute_loss the entropies
        are kept for the split by the advantage's sign."""
        output = original(*args, **kwargs)
        if self._in_loss and output[1] is not None:
            self._loss_entropies = output[1].detach()
        return output

    def _around_clip_grad_norm(self, original, *args, **kwargs):
        self._before_update()
        with self.timer.phase("optimizer"):
            norm = original(*args, **kwargs)
        self._grad_norm = float(norm)
        return norm

    # ---- callback events ------------------------------------------------------------------------
    def on_train_begin(self, args, state, control, **kwargs):
        self._require_trainer()
        if not self._originals:  # detached when its train() returned
            raise RuntimeError("SpectraCallback records one trainer.train(); attach a new one per run")
        policy = self._policy
        self._forward = TrlLossForward(policy, args.temperature)
        self.timer = PhaseTimer(next(policy.parameters()).device)
        failure = None
        if self._main:
            try:
                self._open_results(args, state, policy)
            except Exception as error:  # noqa: BLE001 - re-raised below, after telling the others
                failure = error
        if self._processes > 1:  # the other processes stop too (else they wait at the first gather)
            from accelerate.utils import broadcast_object_list

            message = broadcast_object_list([None if failure is None else f"{type(failure).__name__}: {failure}"])[0]
            if message is not None and not self._main:
                raise RuntimeError(f"SpectraCallback: the main process could not open {self.run_dir}: {message}")
        if failure is not None:
            raise failure
        if not self._main:  # its share of the per-rollout Grams only (trl_distributed.py), and
            # under FSDP2 its part of the collectives that read `.grad` whole (capture_layer_grads)
            shared = set(PER_ROLLOUT_MATRICES) | ({"layer"} if self._sharded else set())
            matrices = [m for m in self.probe_settings.matrices if m in shared]
            self.probes = ProbeSuite(replace(self.probe_settings, matrices=matrices), policy,
                                     self.run_dir / "checkpoints" / "initial_layers.pt")

    def _open_results(self, args, state, policy) -> None:
        """The main process: take the run lock, write config.yaml, trl_args.yaml and run.json."""
        self._lock = RunLock(self.run_dir).__enter__()  # RunLockedError names the holder; nothing written
        start = state.global_step
        saved_sums = _checkpoint_dir(args, start) / PROBE_STATE
        if start and "grad_sum" in self.probe_settings.matrices and not saved_sums.exists():
            raise ValueError(
                f"SpectraCallback: resuming at step {start} needs {saved_sums} (grad_sum up to that "
                "step, saved with TRL's checkpoint); without it pass matrices without grad_sum"
            )
        self.results = results = RunResults(self.run_dir)
        initial = results.run_dir / "checkpoints" / "initial_layers.pt"
        if start == 0:
            initial.unlink(missing_ok=True)  # W_0 of this run, not of an earlier one in out_dir
        (results.run_dir / "config.yaml").write_text(yaml.safe_dump(self._config(args, state), sort_keys=False))
        (results.run_dir / "trl_args.yaml").write_text(yaml.safe_dump(_plain(args.to_dict()), sort_keys=False))
        import trl

        self._record = run_record(
            trainer="trl", seed=args.seed, group_size=args.num_generations,
            estimator_facts=get_estimator(TRL_ESTIMATOR).facts(),
            model=_model_name(policy), task=self.task, experiment=self.experiment,
            param_regex=self.probe_settings.param_regex, weights="pretrained", reward="trl",
            device=str(next(policy.parameters()).device), resumed_from=start or None,
            versions_extra={"trl": trl.__version__}, extra={"loss_type": args.loss_type},
        )
        results.write_status(self._record)
        results.truncate_from(start)
        results.ensure_files()
        self.probes = ProbeSuite(self.probe_settings, policy, initial)
        if start and "grad_sum" in self.probes.matrices:
            self.probes.load_state_dict(load_plain(saved_sums))  # refuses a planted pickle unread

    def on_step_begin(self, args, state, control, **kwargs):
        self._reset_step()
        self._step = state.global_step
        self._probe_now = self.probes.due(self._step, state.max_steps)
        self.timer.clear()
        self._clock = time.perf_counter()

    def on_pre_optimizer_step(self, args, state, control, **kwargs):
        # without max_grad_norm TRL never calls _clip_grad_norm: probe and take the norm here
        self._before_update()
        if math.isnan(self._grad_norm):
            grads = [p.grad for p in self._policy.parameters() if p.grad is not None]
            self._grad_norm = float(torch.nn.utils.get_total_norm(grads)) if grads else 0.0
        self.timer.start("optimizer")

    def on_optimizer_step(self, args, state, control, **kwargs):
        self.timer.stop("optimizer")
        if self._step_change is not None:  # what the optimizer step changed (every process under FSDP2)
            with self.timer.phase("probes"):
                self._step_changed = self._step_change.after()
            self._step_change = None

    def on_step_end(self, args, state, control, **kwargs):
        if self._step_data is None:
            return
        time_step = time.perf_counter() - self._clock
        if self._processes > 1:  # the logged loss: the mean of the processes' losses, as DDP's gradient
            from accelerate.utils import reduce

            device = next(self._policy.parameters()).device
            self._loss = float(reduce(torch.tensor(self._loss, device=device), reduction="mean"))
            if self._entropy_sums is not None:  # every process's tokens (each measured its own rows)
                self._entropy_sums = reduce(self._entropy_sums, reduction="sum")
        if not self._main:
            return
        metrics = self._metrics_row()
        for column in LOGGED_STEP_COLUMNS:  # for TRL's loggers (_around_log)
            if math.isfinite(metrics[column]):
                self._unlogged.setdefault(column, []).append(float(metrics[column]))
        if self._probe_rows is not None:
            metrics.update(self._probe_rows.metrics)
            for column, value in self._probe_rows.metrics.items():  # for TRL's loggers (_around_log)
                if math.isfinite(value):
                    self._unlogged.setdefault(column, []).append(float(value))
        self.results.metrics.append([metrics])
        phases = self.timer.take()
        phases["other"] = time_step - sum(phases.values())  # TRL's backward included
        self.results.timings.append([timing_row(
            self._step, phases, peak_memory_mb(next(self._policy.parameters()).device), measured=TIMED,
        )])
        self._record["last_step"] = self._step
        self.results.write_status(self._record)

    def on_save(self, args, state, control, **kwargs):
        if self._main and "grad_sum" in self.probes.matrices:  # beside TRL's checkpoint, rotated away with it
            torch.save(self.probes.state_dict(), _checkpoint_dir(args, state.global_step) / PROBE_STATE)

    def on_train_end(self, args, state, control, **kwargs):
        if not self._main:
            return
        self._record.update(status="completed", ended_at=utc_now())
        self.results.write_status(self._record)

    # ---- probes and rows ------------------------------------------------------------------------
    def _before_update(self) -> None:
        """Once per step, after TRL's backward and before clipping: grad_sum += G_t (every step,
        like grpo run's StepCapture.after_backward), then on probe steps the probes (so `grad_sum` at
        step t is sum_{s<=t} G_s, as in grpo run)."""
        if self._before_update_done or self._step_data is None:
            return
        self._before_update_done = True
        self._head_squares = head_gradient_squares(self._policy)  # a collective under FSDP2
        if step_change_due(self.probe_settings.changed_every, self._step) and (self._main or self._sharded):
            with self.timer.phase("probes"):
                self._step_change = StepChange(self.probes.layer_params)
                self._step_change.before()
        if "grad_sum" in self.probes.matrices:
            with self.timer.phase("probes"):
                self.probes.accumulate_gradients()
        if self._probe_now:
            self._probe()

    def _probe(self) -> None:
        """Batch gradients (before clipping), then the spectra (on the main process; the other
        processes compute their share of the per-rollout Grams and, under FSDP2, take part in
        reading the sharded `.grad` whole)."""
        self.timer.start("probes")
        policy = self._policy
        layer_grads = self.probes.capture_layer_grads() if self._main or self._sharded else {}
        if not self._main:
            layer_grads = {}
        data = self._step_data
        correct = (self._rewards > self.success_threshold).float()  # NaN reward: not correct
        output = ProbedStep(
            batch=data.batch, advantages=data.advantages,
            scored=ScoredBatch(rewards=self._rewards, correct=correct),
            loss_weights=data.loss_weights, layer_grads=layer_grads,
            row_sum_rtol=self._row_sum_rtol(),
        )
        was_training = policy.training
        policy.eval()  # no dropout; HF models also skip gradient checkpointing in eval mode
        try:
            if self._processes > 1 and self.probes.matrices & set(PER_ROLLOUT_MATRICES):
                accelerator = self.trainer.accelerator
                output.rollout_grams = shared_grams(self.probes, self._step, output, self._forward,
                                                    accelerator.process_index, self._processes,
                                                    lockstep=self._sharded)
            if self._main:
                self._probe_rows = self.probes.record(self._step, output, self._forward)
        finally:
            policy.train(was_training)
        if self._main:
            self.results.ranks.append(self._probe_rows.ranks)
            self.results.spectra.append(self._probe_rows.spectra)
            self.results.grad_norms.append(self._probe_rows.grad_norms)
        self.timer.stop("probes")

    def _row_sum_rtol(self) -> float:
        """The rows are TRL's per-rollout loss gradients (trl_batch.py refuses the settings where
        they are not), so they add up to TRL's .grad (DDP's average: the rows are the global
        batch's) to float32 round-off, or to bf16's under bf16/fp16 autocast or bf16 weights
        (the probes differentiate the model's dtype without autocast; grad_norm_mismatch)."""
        args = self.trainer.args
        low = (getattr(args, "bf16", False) or getattr(args, "fp16", False)
               or next(self._policy.parameters()).dtype not in (torch.float32, torch.float64))
        return 5e-2 if low else 1e-4

    def _metrics_row(self) -> dict:
        """The step's metrics.csv row (grpo_cli/probes/step_metrics.py): no sampler log-probs, KL,
        value head or problem ids here (NaN)."""
        data, rewards = self._step_data, self._rewards
        correct = (rewards > self.success_threshold).float()  # NaN reward: not correct
        trl = {key: (sum(v) / len(v) if v else math.nan) for key, v in self._trl_metrics.items()}
        # at ratio 1 with no KL (what unsupported_settings admits) d loss / d log pi = -w A exactly
        token_weight_counts = uniform_weight_rollouts(
            -(data.loss_weights * data.advantages), data.advantages, data.batch.completion_mask)
        readings = read_batch(data.batch, ScoredBatch(rewards=rewards, correct=correct), data.advantages,
                              token_weight_counts, entropy_sums=self._entropy_sums,
                              head_squares=self._head_squares, step_changed=self._step_changed)
        losses = LossTotals(loss=self._loss, pg_loss=self._loss,  # unsupported_settings admits no other term
                            kl=math.nan, value_loss=math.nan, entropy=trl["entropy"], clip_frac=trl["clip_frac"])
        return metrics_row(step_metrics(self._step, readings, losses, self._grad_norm))

    def _config(self, args, state) -> dict:
        """config.yaml: grpo-cli's keys for what TRL sets (R, B, sampling, loss), plus the probes."""
        rows = args.generation_batch_size or args.per_device_train_batch_size * args.gradient_accumulation_steps
        return {
            "experiment": {"name": self.experiment},
            "seed": args.seed,
            "trainer": "trl",
            "model": {"name": _model_name(self._policy)},
            "task": {"name": self.task},
            "rollout": {
                "group_size": args.num_generations,
                "prompts_per_step": rows // args.num_generations,
                "max_new_tokens": args.max_completion_length,
                "temperature": args.temperature,
                "top_p": args.top_p,
                "top_k": args.top_k,
            },
            "algorithm": {
                "name": TRL_ESTIMATOR,
                "loss_type": args.loss_type,
                "scale_rewards": args.scale_rewards,
                "epsilon": args.epsilon,
                "epsilon_high": args.epsilon_high,
                "gradient_accumulation_steps": args.gradient_accumulation_steps,
            },
            "train": {"steps": state.max_steps, "processes": self._processes},  # DDP processes
            "optim": {"lr": args.learning_rate, "max_grad_norm": args.max_grad_norm},
            "probes": _plain(asdict(self.probe_settings)),
            "success_threshold": self.success_threshold,
        }


def _wrapped(around, original):
    """original(*args, **kwargs), called by `around(original, ...)`, which records around it."""

    def call(*args, **kwargs):
        return around(original, *args, **kwargs)

    return call


def _checkpoint_dir(args, step: int) -> Path:
    """TRL's checkpoint directory for `step` (transformers' PREFIX_CHECKPOINT_DIR naming)."""
    return Path(args.output_dir) / f"checkpoint-{step}"


def _model_name(policy: nn.Module) -> str:
    return str(getattr(policy.config, "_name_or_path", "") or type(policy).__name__)


def _plain(tree):
    """YAML-safe copy: enums and other objects as strings."""
    if isinstance(tree, dict):
        return {str(k): _plain(v) for k, v in tree.items()}
    if isinstance(tree, (list, tuple)):
        return [_plain(v) for v in tree]
    if tree is None or isinstance(tree, (bool, int, float, str)):
        return tree
    return str(tree)
