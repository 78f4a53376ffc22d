"""Per-rollout Grams from the training step's own forward and backward (grpo_cli/probes/fused.py)
against the separate pass: every matrix to 1e-6 on a float64 model, with micro-batches and the
shared prompt forward on and off, and the Grams taken at the weights the loss was computed at."""

from __future__ import annotations

import copy
import itertools

import pytest
import torch
from step_parity import GradForwards, setup_for

from grpo_cli.probes.capture import step_capture
from grpo_cli.probes.fused import score_blocks_from_advantage, score_groups_to_recompute
from grpo_cli.probes.gram import group_blocks, per_rollout_grams
from grpo_cli.train.policy_forward import checkpointing

MATRICES = "probes.matrices=[rollout_group,rollout_batch,score_group,group_batch]"
# 3 groups of 4, in row order: informative; zero-variance; two rows at the group mean (a_i = 0)
REWARDS = [1.0, 0.0, 0.0, 1.0] + [1.0] * 4 + [0.0, 0.5, 1.0, 0.5]
READ_GROUPS = [0, 2]  # groups with a non-zero advantage: the only score blocks any matrix reads


def probe_step(tmp_path, fused: bool | str, *overrides, rewards=REWARDS, update=True, forwards=None,
               prepare=None, dtype=torch.float64):
    """One probe step on a tiny model in `dtype` (float64: the Grams to 1e-6); `forwards` (a list)
    gets its count of forwards with autograd; `prepare(setup)` runs before the step."""
    mode = {True: "always", False: "never"}.get(fused, fused)
    setup = setup_for(tmp_path, "probes.every=1", MATRICES, f"probes.fused_gram={mode}", *overrides)
    setup.model.to(dtype)  # in place: the optimizer and the probes hold the same parameters
    if prepare is not None:
        prepare(setup)
    cycle = itertools.cycle(rewards)
    setup.task.reward = lambda text, problem: next(cycle)  # scored in row order
    before = copy.deepcopy(setup.model)
    capture = step_capture(setup.probes, 0, setup.model)
    with GradForwards(setup.model) as counter:
        output = setup.trainer.step(0, capture=capture, update=update)
    if forwards is not None:
        forwards.append(counter.count)
    return setup, capture, output, before


def assert_gram_close(candidate: torch.Tensor, reference: torch.Tensor, what: str):
    scale = float(reference.abs().max())
    assert scale > 0, what
    assert float((candidate - reference).abs().max()) <= 1e-6 * scale, what


@pytest.mark.parametrize("shared", [True, False])
@pytest.mark.parametrize("micro_batch_size", [12, 5])
def test_fused_grams_equal_the_separate_pass(tmp_path, shared, micro_batch_size):
    overrides = [f"train.shared_prompt_forward={shared}", f"train.micro_batch_size={micro_batch_size}"]
    fused_setup, fused_capture, fused, _ = probe_step(tmp_path, True, *overrides)
    separate_setup, separate_capture, separate, _ = probe_step(tmp_path, False, *overrides)
    assert fused_capture.source == "training_pass" and separate_capture.source == "separate_pass"
    assert torch.equal(fused.batch.input_ids, separate.batch.input_ids)
    assert fused.scored.rewards.tolist() == REWARDS
    assert_gram_close(fused.rollout_grams["advantage"], separate.rollout_grams["advantage"], "K_adv")
    assert_gram_close(fused.rollout_grams["score_blocks"][READ_GROUPS],
                      separate.rollout_grams["score_blocks"][READ_GROUPS], "K_score blocks")
    rows = {name: setup.probes.record(0, output, setup.model)
            for name, setup, output in (("fused", fused_setup, fused), ("separate", separate_setup, separate))}
    keys = [(r["matrix"], r["group"], r["k"]) for r in rows["separate"].spectra]
    assert [(r["matrix"], r["group"], r["k"]) for r in rows["fused"].spectra] == keys
    for matrix in ("rollout_group", "rollout_batch", "score_group", "group_batch"):
        sigma = {name: torch.tensor([r["sigma"] for r in rows[name].spectra if r["matrix"] == matrix])
                 for name in rows}
        assert sigma["separate"].numel() > 0, matrix
        assert_gram_close(sigma["fused"], sigma["separate"], matrix)


@pytest.mark.parametrize("overrides", [
    ["probes.gram_method=sketch", "probes.sketch_dim=64", "train.micro_batch_size=5"],
    ["algorithm.importance_sampling_level=sequence", "algorithm.loss_agg=seq_mean_token_mean"],
], ids=["sketch", "gspo"])
def test_fused_grams_equal_the_separate_pass_for_other_routes(tmp_path, overrides):
    _, fused_capture, fused, _ = probe_step(tmp_path, True, *overrides)
    _, _, separate, _ = probe_step(tmp_path, False, *overrides)
    assert fused_capture.source == "training_pass"
    assert_gram_close(fused.rollout_grams["advantage"], separate.rollout_grams["advantage"], "K_adv")
    assert_gram_close(fused.rollout_grams["score_blocks"][READ_GROUPS],
                      separate.rollout_grams["score_blocks"][READ_GROUPS], "K_score blocks")


CHECKPOINTED = "model.gradient_checkpointing=true"


@pytest.mark.parametrize("overrides", [
    ["train.micro_batch_size=5"],
    ["train.shared_prompt_forward=false", "train.micro_batch_size=12"],
    ["probes.gram_method=sketch", "probes.sketch_dim=64", "train.micro_batch_size=5",
     "train.logits_chunk_mb=0.0005"],  # lm_head in checkpointed chunks of a few positions
], ids=["live-rows", "plain", "sketch-chunked-logits"])
def test_fused_grams_equal_the_separate_pass_under_activation_checkpointing(tmp_path, overrides):
    """The paper preset checkpoints activations (non-reentrant, models/loading.py): the backward
    runs the hooked forward's own graph and recomputes the layers inside it (seen here: layer 0's
    q_proj runs twice with autograd per forward), and the training pass's factors still equal the
    separate pass's."""
    calls = []

    def count_layer_calls(setup):
        assert checkpointing(setup.model)
        q_proj = setup.model.model.layers[0].self_attn.q_proj
        q_proj.register_forward_hook(lambda module, args, output: calls.append(torch.is_grad_enabled()))

    forwards = []
    _, capture, fused, _ = probe_step(tmp_path, True, CHECKPOINTED, *overrides, forwards=forwards,
                                      prepare=count_layer_calls)
    _, separate_capture, separate, _ = probe_step(tmp_path, False, CHECKPOINTED, *overrides)
    assert capture.source == "training_pass" and separate_capture.source == "separate_pass"
    assert sum(calls) == 2 * forwards[0]  # every forward with autograd was recomputed in backward
    assert_gram_close(fused.rollout_grams["advantage"], separate.rollout_grams["advantage"], "K_adv")
    assert_gram_close(fused.rollout_grams["score_blocks"][READ_GROUPS],
                      separate.rollout_grams["score_blocks"][READ_GROUPS], "K_score blocks")


def test_fused_grams_in_bf16_under_checkpointing_match_the_separate_pass(tmp_path):
    """The paper preset's precision on CUDA (bf16 weights, no autocast) with checkpointing: the
    training pass's factors are taken and agree with the separate pass's to bf16 rounding
    (measured on CPU: 4e-3 of the largest entry; bound 2e-2)."""
    overrides = [CHECKPOINTED, "train.micro_batch_size=5"]
    _, capture, fused, _ = probe_step(tmp_path, True, *overrides, dtype=torch.bfloat16)
    _, _, separate, _ = probe_step(tmp_path, False, *overrides, dtype=torch.bfloat16)
    assert capture.source == "training_pass"
    candidate, reference = fused.rollout_grams["advantage"], separate.rollout_grams["advantage"]
    scale = float(reference.abs().max())
    assert scale > 0 and torch.isfinite(candidate).all()
    assert float((candidate - reference).abs().max()) <= 2e-2 * scale


def test_probe_grams_are_taken_at_the_weights_of_the_loss(tmp_path):
    """Both routes: the rows are the per-rollout loss gradients before the optimizer step."""
    for fused in (True, False):
        setup, _, output, before = probe_step(tmp_path, fused, "train.micro_batch_size=5")
        coeff = -(output.loss_weights * output.advantages).double()  # [N, L]
        reference = per_rollout_grams(
            before, output.batch.input_ids, output.batch.attention_mask, {"k": coeff},
            dict(before.named_parameters()), method="per_sample",
        )["k"].gram
        assert_gram_close(output.rollout_grams["advantage"], reference, f"fused={fused}")


@pytest.mark.parametrize("shared", [True, False])
def test_auto_fuses_only_where_training_runs_each_rows_prompt(tmp_path, shared):
    _, capture, output, _ = probe_step(tmp_path, "auto", f"train.shared_prompt_forward={shared}",
                                       "train.backward_live_rows=false")
    assert capture.source == ("separate_pass" if shared else "training_pass")
    assert output.rollout_grams["score_blocks"].shape == (3, 4, 4)


@pytest.mark.parametrize("micro_batch_size", [12, 5])
def test_live_rows_fuse_their_factors_and_equal_the_separate_pass(tmp_path, micro_batch_size):
    """train.backward_live_rows with shared prompts: `auto` fuses over the rows with a gradient
    (the zero-variance group and the two rows at their group's mean are not hooked; their rows
    and columns of K_adv are 0), and every Gram and spectrum equals the separate pass's (1e-6)."""
    overrides = ["train.shared_prompt_forward=true", "train.backward_live_rows=true",
                 f"train.micro_batch_size={micro_batch_size}"]
    fused_setup, fused_capture, fused, _ = probe_step(tmp_path, "auto", *overrides)
    separate_setup, separate_capture, separate, _ = probe_step(tmp_path, False, *overrides[:1])
    assert fused_capture.source == "training_pass" and separate_capture.source == "separate_pass"
    assert torch.equal(fused.batch.input_ids, separate.batch.input_ids)
    idle = (fused.advantages == 0).all(dim=1)
    assert idle.tolist() == [False] * 4 + [True] * 4 + [False, True, False, True]
    kernel = fused.rollout_grams["advantage"]
    assert (kernel[idle] == 0).all() and (kernel[:, idle] == 0).all()
    assert_gram_close(kernel, separate.rollout_grams["advantage"], "K_adv")
    assert_gram_close(fused.rollout_grams["score_blocks"][READ_GROUPS],
                      separate.rollout_grams["score_blocks"][READ_GROUPS], "K_score blocks")
    rows = {name: setup.probes.record(0, output, setup.model)
            for name, setup, output in (("fused", fused_setup, fused), ("separate", separate_setup, separate))}
    for matrix in ("rollout_group", "rollout_batch", "score_group", "group_batch"):
        sigma = {name: torch.tensor([r["sigma"] for r in rows[name].spectra if r["matrix"] == matrix])
                 for name in rows}
        assert sigma["separate"].numel() > 0, matrix
        assert_gram_close(sigma["fused"], sigma["separate"], matrix)


@pytest.mark.parametrize("overrides", [
    ["train.shared_prompt_forward=false"],
    ["train.shared_prompt_forward=true", "train.backward_live_rows=true"],
], ids=["plain", "live_rows"])
def test_width_buckets_fuse_their_factors_and_equal_the_separate_pass(tmp_path, overrides):
    """train.completion_buckets on a fused probe step: the hooked rows run in forwards over rows
    of similar width, each hooked in turn, under one backward; K_adv and the score blocks that
    any matrix reads equal the separate pass's (1e-6)."""
    common = ["model.warm_start.steps=50", "rollout.max_new_tokens=24", "train.completion_buckets=3",
              *overrides]
    forwards = []
    _, fused_capture, fused, _ = probe_step(tmp_path, "auto", *common, forwards=forwards)
    _, separate_capture, separate, _ = probe_step(tmp_path, False, *common)
    assert fused_capture.source == "training_pass" and separate_capture.source == "separate_pass"
    assert torch.equal(fused.batch.input_ids, separate.batch.input_ids)
    assert forwards[0] > 1  # one micro-batch, split by width (and its idle rows, without autograd)
    assert_gram_close(fused.rollout_grams["advantage"], separate.rollout_grams["advantage"], "K_adv")
    assert_gram_close(fused.rollout_grams["score_blocks"][READ_GROUPS],
                      separate.rollout_grams["score_blocks"][READ_GROUPS], "K_score blocks")


def test_live_rows_fused_probe_step_keeps_the_training_gradient(tmp_path):
    """The fused live-row probe step trains as the unprobed shared-prompt step does: the same
    batch gradient (1e-6 relative: the log-softmax runs in float32), read before the optimizer."""
    shared = "train.shared_prompt_forward=true"
    grads = {}
    for name, overrides in (("fused", [shared, "train.backward_live_rows=true"]), ("plain", [shared, "train.backward_live_rows=false"])):
        setup, capture, _, _ = probe_step(tmp_path, "auto", *overrides, update=False)
        assert capture.source == ("training_pass" if name == "fused" else "separate_pass")
        grads[name] = {key: p.grad.clone() for key, p in setup.model.named_parameters()}
    for key, grad in grads["plain"].items():
        assert grad.norm() > 0, key
        assert float((grads["fused"][key] - grad).norm()) <= 1e-6 * float(grad.norm()), key


def test_live_rows_with_no_live_row_keep_fusing(tmp_path):
    """A probe step where no row has a gradient hooks nothing: K_adv is 0, the spectra are the
    separate pass's, and the next probe step still fuses (no fallback)."""
    overrides = ["train.shared_prompt_forward=true", "train.backward_live_rows=true"]
    fused_setup, fused_capture, fused, _ = probe_step(tmp_path, "auto", *overrides, rewards=[1.0])
    separate_setup, _, separate, _ = probe_step(tmp_path, False, *overrides[:1], rewards=[1.0])
    assert (fused.advantages == 0).all()
    assert fused_capture.source == "training_pass"
    assert (fused.rollout_grams["advantage"] == 0).all()
    assert torch.equal(fused.rollout_grams["advantage"], separate.rollout_grams["advantage"])
    rows = {name: [(r["matrix"], r["group"], r["k"], r["sigma"]) for r in setup.probes.record(0, output, setup.model).spectra]
            for name, setup, output in (("fused", fused_setup, fused), ("separate", separate_setup, separate))}
    assert rows["fused"] == rows["separate"]
    assert fused_setup.probes.fuse_training_pass  # not switched to the separate pass


def test_an_unknown_fused_gram_setting_is_refused(tmp_path):
    with pytest.raises(ValueError, match="probes.fused_gram"):
        probe_step(tmp_path, "sometimes")


def test_fusion_steps_aside_when_the_loss_is_not_the_advantage_objective(tmp_path):
    """A KL term adds its own gradient: the separate pass, same matrices."""
    _, capture, output, _ = probe_step(tmp_path, True, "algorithm.kl_coef=0.1")
    assert capture.training_pass and capture.source == "separate_pass"
    assert output.rollout_grams["advantage"].shape == (12, 12)


def test_score_blocks_from_the_advantage_blocks():
    """K_adv = a a^T * K_score inside a group; groups with some zero advantages are recomputed."""
    scores = torch.randn(6, 5, dtype=torch.float64)
    k_score = scores @ scores.T  # [6, 6]
    a = torch.tensor([1.0, -2.0, 0.5, 0.0, 0.0, 0.0])  # group 0 informative, group 1 all zero
    k_adv = torch.outer(a, a).double() * k_score
    blocks = score_blocks_from_advantage(group_blocks(k_adv, 3), a)  # [2, 3, 3]
    torch.testing.assert_close(blocks[0], group_blocks(k_score, 3)[0], rtol=1e-12, atol=0)
    assert score_groups_to_recompute(a, 2).tolist() == [False, False]  # all-zero: read by no matrix
    mixed = torch.tensor([1.0, 0.0, -1.0, 0.0, 0.0, 0.0])
    assert score_groups_to_recompute(mixed, 2).tolist() == [True, False]
    assert score_groups_to_recompute(None, 2).tolist() == [True, True]


def test_fused_capture_keeps_nothing_alive(tmp_path):
    """The gradient hooks must not tie a micro-batch's hooked outputs to its capture: memory grew
    by a forward's activations per probe step when they did (a cycle through the tensors' hook
    dicts, which the garbage collector does not see)."""
    import gc

    from grpo_cli.probes.per_sample import LayerCapture

    _, capture, _, _ = probe_step(tmp_path, True, "train.micro_batch_size=5")
    gc.collect()
    assert capture.source == "training_pass"
    assert not [obj for obj in gc.get_objects() if type(obj) is LayerCapture]
