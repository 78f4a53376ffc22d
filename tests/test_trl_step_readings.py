"""The TRL callback's per-step readings of issue 64, each against an independent computation on
TRL's own batch, gradients and weights (as tests/test_trl_spectra.py checks the spectra): the
head's and embedding's share of TRL's ||g||^2, the weights TRL's optimizer step changed, the
entropy split by the advantage's sign from TRL's own per-token entropies, the distinct correct
completions of TRL's groups. `grpo run` computes each with the same functions
(probes/step_metrics.py, head_share.py, step_change.py); tests/test_step_readings.py checks those
against closed forms."""

from __future__ import annotations

import math
import re

import pandas as pd
import pytest
import torch

trl = pytest.importorskip("trl")

from test_trl_spectra import build_trainer, capture_batches, policy_source  # noqa: E402, F401

from grpo_cli.config.schema import ProbesConfig  # noqa: E402
from grpo_cli.integrations.trl_spectra import SpectraCallback  # noqa: E402

# float64 model: sums of squares and entropies in another order agree to a few 1e-16 x terms
F64_SUMS = 1e-12


class Reference(trl.trainer.grpo_trainer.TrainerCallback):
    """Added after the callback: before TRL's optimizer step, its .grad (max_grad_norm=1e9: the
    clip multiplies by exactly 1), the weights and TRL's own per-token entropies of the step's
    batch at those weights; after it, the weights again."""

    def __init__(self, trainer, batches):
        self.trainer, self.batches, self.steps = trainer, batches, []

    def on_pre_optimizer_step(self, args, state, control, **kwargs):
        model, output = self.trainer.model, self.batches[-1]
        with torch.no_grad():
            _, entropies, _ = self.trainer._get_per_token_logps_and_entropies(
                model, torch.cat([output["prompt_ids"], output["completion_ids"]], dim=1),
                torch.cat([output["prompt_mask"], output["completion_mask"]], dim=1),
                output["completion_ids"].size(1), compute_entropy=True)
        self.steps.append({
            "grads": {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None},
            "before": {n: p.detach().clone() for n, p in model.named_parameters()},
            "entropies": entropies,
        })

    def on_optimizer_step(self, args, state, control, **kwargs):
        self.steps[-1]["after"] = {n: p.detach().clone() for n, p in self.trainer.model.named_parameters()}


def capture_rewards(trainer) -> list[torch.Tensor]:
    """Each step's rewards as TRL weighs them (around the callback's own wrapper)."""
    rewards, inner = [], trainer._calculate_rewards

    def wrapped(*args, **kwargs):
        per_func = inner(*args, **kwargs)  # [N, F]
        rewards.append((per_func * trainer.reward_weights.to(per_func.device)).nansum(dim=1))
        return per_func

    trainer._calculate_rewards = wrapped
    return rewards


def entropy_split(entropies, output) -> list[float]:
    mask = output["completion_mask"].double()
    advantages = output["advantages"].unsqueeze(1).expand_as(mask)
    out = []
    for sign in (advantages > 0, advantages < 0, advantages == 0):
        count = float((mask * sign).sum())
        out.append(float((entropies * mask * sign).sum()) / count if count else math.nan)
    return out


def distinct_correct(output, correct, group_size: int) -> float:
    ids, mask = output["completion_ids"].tolist(), output["completion_mask"].tolist()
    counts = []
    for start in range(0, len(ids), group_size):
        seen = {tuple((t if m else -1) for t, m in zip(ids[row], mask[row], strict=True))
                for row in range(start, start + group_size) if correct[row]}
        if any(correct[start:start + group_size]):
            counts.append(len(seen))
    return sum(counts) / len(counts) if counts else math.nan


def same(recorded: float, expected: float) -> bool:
    if math.isnan(expected):
        return math.isnan(recorded)
    return abs(recorded - expected) <= F64_SUMS * max(abs(expected), 1e-300)


def test_trl_step_readings_equal_an_independent_computation(policy_source, tmp_path):  # noqa: F811
    trainer = build_trainer(policy_source, tmp_path, steps=2, lr=1e-3, loss_type="grpo", max_grad_norm=1e9)
    run_dir = tmp_path / "run"
    SpectraCallback(run_dir, every=1, matrices=["rollout_batch"]).attach(trainer)
    batches, rewards = capture_batches(trainer), capture_rewards(trainer)
    reference = Reference(trainer, batches)
    trainer.add_callback(reference)
    trainer.train()

    metrics = pd.read_csv(run_dir / "metrics.csv")
    policy = trainer.model
    head = {n for n, p in policy.named_parameters() if p is policy.get_output_embeddings().weight}
    embedding = {n for n, p in policy.named_parameters() if p is policy.get_input_embeddings().weight}
    tied = head == embedding
    layers = re.compile(ProbesConfig().layer_regex)
    for step, seen in enumerate(reference.steps):
        row = metrics.iloc[step]
        grads = seen["grads"]
        total = sum(float(g.square().sum()) for g in grads.values())
        head_sq = sum(float(grads[n].square().sum()) for n in head)
        embedding_sq = sum(float(grads[n].square().sum()) for n in embedding - head)
        assert same(row.grad_share_head_embedding, (head_sq + embedding_sq) / total), step
        if tied:
            assert math.isnan(row.grad_share_head) and math.isnan(row.grad_share_embedding)
        else:
            assert same(row.grad_share_head, head_sq / total) and same(row.grad_share_embedding, embedding_sq / total)
        # the weights TRL's optimizer step changed, over probes.layer_regex's 2-D weights
        names = [n for n, p in policy.named_parameters() if p.ndim == 2 and layers.search(n)]
        size = sum(seen["before"][n].numel() for n in names)
        held = sum(int((seen["after"][n] != seen["before"][n]).sum()) for n in names)
        bf16 = sum(int((seen["after"][n].bfloat16() != seen["before"][n].bfloat16()).sum()) for n in names)
        assert 0 < held and row.step_changed_frac == held / size and row.step_changed_frac_bf16 == bf16 / size
        assert math.isnan(row.step_changed_frac_master)  # TRL keeps no fp32 masters
        split = entropy_split(seen["entropies"], batches[step])
        for column, expected in zip(("entropy_adv_positive", "entropy_adv_negative", "entropy_adv_zero"),
                                    split, strict=True):
            assert same(row[column], expected), (step, column)
        correct = (rewards[step] > 0.5).tolist()  # the callback's success_threshold
        assert same(row.distinct_correct, distinct_correct(batches[step], correct, 4)), step
    logged = [entry for entry in trainer.state.log_history if "grad_share_head_embedding" in entry]
    assert logged and "step_changed_frac" in logged[0]  # TRL's loggers have them too
