"""The training forward's speed-ups: shared-prompt forward, completion buckets and live-row backward (exact up to round-off) and bf16 autocast (reported)."""

from __future__ import annotations

import itertools
import math

import pytest
import torch
from step_parity import (
    GradForwards,
    assert_same_update,
    parity_reward,
    relative_gap,
    setup_for,
    step_loss_and_grads,
)

from grpo_cli.rollout.batch import select_rows
from grpo_cli.train.policy_forward import (
    BUCKET_CHARGE,
    distinct_prompts,
    expand_rows,
    length_buckets,
    plain_forward,
    shared_prefix_forward,
    take_rows,
)

SHARED = "train.shared_prompt_forward=true"


@pytest.mark.parametrize("loss_agg", ["token_mean", "seq_mean_token_mean"])
@pytest.mark.parametrize("micro_batch_size", [64, 3])
def test_shared_prompt_forward_keeps_loss_and_gradients(tmp_path, loss_agg, micro_batch_size):
    """fp32: the step's loss and every parameter's gradient agree to 1e-5 relative."""
    overrides = [f"algorithm.loss_agg={loss_agg}", f"train.micro_batch_size={micro_batch_size}"]
    reference = step_loss_and_grads(setup_for(tmp_path, *overrides))
    candidate_setup = setup_for(tmp_path, *overrides, SHARED)
    assert candidate_setup.trainer.shared_prompt_forward
    assert_same_update(reference, step_loss_and_grads(candidate_setup))


def test_fast_cpu_configuration_keeps_the_update(tmp_path):
    """hf_static rollouts + shared-prompt forward: the same update as the plain path."""
    reference = step_loss_and_grads(setup_for(tmp_path, "rollout.backend=hf_static"))
    candidate = step_loss_and_grads(setup_for(tmp_path, "rollout.backend=hf_static", SHARED))
    assert_same_update(reference, candidate)


@pytest.mark.parametrize("backend", ["hf", "hf_static"])
def test_shared_prompt_forward_in_bf16_keeps_the_update(tmp_path, backend):
    """bf16 weights: the same loss, and every gradient within bf16 rounding of the plain path's.
    Measured on CPU: worst parameter 0.0053 relative (L2), all parameters together 0.0031."""
    overrides = ["model.dtype=bfloat16", f"rollout.backend={backend}"]
    reference = step_loss_and_grads(setup_for(tmp_path, *overrides))
    assert next(iter(reference[1].values())).dtype == torch.bfloat16
    assert_same_update(reference, step_loss_and_grads(setup_for(tmp_path, *overrides, SHARED)),
                       rtol=0.02)


def test_shared_prompt_forward_with_kl_and_several_iterations(tmp_path):
    """The reference model's and the old-log-prob forwards share prompts too."""
    overrides = ["algorithm.kl_coef=0.1", "algorithm.num_iterations=2"]
    reference = step_loss_and_grads(setup_for(tmp_path, *overrides))
    assert_same_update(reference, step_loss_and_grads(setup_for(tmp_path, *overrides, SHARED)))


def test_shared_prefix_forward_matches_on_completion_columns(tmp_path):
    setup = setup_for(tmp_path)
    batch = setup.trainer.rollout(0, draw=0)
    first, inverse = distinct_prompts(batch)  # read from the batch's prompt columns
    assert first == list(range(0, batch.num_rollouts, batch.group_size))
    assert inverse == [row // batch.group_size for row in range(batch.num_rollouts)]
    # the trainer's keys (each row's problem's prompt tokens) say the same without a read
    assert distinct_prompts(batch, setup.trainer.prompt_keys(batch)) == (first, inverse)
    plain = plain_forward(setup.model, batch)
    shared = shared_prefix_forward(setup.model, batch)
    assert shared is not None
    columns = slice(batch.prompt_length, None)
    torch.testing.assert_close(shared[0][:, columns], plain[0][:, columns], atol=1e-5, rtol=0)
    torch.testing.assert_close(shared[1][:, columns], plain[1][:, columns], atol=1e-5, rtol=0)
    single = select_rows(batch, torch.arange(0, batch.num_rollouts, batch.group_size))
    assert shared_prefix_forward(setup.model, single) is None  # nothing shared: plain forward


def _bucket_cost(groups, widths, total_rows):
    widest = max(widths)
    return sum(len(rows) * max(widths[row] for row in rows) for rows in groups) + (
        BUCKET_CHARGE * total_rows * widest * len(groups))


def _splits(order, most):
    """Every split of `order` into at most `most` consecutive groups."""
    for count in range(1, most + 1):
        for cuts in itertools.combinations(range(1, len(order)), count - 1):
            bounds = (0, *cuts, len(order))
            yield [order[start:end] for start, end in itertools.pairwise(bounds)]


def test_length_buckets_split_by_width_at_least_cost():
    assert length_buckets([5, 1, 5, 1], 1) == [[0, 1, 2, 3]]
    assert length_buckets([5, 1, 5, 1], 2) == [[0, 2], [1, 3]]  # 10 + 2 positions instead of 20
    assert length_buckets([4, 4, 4], 3) == [[0, 1, 2]]  # nothing to gain: one forward
    generator = torch.Generator().manual_seed(0)
    for _ in range(20):  # against every split of the sorted rows into at most 3 groups
        widths = torch.randint(1, 33, (7,), generator=generator).tolist()
        groups = length_buckets(widths, 3)
        assert sorted(row for rows in groups for row in rows) == list(range(7))
        order = sorted(range(7), key=lambda row: -widths[row])
        best = min(_bucket_cost(split, widths, 7) for split in _splits(order, 3))
        assert _bucket_cost(groups, widths, 7) <= best + 1e-9


def test_bucketed_completion_forward_matches_one_forward(tmp_path):
    """Rows of different lengths in up to 3 completion forwards: the same log-probs and entropies
    on every real completion column, and the same gradient of a weighted sum, to 1e-5."""
    setup = setup_for(tmp_path, "model.warm_start.steps=50")
    batch = setup.trainer.rollout(0, draw=0)
    widths = batch.attention_mask[:, batch.prompt_length:].sum(dim=1).tolist()
    assert len(length_buckets(widths, 3)) > 1  # the rows' lengths differ enough to split
    weights = torch.rand(batch.completion_mask.shape, generator=torch.Generator().manual_seed(1))
    results = []
    for buckets in (1, 3):
        setup.model.zero_grad(set_to_none=True)
        logprobs, entropy = shared_prefix_forward(setup.model, batch, buckets=buckets)
        (logprobs * weights * batch.completion_mask).sum().backward()
        grads = {name: p.grad.clone() for name, p in setup.model.named_parameters() if p.grad is not None}
        results.append((logprobs.detach() * batch.attention_mask, entropy.detach() * batch.attention_mask, grads))
    (lp_one, ent_one, grads_one), (lp_buckets, ent_buckets, grads_buckets) = results
    torch.testing.assert_close(lp_buckets, lp_one, atol=1e-5, rtol=0)
    torch.testing.assert_close(ent_buckets, ent_one, atol=1e-5, rtol=0)
    assert grads_one.keys() == grads_buckets.keys()
    for name, grad in grads_one.items():
        assert relative_gap(grad, grads_buckets[name]) <= 1e-5, name


@pytest.mark.parametrize("micro_batch_size", [64, 5])
@pytest.mark.parametrize("forward", [SHARED, "train.shared_prompt_forward=false", "algorithm=ppo"],
                         ids=["shared", "plain", "value_head"])
def test_bucketed_completion_forward_keeps_the_update(tmp_path, micro_batch_size, forward):
    """train.completion_buckets in the training step: the same loss and gradients (1e-5). The
    plain forward (no shared prompts, or the value head's) runs each micro-batch's rows in
    forwards over rows of similar width."""
    overrides = ["model.warm_start.steps=50", SHARED, forward, f"train.micro_batch_size={micro_batch_size}",
                 "rollout.max_new_tokens=24"]  # widths of 1-24 after a 45-column prompt: worth splitting
    reference_setup = setup_for(tmp_path, *overrides, "train.completion_buckets=1")  # one forward
    assert reference_setup.trainer.buckets == 1
    reference = step_loss_and_grads(reference_setup)
    candidate_setup = setup_for(tmp_path, *overrides, "train.completion_buckets=3")
    assert candidate_setup.trainer.buckets == 3
    with GradForwards(candidate_setup.model) as forwards:
        candidate = step_loss_and_grads(candidate_setup)
    assert_same_update(reference, candidate)
    micro_batches = -(-candidate[2].batch.num_rollouts // micro_batch_size)
    if forward != SHARED:  # more forwards than micro-batches: the rows were split by width
        assert forwards.count > micro_batches


def test_plain_forward_stops_at_the_widest_rows_last_column(tmp_path):
    """`widths`: the columns after every row's last token are left out, and their outputs are 0;
    the rest equals the full forward up to float32 round-off: the trimmed forward runs other
    widths, so other attention and gemm blockings; a log-prob is a chain of ~8 float32 products
    of K <= 64 terms, ~8 sqrt(K) 2^-24 = 3.8e-6 relative to the logits (|z| <= ~10 here), so
    4e-5 absolute (the old 1e-6 failed at MKL_CBWR=COMPATIBLE: 1.4e-6 at 3.4); a wrong column
    moves a log-prob by O(1)."""
    setup = setup_for(tmp_path, "model.warm_start.steps=50")
    batch = setup.trainer.rollout(0, draw=0)
    short = select_rows(batch, [row for row, width in enumerate(batch.completion_widths().tolist())
                                if width < batch.input_ids.shape[1] - batch.prompt_length])
    widths = short.completion_widths().tolist()
    assert short.num_rollouts > 0 and short.prompt_length + max(widths) < short.input_ids.shape[1]
    with torch.no_grad():
        full = plain_forward(setup.model, short)
        trimmed = plain_forward(setup.model, short, widths=widths)
    real = short.attention_mask.bool()
    for name, a, b in (("logprobs", full[0], trimmed[0]), ("entropy", full[1], trimmed[1])):
        assert a.shape == b.shape, name
        torch.testing.assert_close(b[real], a[real], atol=4e-5, rtol=0)
        assert (b[:, short.prompt_length + max(widths):] == 0).all(), name


def test_bf16_autocast_step_deviation_is_rounding_only(tmp_path):
    """Not a parity claim: the bf16 path's deviation from fp32, printed and bounded loosely."""
    reference = step_loss_and_grads(setup_for(tmp_path))
    candidate_setup = setup_for(tmp_path, "model.autocast=bf16")
    candidate = step_loss_and_grads(candidate_setup)
    loss_a, grads_a, out_a = reference
    loss_b, grads_b, out_b = candidate
    flat_a = torch.cat([grads_a[name].flatten() for name in grads_a])
    flat_b = torch.cat([grads_b[name].flatten() for name in grads_a])
    gap = relative_gap(flat_a, flat_b)
    loss_gap = abs(loss_b - loss_a) / max(abs(loss_a), 1e-12)
    print(f"bf16 autocast vs fp32: loss rel. {loss_gap:.2e}, gradient rel. (L2) {gap:.2e}")
    assert gap > 0  # bf16 really ran
    assert gap < 0.1 and torch.nn.functional.cosine_similarity(flat_a, flat_b, dim=0) > 0.99
    head = candidate_setup.model.get_output_embeddings()
    assert head._fp32_under_autocast  # log-probs come from fp32 logits


def test_autocast_head_runs_the_head_in_bf16_and_stays_near_fp32(tmp_path):
    """model.autocast_head=true: the head runs under autocast like the body (bf16 logits, TRL's
    bf16 precision; log-softmax still float32). Not a parity claim: the step's deviation from fp32
    is bounded loosely, and the sampler's and the policy's log-probs differ by bf16 rounding."""
    reference = step_loss_and_grads(setup_for(tmp_path))
    setup = setup_for(tmp_path, "model.autocast=bf16", "model.autocast_head=true")
    head = setup.model.get_output_embeddings()
    assert not getattr(head, "_fp32_under_autocast", False)
    with setup.trainer.forward_autocast():
        assert head(torch.zeros(1, head.in_features)).dtype == torch.bfloat16
    loss_b, grads_b, out_b = step_loss_and_grads(setup)
    loss_a, grads_a, _ = reference
    flat_a = torch.cat([grads_a[name].flatten() for name in grads_a])
    flat_b = torch.cat([grads_b[name].flatten() for name in grads_a])
    assert 0 < relative_gap(flat_a, flat_b) < 0.1
    assert torch.nn.functional.cosine_similarity(flat_a, flat_b, dim=0) > 0.99
    assert 0 < out_b.metrics["logprob_diff_max"] < 0.5  # bf16 logits: rounding, not a bug


def test_unknown_autocast_kind_is_rejected(tmp_path):
    with pytest.raises(ValueError, match="model.autocast='fp8'"):
        setup_for(tmp_path, "model.autocast=fp8")


@pytest.mark.parametrize("rows", [[0, 4, 8], [3], [0, 0, 0, 1, 1], [2, 0, 1], [1, 3, 5, 6], []])
def test_take_and_expand_rows_equal_advanced_indexing(rows):
    """Host row lists become strided slices or a copied index; either way tensor[rows], contiguous,
    with the gradient of tensor[rows] (a sum over repeated rows)."""
    source = torch.randn(9, 3, 2, requires_grad=True)
    expected = source[torch.tensor(rows, dtype=torch.long)]
    taken = take_rows(source, rows)
    assert torch.equal(taken, expected) and taken.is_contiguous()
    groups = torch.randn(3, 2, requires_grad=True)
    inverse = [row % 3 for row in rows] if rows else []
    expanded = expand_rows(groups, inverse)
    assert torch.equal(expanded, groups[torch.tensor(inverse, dtype=torch.long)])
    if rows:
        weights = torch.randn_like(expanded)
        (grad,) = torch.autograd.grad((expanded * weights).sum(), groups)
        reference = torch.zeros_like(groups).index_add_(0, torch.tensor(inverse), weights)
        torch.testing.assert_close(grad, reference)


def test_expand_rows_repeats_contiguous_groups():
    groups = torch.arange(6.0).reshape(3, 2)
    assert torch.equal(expand_rows(groups, [0, 0, 1, 1, 2, 2]), groups.repeat_interleave(2, dim=0))


LIVE = "train.backward_live_rows=true"
EVERY_ROW = "train.backward_live_rows=false"  # the reference: every row's backward


def half_idle(setup):
    """About half the problems reward every completion alike (a group of zero advantages)."""
    def reward(text, problem):
        return 1.0 if sum(map(ord, repr(problem))) % 2 else parity_reward(text, problem)

    setup.task.reward = reward
    return setup


@pytest.mark.parametrize("extra", [[SHARED, "train.completion_buckets=3"], ["train.micro_batch_size=5"]])
def test_backward_of_live_rows_only_keeps_the_update(tmp_path, extra):
    """Rows of zero advantage carry no gradient: without their backward, the same loss and
    gradients (1e-5), with shared prompts and buckets, and with micro-batches that split groups."""
    overrides = ["model.warm_start.steps=50", "rollout.prompts_per_step=8", *extra]
    reference = step_loss_and_grads(half_idle(setup_for(tmp_path, *overrides, EVERY_ROW)))
    candidate = step_loss_and_grads(half_idle(setup_for(tmp_path, *overrides, LIVE)))
    advantages = candidate[2].advantages  # [N, L]
    idle = (advantages == 0).all(dim=1)
    assert idle.any() and not idle.all()  # the batch has rows to skip and rows to train
    assert_same_update(reference, candidate)


def adamw_round_off(grads_a, grads_b, optim) -> tuple[dict[str, torch.Tensor], float]:
    """How far two runs' weights may drift apart after a first AdamW step from gradients a and b
    (each [param shape]) and a second from zero gradients, from the gradients' round-off alone;
    and the two steps' size at most (lr (1 + k)).

    AdamW's step is lr * u(g) with u(g) = g / (|g| + eps) (bias-corrected; clipping by a factor c
    reads as eps / c), and the zero-gradient step adds lr * k * g / (|g| + eps'), k =
    b1 / (1 - b1^2) / sqrt(b2 / (1 - b2^2)) (0.67 at the default betas). For any eps,
    |u(g) - u(g')| <= |g - g'| / (4 min(|g|, |g'|)) on one side of 0, and <= 2 across it:
    elements far above eps agree to their weights' float32 rounding, those near it may move by
    their whole step. The clipping factors differ by the gradient norms' relative gap. Each
    step's own float32 arithmetic (~6 roundings of an lr-sized value, two steps, two runs) adds
    at most 2^-18 of the two steps.
    """
    beta1, beta2 = optim.betas
    steps = optim.lr * (1 + beta1 / (1 - beta1**2) / math.sqrt(beta2 / (1 - beta2**2)))
    norm_a, norm_b = (torch.stack([g.norm() for g in grads.values()]).norm() for grads in (grads_a, grads_b))
    clip_gap = float((norm_a - norm_b).abs() / norm_a)
    bounds = {}
    for name, a in grads_a.items():
        b = grads_b[name]
        smaller = torch.minimum(a.abs(), b.abs()).clamp(min=torch.finfo(a.dtype).tiny)
        spread = ((a - b).abs() / smaller + clip_gap) / 4
        across = torch.where(a == b, 0.0, 2.0)  # both 0: no step either way
        bounds[name] = steps * (torch.where(a * b > 0, spread.clamp(max=2.0), across) + 2**-18)
    return bounds, steps


def test_backward_of_live_rows_with_no_live_row_steps_adamw_as_before(tmp_path):
    """A step whose rows all have zero advantage, after a real one: no backward runs, yet AdamW
    gets the zero gradients a backward would have left and moves the weights by its moments,
    as without the option (AdamW skips a parameter whose .grad is None).

    The first step's gradients differ by float32 summation order (the option sums fewer rows):
    each weight within what AdamW makes of its gradient's difference (`adamw_round_off`) plus
    four float32 roundings of the weight (two steps, two runs: 4 * 2^-24 |w|; |w| here the
    final weight, the first step's no larger than |w| plus a step). A missed moment
    step moves every weight by 0.67 lr, far above that wherever |g| >> AdamW's eps."""
    def two_steps(*overrides):
        setup = setup_for(tmp_path, "model.warm_start.steps=50", *overrides)
        _, grads, _ = step_loss_and_grads(setup)  # parity_reward: moments from a real gradient
        setup.task.reward = lambda text, problem: 1.0  # then every group uniform, every advantage 0
        output = setup.trainer.step(1)
        assert (output.advantages == 0).all()
        return grads, {name: p.detach().clone() for name, p in setup.model.named_parameters()}, setup.cfg.optim

    (grads_ref, reference, optim), (grads_live, candidate, _) = two_steps(EVERY_ROW), two_steps(LIVE)
    bounds, steps = adamw_round_off(grads_ref, grads_live, optim)
    for name, weight in reference.items():
        excess = (candidate[name] - weight).abs() - bounds[name] - 2**-22 * (weight.abs() + steps)
        assert excess.max() <= 0, (name, float(excess.max()))


def test_backward_of_live_rows_keeps_the_kl_gradient_of_idle_rows(tmp_path):
    """With a KL term every row has a gradient once the policy has left the reference (the
    second step): the option leaves such steps whole."""
    overrides = ["model.warm_start.steps=50", "rollout.prompts_per_step=8", "algorithm.kl_coef=0.1"]

    def second_step(*extra):
        setup = half_idle(setup_for(tmp_path, *overrides, *extra))
        setup.trainer.step(0)
        return step_loss_and_grads(setup, step=1)

    reference, candidate = second_step(), second_step(LIVE)
    assert (candidate[2].advantages == 0).all(dim=1).any()  # idle rows that the KL term moves
    assert_same_update(reference, candidate)
