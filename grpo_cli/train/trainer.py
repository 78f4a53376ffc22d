"""The GRPO loop, top to bottom: rollout -> reward -> advantage -> loss -> step -> probe -> log.

Departures from the paper's (unspecified) setup, all configurable: advantages use the population
std of the group (zero-variance groups get advantage 0, never NaN); the loss is the token-level
PPO-clip surrogate with the aggregation of `algorithm.loss_agg`; the KL to the reference is a
separate k3 loss term, off by default; sampler log-probs are recomputed by the policy and their
difference logged (the log-prob mismatch guard).
"""

from __future__ import annotations

import math
import random
from contextlib import ExitStack
from functools import partial

import torch

from grpo_cli.algorithm.advantages import TokenProbs, get_estimator
from grpo_cli.algorithm.loss import (
    actor_loss,
    aggregation_weights,
    token_loss_weights,
    uniform_weight_rollouts,
    value_loss,
)
from grpo_cli.algorithm.optim import build_optimizer, master_params
from grpo_cli.algorithm.scored import (
    ScoredBatch,
    mean_expected_zero_variance_fraction,
    zero_variance_groups,
)
from grpo_cli.probes.head_share import head_gradient_squares
from grpo_cli.probes.step_metrics import entropy_sign_sums, read_batch, step_metrics
from grpo_cli.results.rows import metrics_row
from grpo_cli.rollout.base import SamplingSettings
from grpo_cli.rollout.batch import RolloutBatch, concat_batches, select_groups, select_rows
from grpo_cli.runtime.memory import PhaseMemory
from grpo_cli.runtime.timing import PhaseTimer
from grpo_cli.tasks.rehearsal import REWARDS, random_rewards
from grpo_cli.train.autocast import keep_lm_head_fp32, policy_autocast, policy_forward_autocast
from grpo_cli.train.credit import (
    overlong_penalty,
    step_tensors,
    token_advantages,
)
from grpo_cli.train.fault import Fault
from grpo_cli.train.non_finite import batch_report, gradient_report
from grpo_cli.train.pass_reading import NonFiniteLossError, logged_totals, read_pass
from grpo_cli.train.policy_forward import (
    forward_policy,
    in_row_order,
    length_buckets,
    token_probabilities,
)
from grpo_cli.train.problem_success import ProblemSuccess
from grpo_cli.train.step_data import (
    MicroBatchOutput,
    ProbeCapture,
    StepOutput,
    Targets,
    UpdatePlan,
    UpdateResult,
)


def step_seed(seed: int, step: int, salt: int = 0) -> int:
    """Per-step seed, so a resumed run draws exactly what an uninterrupted one would."""
    return (seed * 1_000_003 + step * 7919 + salt) % (2**31 - 1)


class GRPOTrainer:
    """Owns the policy, optimizer, sampler and task for one run; `step()` does one GRPO update."""

    def __init__(
        self,
        cfg,
        model,
        tokenizer,
        task,
        backend,
        device: torch.device,
        reference_model=None,
        value_head=None,
        timer: PhaseTimer | None = None,
    ):
        self.cfg = cfg
        self.model = model
        self.tokenizer = tokenizer
        self.task = task
        self.backend = backend
        self.device = device
        self.reference_model = reference_model
        self.value_head = value_head
        # The step's phases (the loop adds probes and eval), with each phase's peak CUDA memory
        self.timer = timer or PhaseTimer(device, memory=PhaseMemory(device))
        named = [(name, p) for name, p in model.named_parameters() if p.requires_grad]
        trainable = [p for _, p in named]
        if value_head is not None:
            trainable += list(value_head.parameters())
        master = master_params(named, cfg.model.master_weights, cfg.probes.layer_regex)
        self.optimizer = build_optimizer(trainable, cfg.optim, seed=cfg.seed, master=master)
        self.settings = SamplingSettings(
            group_size=cfg.rollout.group_size,
            max_new_tokens=cfg.rollout.max_new_tokens,
            temperature=cfg.rollout.temperature,
            top_p=cfg.rollout.top_p,
        )
        self.prompt_ids = [
            tokenizer(task.prompt(problem), add_special_tokens=False)["input_ids"]
            for problem in task.train
        ]
        self.problem_success = ProblemSuccess()  # per-problem success so far (checkpointed)
        self.shared_prompt_forward = cfg.train.shared_prompt_forward
        self.chunk_mb = cfg.train.logits_chunk_mb
        self.buckets = cfg.train.completion_buckets
        self.backward_live_rows = cfg.train.backward_live_rows
        self.autocast_kind = cfg.model.autocast
        policy_autocast(device, self.autocast_kind)  # validates the setting
        if cfg.task.reward not in REWARDS:
            raise ValueError(f"task.reward={cfg.task.reward!r} is not one of {', '.join(REWARDS)}")
        if self.autocast_kind != "none" and not cfg.model.autocast_head:
            keep_lm_head_fp32(model)  # log-probs from fp32 logits (autocast_head: from bf16 ones)
        self.fault = Fault.from_config(cfg)  # fault.*: a failure on purpose (rehearsals, tests)

    def autocast(self):
        """Context for sampling: bf16 autocast when model.autocast=bf16."""
        return policy_autocast(self.device, self.autocast_kind)

    def forward_autocast(self):
        """Context for the forwards that score or train the policy: `autocast`, and on a CPU
        attention in float32 under it (train/autocast.py)."""
        return policy_forward_autocast(self.model, self.device, self.autocast_kind)

    def step(self, step: int, capture: ProbeCapture | None = None, update: bool = True) -> StepOutput:
        """One GRPO step in four phases, each a method below, timed by `self.timer` under the
        phase names of timings.csv (grpo_cli/results/rows.py PHASES):

        1. rollout (`collect`): sample a group per prompt and score it (rollout, reward);
        2. advantages (`_advantages`): the pre-update log-probs the update needs, then each token's
           advantage (old_log_prob, advantage);
        3. update (`_plan_update`, then `_update`): what every pass shares, then forward,
           backward and optimizer per micro-batch and pass (forward, backward, optimizer and the
           probes' hook inside update), then the sampler's copy of the new weights (sync_weights);
        4. metrics (`_metrics`): the metrics.csv row (the loop's `other`).

        Host reads (device syncs on CUDA; tests/test_trainer_syncs.py counts them): the token
        counts before the update, one per pass (its logged terms and gradient norm), and one for
        the metrics row. `capture` (the probes' hook) records gradients before the optimizer step;
        `update=False` stops there (`grpo probe`: the step's probes at fixed weights, whose weights,
        optimizer and sampler stay as they were).
        """
        self.fault.before_step(step)  # fault.kind=crash or interrupt at fault.step (off by default)
        # 1. rollout: each prompt's group of completions, scored (dynamic sampling refills groups)
        with self.autocast():
            batch, scored, dropped = self.collect(step)
        # 2. advantages: each token's advantage, with the log-probs the loss compares against
        targets = self._advantages(batch, scored)
        # 3. update: the passes over the batch, then the sampler gets the new weights
        with self.timer.phase("update"):
            plan = self._plan_update(step, batch, targets, capture)  # host read: the token counts
            result = self._update(step, batch, targets, plan, capture, apply=update)
        if update:
            with self.timer.phase("sync_weights"):
                self.backend.sync_weights(self.model)
        # 4. metrics: the metrics.csv row, in one host read
        metrics = self._metrics(step, batch, scored, dropped, targets, plan, result)
        return StepOutput(batch, targets.advantages, scored, plan.weights, result.layer_grads,
                          result.rollout_grams, row_sum_rtol=self.row_sum_rtol(targets.single_pass),
                          metrics=metrics)

    # ---- 1. rollout and reward -------------------------------------------------------------------
    def collect(self, step: int) -> tuple[RolloutBatch, ScoredBatch, int]:
        """Rollouts for one step; with dynamic sampling, refill dropped zero-variance groups."""
        algorithm = self.cfg.algorithm
        batch = self.rollout(step, draw=0)
        scored = self.score(batch)
        if not algorithm.dynamic_sampling:
            return batch, scored, 0
        wanted = self.cfg.rollout.prompts_per_step
        kept_batches, dropped = [], 0
        candidate = batch
        for draw in range(algorithm.dynamic_sampling_max_draws + 1):
            if draw > 0:
                candidate = self.rollout(step, draw)
            candidate_scored = scored if draw == 0 else self.score(candidate)
            informative = (~zero_variance_groups(candidate_scored.rewards, candidate.group_size)).nonzero()
            informative = informative.flatten().tolist()
            dropped += candidate.num_groups - len(informative)
            have = sum(b.num_groups for b in kept_batches)
            if informative:
                kept_batches.append(select_groups(candidate, informative[: wanted - have]))
            if sum(b.num_groups for b in kept_batches) >= wanted:
                break
        if not kept_batches:  # nothing informative within the cap: train on the last draw (zero grad)
            kept_batches = [candidate]
        batch = concat_batches(kept_batches, self.tokenizer.pad_token_id)
        return batch, self.score(batch), dropped

    def sample_problems(self, step: int, draw: int) -> list[int]:
        rng = random.Random(step_seed(self.cfg.seed, step, salt=draw))
        return rng.sample(range(len(self.task.train)), self.cfg.rollout.prompts_per_step)

    def rollout(self, step: int, draw: int) -> RolloutBatch:
        indices = self.sample_problems(step, draw)
        with self.timer.phase("rollout"):
            try:
                batch = self.backend.generate(
                    [self.prompt_ids[i] for i in indices],
                    self.settings,
                    generator_seed=step_seed(self.cfg.seed, step, salt=100 + draw),
                )
            except RuntimeError as error:  # torch's sampler refuses inf / nan probabilities
                if "inf" not in str(error) and "nan" not in str(error):
                    raise
                largest = max(float(p.detach().abs().max()) for p in self.model.parameters())
                raise NonFiniteLossError(
                    f"step {step}: sampling met non-finite probabilities (largest |weight| "
                    f"{largest:.3g} after the previous update); lower optim.lr"
                ) from error
        batch.problem_indices = indices
        return batch.to(self.device)

    def score(self, batch: RolloutBatch) -> ScoredBatch:
        with self.timer.phase("reward"):
            return self._score(batch)

    def _score(self, batch: RolloutBatch) -> ScoredBatch:
        algorithm = self.cfg.algorithm
        problems = [
            self.task.train[index] for index in batch.problem_indices for _ in range(batch.group_size)
        ]
        if self.cfg.task.reward == "random":  # rehearsals only (grpo_cli/tasks/rehearsal.py)
            values = random_rewards(self.cfg.seed, list(batch.problem_indices), batch.completions,
                                    batch.group_size)
        else:
            values = [self.task.reward(text, problem)
                      for text, problem in zip(batch.completions, problems, strict=True)]
        correct = torch.tensor(values).to(self.device, non_blocking=True)  # [N] no device sync
        rewards = correct + overlong_penalty(
            batch.completion_lengths(), self.settings.max_new_tokens,
            algorithm.overlong_buffer, algorithm.overlong_penalty,
        )
        scored = ScoredBatch(rewards=rewards, correct=correct)
        if get_estimator(algorithm.name).needs_step_rewards:
            checks = [
                self.task.step_checks(text, problem)
                for text, problem in zip(batch.completions, problems, strict=True)
            ]
            scored.step_rewards, scored.step_index = step_tensors(
                batch, checks, rewards, algorithm.process_step_weight, self.tokenizer
            )
        return scored

    # ---- 2. advantages ---------------------------------------------------------------------------
    def _advantages(self, batch: RolloutBatch, scored: ScoredBatch) -> Targets:
        """The pre-update log-probs (sampling policy, reference) and per-token probabilities the
        estimator and the loss need, then each token's advantage and TIS weight."""
        algorithm, timer = self.cfg.algorithm, self.timer
        # With one pass over the batch the ratio is exactly 1 at the update, so the training
        # forward's own detached log-probs serve as "old" and the extra forward is skipped.
        single_pass = (
            algorithm.num_iterations == 1 and self.value_head is None and algorithm.tis_cap <= 0
        )
        with timer.phase("old_log_prob"):
            old_logprobs, values = (None, None) if single_pass else self.old_logprobs_and_values(batch)
            token_probs = self.token_probs(batch)  # otb: each token's pi and sum pi^2
            ref_logprobs = self.reference_logprobs(batch)  # [N, L] for the KL term, None when off
        with timer.phase("advantage"):
            advantages, returns = token_advantages(algorithm, batch, scored, values, token_probs)  # [N, L]
            mask = batch.completion_mask  # [N, L]
            tis = torch.ones_like(mask)
            if algorithm.tis_cap > 0:  # truncated importance sampling: sampler -> policy correction
                tis = (old_logprobs - batch.sampler_logprobs).exp().clamp(max=algorithm.tis_cap) * mask
        return Targets(advantages, returns, tis, old_logprobs, ref_logprobs, single_pass)

    def old_logprobs_and_values(self, batch: RolloutBatch):
        """Log-probs of the policy that sampled (and, for ppo, values) before any update."""
        with torch.no_grad():
            parts_lp, parts_v = [], []
            keys = self.prompt_keys(batch)
            for rows in self.micro_batches(batch.num_rollouts):
                part = select_rows(batch, rows)
                with self.forward_autocast():
                    logprobs, _, hidden = forward_policy(
                        self.model, part, want_hidden=self.value_head is not None,
                        shared_prompt_forward=self.shared_prompt_forward, chunk_mb=self.chunk_mb,
                        prompt_keys=None if keys is None else keys[rows],
                    )
                parts_lp.append(logprobs)
                if self.value_head is not None:
                    parts_v.append(self.value_head(hidden))
            values = torch.cat(parts_v) if parts_v else None
            return torch.cat(parts_lp), values

    def token_probs(self, batch: RolloutBatch) -> TokenProbs | None:
        """The pre-update policy's per-token probabilities, for estimators that need them (otb)."""
        if not get_estimator(self.cfg.algorithm.name).needs_token_probs:
            return None
        parts = []
        for rows in self.micro_batches(batch.num_rollouts):
            with self.forward_autocast():
                parts.append(token_probabilities(self.model, select_rows(batch, rows), self.chunk_mb))
        return TokenProbs(torch.cat([p[0] for p in parts]), torch.cat([p[1] for p in parts]))

    def reference_logprobs(self, batch: RolloutBatch) -> torch.Tensor | None:
        if self.reference_model is None:
            return None
        keys = self.prompt_keys(batch)
        with torch.no_grad():
            return torch.cat(
                [forward_policy(self.reference_model, select_rows(batch, rows),
                                shared_prompt_forward=self.shared_prompt_forward, chunk_mb=self.chunk_mb,
                                prompt_keys=None if keys is None else keys[rows])[0]
                 for rows in self.micro_batches(batch.num_rollouts)]
            )

    # ---- 3. update -------------------------------------------------------------------------------
    def _update(self, step: int, batch: RolloutBatch, targets: Targets, plan: UpdatePlan,
                capture: ProbeCapture | None, apply: bool = True) -> UpdateResult:
        """Forward, backward and optimizer per micro-batch, for each of algorithm.num_iterations
        passes (`apply=False`: the first pass's forward, backward and probes only, no optimizer).
        No host read per micro-batch: the logged terms stay tensors until one read per pass
        (`pass_reading.read_pass`), which stops the run on a non-finite loss or norm before any update."""
        algorithm, timer = self.cfg.algorithm, self.timer
        params = [p for group in self.optimizer.param_groups for p in group["params"]]
        self.model.train()
        counts = batch.completion_mask.new_zeros(3, dtype=torch.float64)  # token weights, every pass
        layer_grads, rollout_grams = {}, {}  # probe steps: what the probes capture before the optimizer
        for iteration in range(algorithm.num_iterations):
            first = iteration == 0
            self.optimizer.zero_grad(set_to_none=True)
            outputs = [self._micro_batch(batch, rows, share, targets, plan, capture if plan.fused and first else None)
                       for rows, share in zip(plan.micro, plan.shares, strict=True)]
            for output in outputs:
                counts = counts + output.token_weight_counts
            if plan.live is not None and not any(plan.live):  # no backward ran: the zero
                for p in params:  # gradients it would have left, so AdamW steps as it would
                    if p.grad is None:
                        p.grad = torch.zeros_like(p)
            with timer.phase("optimizer"):  # the gradient norm (what clip_grad_norm_ computes first)
                norm_tensor = torch.nn.utils.get_total_norm([p.grad for p in params if p.grad is not None])
                if first:  # the head's and embedding's part of it, read with the metrics
                    head_squares = head_gradient_squares(self.model)
            values, norm = read_pass(step, [output.terms for output in outputs], norm_tensor,  # host read
                                     partial(self._non_finite_report, batch, outputs, targets))
            if first:
                grad_norm, losses = norm, logged_totals(
                    values, plan.shares, plan.batch_tokens,
                    kl_term=targets.ref_logprobs is not None, value_term=self.value_head is not None)
                policy_logprobs = torch.cat([output.logprobs for output in outputs]).to(batch.completion_mask.dtype)
                entropy_sums = torch.stack([output.entropy_sums for output in outputs]).sum(dim=0)  # [6]
            if capture is not None:
                with timer.phase("probes"):  # pre-update batch gradients and Grams; grad_sum
                    if first:
                        layer_grads, rollout_grams = capture.before_update(
                            batch, targets.advantages, plan.weights, plan.fused)
                    if apply:
                        capture.after_backward()
            if not apply:  # grpo probe: no optimizer step, no gradient sums
                break
            with timer.phase("optimizer"):  # clipping (by the norm read above) and the optimizer step
                max_norm = self.cfg.optim.max_grad_norm
                max_norm = max_norm if max_norm > 0 else math.inf
                torch.nn.utils.clip_grads_with_norm_(params, max_norm, norm_tensor)
                self.optimizer.step()
        # the weights the update changed (probes.changed_every), read with the metrics
        changed = capture.after_update() if capture is not None and apply else None
        return UpdateResult(grad_norm=grad_norm, losses=losses, policy_logprobs=policy_logprobs,
                            token_weight_counts=counts, layer_grads=layer_grads, rollout_grams=rollout_grams,
                            entropy_sums=entropy_sums, head_squares=head_squares, step_changed=changed)

    def _plan_update(self, step: int, batch: RolloutBatch, targets: Targets,
                     capture: ProbeCapture | None) -> UpdatePlan:
        """What every pass shares: micro-batches, token counts (one host read), loss weights, and
        whether the probes take their per-rollout factors from this update's forward and backward."""
        algorithm = self.cfg.algorithm
        mask = batch.completion_mask  # [N, L]
        micro = self.micro_batches(batch.num_rollouts)
        # one read: the batch's tokens, each micro-batch's, the completion positions and, for
        # the bucketed completion forward, each row's completion width, for train.backward_live_rows
        # each row's liveness. Probe step: the per-rollout factors from this forward and backward
        # where exact (`fused`); each row then needs its own prompt forward (a shared one sums the
        # group's prompt gradients)
        counts = [torch.stack([mask.sum()] + [mask[rows].sum() for rows in micro] + [(mask > 0).sum().float()])]
        if self.buckets > 1:
            counts.append(batch.completion_widths().to(counts[0]))
        # rows whose loss has no gradient (every token's advantage 0, no KL or value term) run
        # their forward without autograd: the same gradient, less backward. A probe step then
        # fuses over the live rows: their own prompt forwards replace the separate pass over
        # the same rows (each live row computed once instead of twice)
        prune = self.backward_live_rows and self.reference_model is None and self.value_head is None
        fused = (
            capture is not None and capture.training_pass and self.fused_probe_pass(targets.single_pass)
            and (capture.unshare_prompts or not self.shared_prompt_forward or prune)
        )
        if prune:
            counts.append(((targets.advantages * targets.tis != 0) & (mask > 0)).any(dim=1).to(counts[0]))
        read = torch.cat(counts).tolist()
        token_counts, rest = read[: len(micro) + 2], read[len(micro) + 2:]
        widths = [int(width) for width in rest[: batch.num_rollouts]] if self.buckets > 1 else None
        live = [flag > 0 for flag in rest[-batch.num_rollouts:]] if prune else None
        batch_tokens = float(token_counts[0])
        constant = algorithm.loss_constant or self.settings.max_new_tokens
        return UpdatePlan(
            micro=micro,
            shares=[count / max(batch_tokens, 1.0) for count in token_counts[1:-1]],
            batch_tokens=batch_tokens,
            completion_positions=int(token_counts[-1]),
            constant=constant,
            weights=aggregation_weights(mask, algorithm.loss_agg, constant, batch_tokens=batch_tokens,
                                        batch_sequences=batch.num_rollouts),
            fused=fused,
            shared_prompt_forward=self.shared_prompt_forward and not fused,
            prompt_keys=self.prompt_keys(batch),
            widths=widths,
            live=live,
            nan_loss=self.fault.nan_loss(step),
        )

    def _micro_batch(self, batch: RolloutBatch, rows: slice, share: float, targets: Targets,
                     plan: UpdatePlan, hooks: ProbeCapture | None = None) -> MicroBatchOutput:
        """One micro-batch's forward, loss terms and backward (no host read). `hooks`: the probe
        capture around the forward and backward of the rows with a gradient."""
        with ExitStack() as stack:
            def hook(hooked: list[int]) -> None:
                if hooks is not None:
                    stack.enter_context(hooks.micro_batch(hooked))
            return self._micro_batch_terms(batch, rows, share, targets, plan, hook)

    def _micro_batch_terms(self, batch, rows, share, targets, plan, hook) -> MicroBatchOutput:
        """`_micro_batch`'s work; `hook(batch_rows)` opens the probe capture (if any) just before
        the forward whose backward gives gradients, and `_micro_batch` closes it after backward."""
        algorithm, timer = self.cfg.algorithm, self.timer
        part = select_rows(batch, rows)
        part_mask = part.completion_mask  # [n, L]
        zero = part_mask.new_zeros(())
        with timer.phase("forward"):  # the policy's forward and the loss terms
            logprobs, entropy, hidden = self._policy_forward(part, plan, rows, hook)  # [n, L] each
            old = logprobs.detach() if targets.old_logprobs is None else targets.old_logprobs[rows]
            advantages = targets.advantages[rows] * targets.tis[rows]  # [n, L]
            loss_terms = dict(
                ref_logprobs=None if targets.ref_logprobs is None else targets.ref_logprobs[rows],
                kl_coef=algorithm.kl_coef, kl_weights=plan.weights[rows],
                epsilon=algorithm.epsilon, epsilon_high=algorithm.epsilon_high,
                agg=algorithm.loss_agg, constant=plan.constant,
                importance_sampling_level=algorithm.importance_sampling_level,
                batch_tokens=plan.batch_tokens, batch_sequences=batch.num_rollouts,
            )
            loss, pg_loss, kl_tokens, stats = actor_loss(logprobs, old, advantages, part_mask, **loss_terms)
            kl_sum, v_loss = zero, zero
            if kl_tokens is not None:
                kl_sum = (kl_tokens * part_mask).sum()
            # claim 1's empirical reading, every pass (later passes are off policy): d loss / d log pi(y_t)
            token_weights = token_loss_weights(logprobs, old, advantages, part_mask, **loss_terms)
            token_weight_counts = uniform_weight_rollouts(token_weights, advantages, part_mask)  # [3]
            if self.value_head is not None:
                v_loss = value_loss(self.value_head(hidden), targets.returns[rows], part_mask)
                loss = loss + algorithm.value_coef * v_loss * share
            if plan.nan_loss and rows == plan.micro[-1]:  # a failure on purpose (fault.py)
                loss = loss * math.nan
        with timer.phase("backward"):
            if loss.requires_grad:  # else every row of the micro-batch is idle (backward_live_rows)
                loss.backward()
        terms = torch.stack([
            loss.detach(), pg_loss.detach(), stats["clip_frac"],
            (entropy.detach() * part_mask).sum(), kl_sum.detach(), v_loss.detach(),
        ]).double()  # exact: .item() would give the same doubles
        # EAPO's split of the entropy by the advantage's sign (before TIS, which keeps it)
        entropy_sums = entropy_sign_sums(entropy, targets.advantages[rows], part_mask)  # [6]
        return MicroBatchOutput(terms=terms, logprobs=logprobs.detach(), token_weight_counts=token_weight_counts,
                                entropy_sums=entropy_sums)

    def _policy_forward(self, part: RolloutBatch, plan: UpdatePlan, rows: slice, hook):
        """`forward_policy` over a micro-batch; with `plan.live`, its idle rows (no loss
        gradient) under no_grad first, then its live rows with autograd, outputs in row order.
        `hook(batch_rows)` is called just before each forward whose backward gives gradients.
        Where the live rows take the plain forward (a fused probe step, the value head, or
        `train.shared_prompt_forward=false`) and `train.completion_buckets` > 1, they run in up to
        that many forwards over rows of similar width, each stopping at its widest row's last
        column, under one backward (a probe hooks each bucket's rows in turn)."""
        def forward(subset: RolloutBatch, keep: list[int] | None, shared: bool = plan.shared_prompt_forward):
            def pick(values: list | None) -> list | None:  # the subset's entries of a per-row list
                if values is None:
                    return None
                part_values = values[rows]
                return part_values if keep is None else [part_values[row] for row in keep]

            keys, widths = pick(plan.prompt_keys), pick(plan.widths)
            with self.forward_autocast():
                return forward_policy(
                    self.model, subset, want_hidden=self.value_head is not None,
                    shared_prompt_forward=shared, chunk_mb=self.chunk_mb,
                    prompt_keys=keys, buckets=self.buckets, widths=widths,
                )

        live = None if plan.live is None else plan.live[rows]
        every = list(range(rows.start, rows.stop))  # the micro-batch's batch rows
        if live is not None and not any(live):  # no gradient, nothing hooked; the prompts may be shared
            with torch.no_grad():
                return forward(part, None, self.shared_prompt_forward)
        flags = live if live is not None else [True] * len(every)
        active = [row for row, flag in enumerate(flags) if flag]
        idle = [row for row, flag in enumerate(flags) if not flag]
        buckets = [active]
        plain = not plan.shared_prompt_forward or self.value_head is not None
        if self.buckets > 1 and plain and plan.widths is not None:
            widths = plan.widths[rows]  # the plain forward's cost: prompt and completion columns
            buckets = [[active[i] for i in bucket] for bucket in length_buckets(
                [part.prompt_length + widths[row] for row in active], self.buckets)]
        if not idle and len(buckets) == 1:
            hook(every)
            return forward(part, None)
        groups, outputs = [], []
        if idle:
            with torch.no_grad():  # before the hooks: they see only the rows with a gradient
                outputs.append(forward(select_rows(part, idle), idle, self.shared_prompt_forward))
            groups.append(idle)
        for bucket in buckets:
            hook([every[row] for row in bucket])
            outputs.append(forward(select_rows(part, bucket), bucket))
            groups.append(bucket)
        hidden = None if any(out[2] is None for out in outputs) else in_row_order([out[2] for out in outputs], groups)
        return (in_row_order([out[0] for out in outputs], groups),
                in_row_order([out[1] for out in outputs], groups), hidden)

    def _non_finite_report(self, batch: RolloutBatch, outputs: list[MicroBatchOutput],
                           targets: Targets, norm_failed: bool) -> str:
        """The tail of the message that stops a step on a non-finite loss or norm: the CUDA-graphs
        hint, then where it came from (train/non_finite.py): the gradients by parameter, then the
        batch's inputs. The failure path only: its host reads stop nothing."""
        return f"{self._graphs_hint()}. {self._where_non_finite(batch, outputs, targets, norm_failed)}"

    def _where_non_finite(self, batch: RolloutBatch, outputs: list[MicroBatchOutput],
                          targets: Targets, norm_failed: bool) -> str:
        try:
            named = list(self.model.named_parameters())
            if self.value_head is not None:
                named += [(f"value_head.{name}", p) for name, p in self.value_head.named_parameters()]
            logprobs = torch.cat([output.logprobs for output in outputs])  # [N, L]
            embeddings = self.model.get_input_embeddings()
            vocab = getattr(embeddings, "num_embeddings", None)
            return (f"{gradient_report(named, norm_failed)}; "
                    f"{batch_report(batch, logprobs, targets.advantages, vocab)}")
        except Exception as error:  # the diagnosis must never hide the failure it explains
            return f"(where the NaN or inf is could not be read: {type(error).__name__}: {error})"

    def _graphs_hint(self) -> str:
        """What a non-finite loss or norm says when this run decodes in CUDA graphs: full runs
        with them met a NaN gradient norm at step 0 on an H200, cause not found yet."""
        if not getattr(self.backend, "cuda_graphs", False):  # hf / vllm backends have no graphs
            return ""
        return ("; this run decodes in CUDA graphs, and full runs with them met NaN gradients on "
                "an H200 (docs/gpu_report_2026-11-28b_H200.md): try rollout.cuda_graphs=false")

    def micro_batches(self, num_rows: int) -> list[slice]:
        """Contiguous row ranges: indexing with them is a view (no index tensor, no host read)."""
        size = max(1, self.cfg.train.micro_batch_size)
        return [slice(start, min(start + size, num_rows)) for start in range(0, num_rows, size)]

    def prompt_keys(self, batch: RolloutBatch) -> list[tuple[int, ...]] | None:
        """Each row's prompt tokens [N] (rows of a group answer its problem), so the shared
        prompt forward finds the distinct prompts without reading the batch back (None when the
        batch does not say which problems it holds)."""
        if len(batch.problem_indices) != batch.num_groups:
            return None
        return [tuple(self.prompt_ids[batch.problem_indices[row // batch.group_size]])
                for row in range(batch.num_rollouts)]

    def fused_probe_pass(self, single_pass: bool) -> bool:
        """Whether a probe may take its per-rollout factors from this update's forward and
        backward: the loss gradient is exactly sum_i -sum_t w_it A_it grad log pi(y_it) (one pass at
        ratio 1, no value head, no TIS, no KL), in the model's precision (no autocast). Activation
        checkpointing is no obstacle: grpo-cli's is non-reentrant (models/loading.py), so the
        backward runs the hooked forward's own graph and only recomputes its saved tensors.
        grpo_cli/probes/fused.py."""
        return (
            single_pass and self.reference_model is None and self.autocast_kind == "none"
        )

    def row_sum_rtol(self, single_pass: bool) -> float | None:
        """How closely the first pass's gradient on the probed parameters equals the sum of the
        probes' per-rollout rows -sum_t w_it A_it grad log pi(y_it) (grad_norm_mismatch): where
        the loss is the PPO-clip surrogate at ratio 1 with nothing added (fused_probe_pass, less
        the conditions that only change how it is computed), to float32 round-off, or to bf16's
        when the model or its forward is bf16; None where it is not that sum."""
        if not single_pass or self.reference_model is not None:
            return None
        low = self.autocast_kind != "none" or next(self.model.parameters()).dtype not in (torch.float32, torch.float64)
        return 5e-2 if low else 1e-4

    # ---- 4. metrics ------------------------------------------------------------------------------
    def _metrics(self, step: int, batch: RolloutBatch, scored: ScoredBatch, dropped: int,
                 targets: Targets, plan: UpdatePlan, result: UpdateResult) -> dict:
        """The metrics.csv row (grpo_cli/probes/step_metrics.py): the batch's readings in one host
        read, then each problem's success so far."""
        readings = read_batch(batch, scored, targets.advantages, result.token_weight_counts,
                              logprob_gap=self._logprob_gap(batch, plan, result),
                              entropy_sums=result.entropy_sums, head_squares=result.head_squares,
                              step_changed=result.step_changed)
        prompt_rates = self.problem_success.estimate(batch.problem_indices, readings.accuracy)  # [B]
        size = batch.group_size
        self.problem_success.update(
            batch.problem_indices,
            [list(readings.correct[start : start + size]) for start in range(0, len(readings.correct), size)],
        )
        return metrics_row(step_metrics(
            step, readings, result.losses, result.grad_norm, groups_dropped=dropped,
            expected_zero_variance_frac=mean_expected_zero_variance_fraction(prompt_rates, size),
        ))

    @staticmethod
    def _logprob_gap(batch: RolloutBatch, plan: UpdatePlan, result: UpdateResult) -> torch.Tensor:  # [T]
        """|sampler - policy| log-prob on each completion token, in row-major order (what
        boolean-mask indexing gives, without sizing the result by reading the mask); [0.0] when
        the batch has no completion token."""
        if not plan.completion_positions:
            return batch.completion_mask.new_zeros(1)
        positions = torch.nonzero_static((batch.completion_mask > 0).flatten(),
                                         size=plan.completion_positions)  # [T, 1]
        return (batch.sampler_logprobs - result.policy_logprobs).abs().flatten()[positions[:, 0]]

