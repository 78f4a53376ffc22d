"""Estimators inside the training step: dynamic sampling, per-token credit, the credit check."""

from __future__ import annotations

import json

import pandas as pd
import pytest
import torch
from cli_helpers import grpo_run, run_dir
from conftest import tiny_llama

from grpo_cli.algorithm.scored import ScoredBatch, group_outcome_shares, zero_variance_groups
from grpo_cli.config.compose import compose_config
from grpo_cli.models.char_tokenizer import build_char_tokenizer
from grpo_cli.rollout.batch import RolloutBatch, left_pad
from grpo_cli.rollout.hf_backend import completion_mask_through_eos
from grpo_cli.tasks.problem import Problem, Task
from grpo_cli.tasks.step_rewards import StepCheck
from grpo_cli.train.credit import (
    step_tensors,
    token_advantages,
    token_char_ends,
)
from grpo_cli.train.trainer import GRPOTrainer


class ScriptedBackend:
    """Returns fixed completions: problem q<i> gets `script(i)` (a list of R answers)."""

    def __init__(self, tokenizer, script):
        self.tokenizer, self.script, self.calls = tokenizer, script, 0

    def sync_weights(self, model):
        pass

    def generate(self, prompts, settings, generator_seed):
        self.calls += 1
        tok = self.tokenizer
        texts, prompt_rows = [], []
        for prompt in prompts:
            index = int(tok.decode(prompt).strip()[1:])
            for answer in self.script(index):
                texts.append(f"#### {answer}")
                prompt_rows.append(prompt)
        prompt_ids, prompt_mask = left_pad(prompt_rows, tok.pad_token_id)
        completions = [tok(t, add_special_tokens=False)["input_ids"] + [tok.eos_token_id] for t in texts]
        width = max(map(len, completions))
        completion_ids = torch.full((len(texts), width), tok.pad_token_id)
        for row, ids in enumerate(completions):
            completion_ids[row, : len(ids)] = torch.tensor(ids)
        mask = completion_mask_through_eos(completion_ids, tok.eos_token_id)
        zeros = torch.zeros(prompt_ids.shape)
        return RolloutBatch(
            input_ids=torch.cat([prompt_ids, completion_ids], 1),
            attention_mask=torch.cat([prompt_mask, mask.long()], 1),
            completion_mask=torch.cat([zeros, mask], 1),
            sampler_logprobs=torch.zeros(len(texts), prompt_ids.shape[1] + width),
            group_size=settings.group_size,
            prompt_length=prompt_ids.shape[1],
            completions=texts,
        )


def scripted_trainer(script, *overrides):
    cfg = compose_config(
        ["rollout.group_size=4", "rollout.prompts_per_step=4", "algorithm.dynamic_sampling=true",
         "algorithm.dynamic_sampling_max_draws=3", *overrides]
    )
    tokenizer = build_char_tokenizer()
    model = tiny_llama(tokenizer=tokenizer, hidden_size=16, intermediate_size=32,
                       num_hidden_layers=1, num_attention_heads=2, max_position_embeddings=64)
    problems = [Problem(question=f"q{i}", answer="1", solution="#### 1") for i in range(40)]
    task = Task(name="scripted", train=problems, eval=problems[:2], step_checker=lambda *a: [])
    backend = ScriptedBackend(tokenizer, script)
    return GRPOTrainer(cfg, model, tokenizer, task, backend, torch.device("cpu")), backend


def test_dynamic_sampling_keeps_only_informative_groups():
    trainer, backend = scripted_trainer(lambda i: [1, 0, 0, 0] if i % 3 == 0 else [0, 0, 0, 0])
    batch, scored, dropped = trainer.collect(step=0)
    assert batch.num_groups == 4
    assert not zero_variance_groups(scored.rewards, batch.group_size).any()
    assert all(index % 3 == 0 for index in batch.problem_indices)
    assert dropped > 0 and backend.calls >= 2


def test_dynamic_sampling_stops_at_its_cap():
    trainer, backend = scripted_trainer(lambda i: [0, 0, 0, 0])
    batch, scored, dropped = trainer.collect(step=0)
    assert backend.calls == 1 + 3  # the first draw plus dynamic_sampling_max_draws
    assert dropped == 4 * 4
    output = trainer.step(step=1)  # nothing informative: a step with zero gradient, no crash
    assert output.metrics["grad_norm"] == 0.0


def test_group_outcome_shares_on_a_constructed_batch():
    correct = torch.tensor([0, 0, 0, 1, 1, 1, 1, 0, 0, 0, 0, 0, 1, 1, 1, 1, 0, 1, 0, 1], dtype=torch.float)
    # groups of 4: [0001] mixed, [1110] mixed, [0000] wrong, [1111] right, [0101] mixed
    shares = group_outcome_shares(correct, 4)
    torch.testing.assert_close(shares, torch.tensor([1 / 5, 1 / 5, 3 / 5]))
    torch.testing.assert_close(group_outcome_shares(correct, 1), torch.tensor([0.5, 0.5, 0.0]))  # 10 of 20
    assert float(group_outcome_shares(correct, 20)[2]) == 1.0


def test_step_logs_group_outcome_shares():
    """Problems q0..q39 answered by script: answer 1 is right. Groups of 4 from
    q % 3 == 0 all right, q % 3 == 1 all wrong, else mixed; the logged shares count them."""
    def script(index):
        return {0: [1, 1, 1, 1], 1: [2, 2, 2, 2], 2: [1, 2, 2, 1]}[index % 3]

    trainer, _ = scripted_trainer(script, "algorithm.dynamic_sampling=false")
    output = trainer.step(step=0)
    kinds = [index % 3 for index in output.batch.problem_indices]
    metrics = output.metrics
    assert metrics["groups_all_right"] == kinds.count(0) / 4
    assert metrics["groups_all_wrong"] == kinds.count(1) / 4
    assert metrics["groups_mixed"] == kinds.count(2) / 4
    assert metrics["groups_all_wrong"] + metrics["groups_all_right"] == metrics["zero_variance_frac"]


def test_process_advantages_follow_step_rewards_within_a_rollout():
    tokenizer = build_char_tokenizer()
    texts = ["<<2+3=5>>5\n#### 5", "<<2+3=6>>6\n#### 6"]  # a right and a wrong step, group of 2
    ids = [tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts]
    input_ids = torch.tensor(ids)
    mask = torch.ones_like(input_ids, dtype=torch.float)
    batch = RolloutBatch(input_ids=input_ids, attention_mask=torch.ones_like(input_ids),
                         completion_mask=mask, sampler_logprobs=torch.zeros_like(mask),
                         group_size=2, prompt_length=0, completions=texts)
    from grpo_cli.tasks.problem import Step
    from grpo_cli.tasks.step_rewards import reference_step_spans

    checks = [reference_step_spans(t, (Step("2+3", 5.0),)) for t in texts]
    final = torch.tensor([1.0, 0.0])
    step_rewards, step_index = step_tensors(batch, checks, final, 0.5, tokenizer)
    cfg = compose_config(["algorithm=process"]).algorithm
    advantages, _ = token_advantages(cfg, batch, ScoredBatch(final, final, step_rewards, step_index))
    step_end = len("<<2+3=5>>5")
    right, wrong = advantages[0], advantages[1]
    # step tokens carry the step's centred reward plus the outcome's; later tokens only the outcome's
    assert torch.allclose(right[:step_end], torch.tensor(0.25 + 0.5))
    assert torch.allclose(right[step_end:], torch.tensor(0.5))
    assert torch.allclose(wrong[:step_end], torch.tensor(-0.25 - 0.5))
    assert torch.allclose(wrong[step_end:], torch.tensor(-0.5))


def step_tensors_loop(batch, step_checks, final_rewards, step_weight, tokenizer):
    """The per-token loop `step_tensors` replaced (two device reads and ~3 writes per token):
    the reference its vectorised form must equal."""
    step_rewards = torch.zeros_like(batch.completion_mask)  # [N, L]
    step_index = torch.full_like(batch.input_ids, -1)  # [N, L]
    for row, checks in enumerate(step_checks):
        columns = batch.completion_mask[row].nonzero().flatten().tolist()
        if not columns:
            continue
        ids = batch.input_ids[row, columns].tolist()
        ends = token_char_ends(tokenizer, ids)
        segment = 0
        check_iter = iter(sorted(checks, key=lambda check: check.end_char))
        current = next(check_iter, None)
        for column, end in zip(columns, ends, strict=True):
            step_index[row, column] = segment
            if current is not None and end >= current.end_char:
                step_rewards[row, column] += step_weight if current.correct else 0.0
                segment += 1
                current = next(check_iter, None)
        step_rewards[row, columns[-1]] += final_rewards[row]
    return step_rewards, step_index


def test_step_tensors_equal_the_per_token_loop():
    """Rows with gaps in the mask, an empty row, checks out of order, two checks ending on one
    token, a check past the last token, right and wrong steps: the same tensors, bit for bit."""
    tokenizer = build_char_tokenizer()
    generator = torch.Generator().manual_seed(0)
    texts = ["<<2+3=5>>5 then <<5*2=10>>10\n#### 10", "ab<<1+1=3>>3", "", "x" * 12, "#### 7"]
    width = 3 + max(map(len, texts)) + 2  # a 3-column prompt and some right padding
    input_ids = torch.randint(0, len(tokenizer), (len(texts), width), generator=generator)
    mask = torch.zeros(len(texts), width)
    for row, text in enumerate(texts):
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        input_ids[row, 3 : 3 + len(ids)] = torch.tensor(ids, dtype=torch.long)
        mask[row, 3 : 3 + len(ids)] = 1.0
    mask[0, 8] = 0.0  # a gap inside a completion
    batch = RolloutBatch(input_ids=input_ids, attention_mask=torch.ones_like(input_ids),
                         completion_mask=mask, sampler_logprobs=torch.zeros_like(mask),
                         group_size=1, prompt_length=3, completions=texts)
    checks = [
        [StepCheck(17, 27, False, 10.0), StepCheck(0, 10, True, 5.0)],  # out of order
        [StepCheck(2, 12, False, 3.0), StepCheck(2, 12, True, 2.0), StepCheck(0, 99, True, 1.0)],
        [StepCheck(0, 1, True, 1.0)],  # an empty completion: nothing placed
        [],
        [StepCheck(0, 3, True, 7.0)],
    ]
    final = torch.rand(len(texts), generator=generator) - 0.5
    for weight in (0.5, 0.1, 0.0):
        expected = step_tensors_loop(batch, checks, final, weight, tokenizer)
        actual = step_tensors(batch, checks, final, weight, tokenizer)
        for want, got in zip(expected, actual, strict=True):
            assert got.dtype == want.dtype
            assert torch.equal(got, want)
        if weight == 0.5:  # the case is not trivial: steps and outcomes were placed
            assert (expected[0] == 0.5).sum() == 2 and (expected[0] != 0).sum() >= 6
            assert expected[1].max() >= 2  # some row has three segments


@pytest.mark.parametrize(
    ("estimator", "uniform"),
    [("grpo", True), ("dr_grpo", True), ("rloo", True), ("ppo", False), ("process", False),
     ("otb", False)],
)
def test_credit_check_separates_outcome_from_token_level_estimators(
    tmp_path, cache_dir, estimator, uniform
):
    result = grpo_run(tmp_path, cache_dir, f"algorithm={estimator}", "train.steps=3")
    assert result.exit_code == 0, result.output
    out = run_dir(tmp_path, f"R4-{estimator}-s0-train.steps=3")
    assert json.loads((out / "run.json").read_text())["status"] == "completed"
    metrics = pd.read_csv(out / "metrics.csv")
    informative = metrics[metrics["zero_variance_frac"] < 1.0]
    assert len(informative) > 0
    if uniform:
        assert (metrics["credit_uniform_frac"] == 1.0).all()
        # one pass, no KL: the loss gradient's token weights -w A are uniform too (claim 1)
        assert (informative["token_weight_uniform_frac"] == 1.0).all()
    else:
        assert (informative["credit_uniform_frac"] < 1.0).all()
        assert (informative["token_weight_uniform_frac"] < 1.0).all()
    assert metrics.loc[metrics["zero_variance_frac"] == 1.0, "token_weight_uniform_frac"].isna().all()


@pytest.mark.parametrize("setting", ["algorithm.num_iterations=2", "algorithm.kl_coef=0.1"])
def test_token_weights_stop_being_uniform_off_policy_or_with_kl(tmp_path, cache_dir, setting):
    """Claim 1's empirical reading can fail in the real loop: a second pass over the batch
    (token ratios != 1) or a KL term weights a rollout's tokens unequally, although grpo's
    advantages stay uniform. At step 0 the policy is the reference, so the KL term's gradient
    1 - exp(ref_logp - logp) is 0 there and the weights are still uniform."""
    result = grpo_run(tmp_path, cache_dir, "train.steps=3", setting)
    assert result.exit_code == 0, result.output
    metrics = pd.read_csv(next(tmp_path.glob("smoke/R4-grpo-s0*")) / "metrics.csv")
    informative = metrics[metrics["zero_variance_frac"] < 1.0].set_index("step")
    assert (metrics["credit_uniform_frac"] == 1.0).all()
    later = informative.loc[informative.index > 0, "token_weight_uniform_frac"]
    assert len(later) > 0 and (later < 1.0).all()
    assert (informative.loc[informative.index > 0, "token_weight_spread"] > 0).all()
    if "kl_coef" in setting and 0 in informative.index:
        assert informative.loc[0, "token_weight_uniform_frac"] == 1.0
