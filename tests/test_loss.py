import math

import pytest
import torch

from grpo_cli.algorithm.loss import (
    aggregation_weights,
    importance_ratio,
    kl_k3,
    policy_loss,
    token_loss_weights,
    uniform_weight_rollouts,
    value_loss,
)

# Two rollouts: row 0 has 3 completion tokens, row 1 has 1 (then padding).
MASK = torch.tensor([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0]])
ADVANTAGES = torch.tensor([[1.0, 2.0, 3.0], [4.0, 7.0, 7.0]])  # padding values must not count


def on_policy_loss(agg, constant=None, level="token"):
    old = torch.tensor([[-1.0, -2.0, -0.5], [-3.0, 50.0, -50.0]])
    logprobs = old.clone().requires_grad_(True)
    loss, stats = policy_loss(
        logprobs, old, ADVANTAGES, MASK, 0.2, 0.2, agg, constant, importance_sampling_level=level
    )
    loss.backward()
    return loss, logprobs.grad, stats


def test_token_mean_by_hand():
    loss, grad, stats = on_policy_loss("token_mean")
    assert loss.item() == pytest.approx(-(1 + 2 + 3 + 4) / 4)
    torch.testing.assert_close(grad, -torch.tensor([[1.0, 2.0, 3.0], [4.0, 0.0, 0.0]]) / 4)
    assert stats["clip_frac"].item() == 0.0


def test_seq_mean_token_mean_by_hand():
    loss, grad, _ = on_policy_loss("seq_mean_token_mean")
    assert loss.item() == pytest.approx(-((1 + 2 + 3) / 3 + 4 / 1) / 2)
    torch.testing.assert_close(grad, -torch.tensor([[1 / 6, 2 / 6, 3 / 6], [4 / 2, 0.0, 0.0]]))


def test_constant_by_hand():
    loss, grad, _ = on_policy_loss("constant", constant=5)
    assert loss.item() == pytest.approx(-(1 + 2 + 3 + 4) / (2 * 5))
    torch.testing.assert_close(grad, -torch.tensor([[1.0, 2.0, 3.0], [4.0, 0.0, 0.0]]) / 10)


def test_aggregation_weights_values_and_errors():
    torch.testing.assert_close(aggregation_weights(MASK, "token_mean"), MASK / 4)
    torch.testing.assert_close(
        aggregation_weights(MASK, "seq_mean_token_mean"),
        torch.tensor([[1 / 6, 1 / 6, 1 / 6], [1 / 2, 0.0, 0.0]]),
    )
    torch.testing.assert_close(aggregation_weights(MASK, "constant", 3), MASK / 6)
    with pytest.raises(ValueError, match="positive constant"):
        aggregation_weights(MASK, "constant", None)
    with pytest.raises(ValueError, match="unknown loss aggregation 'sum'.*token_mean"):
        aggregation_weights(MASK, "sum")


def test_micro_batch_weights_with_batch_totals_match_the_full_batch():
    generator = torch.Generator().manual_seed(0)
    mask = (torch.rand(6, 5, generator=generator) > 0.3).float()
    tokens, sequences = mask.sum().item(), mask.shape[0]
    for agg in ("token_mean", "seq_mean_token_mean", "constant"):
        full = aggregation_weights(mask, agg, 8)
        parts = [
            aggregation_weights(part, agg, 8, batch_tokens=tokens, batch_sequences=sequences)
            for part in (mask[:2], mask[2:])
        ]
        torch.testing.assert_close(torch.cat(parts), full)
        assert full.sum().item() > 0


def test_clipping_both_sides_with_asymmetric_epsilon():
    # epsilon 0.1 (low), epsilon_high 0.3
    ratios = torch.tensor([[1.5, 0.5, 1.5, 0.5, 1.2, 0.95]])
    advantages = torch.tensor([[1.0, -1.0, -1.0, 1.0, 1.0, -1.0]])
    old = torch.full((1, 6), -1.0)
    logprobs = (old + ratios.log()).requires_grad_(True)
    mask = torch.ones(1, 6)
    loss, stats = policy_loss(logprobs, old, advantages, mask, 0.1, 0.3, "token_mean")
    loss.backward()
    # token 0 clipped high (1.3), token 1 clipped low (-0.9), tokens 2-5 keep rho * A;
    # token 4 (1.2) would be clipped by a symmetric 0.1 clip but not by epsilon_high 0.3
    objective = [1.3, -0.9, -1.5, 0.5, 1.2, -0.95]
    assert loss.item() == pytest.approx(-sum(objective) / 6, abs=1e-6)
    expected_grad = -torch.tensor([[0.0, 0.0, -1.5, 0.5, 1.2, -0.95]]) / 6
    torch.testing.assert_close(logprobs.grad, expected_grad)
    assert stats["clip_frac"].item() == pytest.approx(2 / 6)
    assert stats["clip_frac_low"].item() == pytest.approx(1 / 6)
    assert stats["clip_frac_high"].item() == pytest.approx(1 / 6)


def test_padding_does_not_leak_into_loss_or_clip_frac():
    old = torch.tensor([[-1.0, -1.0], [-1.0, -1.0]])
    logprobs = torch.tensor([[-1.0, 30.0], [-1.0, -1.0]])  # huge ratio on a padding token
    mask = torch.tensor([[1.0, 0.0], [1.0, 1.0]])
    advantages = torch.ones(2, 2)
    loss, stats = policy_loss(logprobs, old, advantages, mask, 0.2, 0.2, "token_mean")
    assert loss.item() == pytest.approx(-1.0)
    assert stats["clip_frac"].item() == 0.0


def test_gspo_sequence_ratio_and_clipping():
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
    old = torch.full((2, 3), -2.0)
    log_ratios = torch.tensor([[0.3, 0.0, -0.15], [0.6, 0.4, 9.0]])  # row means 0.05 and 0.5
    logprobs = (old + log_ratios).requires_grad_(True)
    advantages = torch.ones(2, 3)
    s0, s1 = math.exp(0.05), math.exp(0.5)

    ratio = importance_ratio(logprobs, old, mask, "sequence")
    torch.testing.assert_close(ratio, torch.tensor([[s0, s0, s0], [s1, s1, 1.0]]))

    loss, stats = policy_loss(
        logprobs, old, advantages, mask, 0.2, 0.2, "seq_mean_token_mean", None, "sequence"
    )
    loss.backward()
    # row 1's ratio 1.65 is clipped to 1.2 (no gradient); row 0's is not
    assert loss.item() == pytest.approx(-(s0 + 1.2) / 2, abs=1e-6)
    expected_grad = torch.tensor([[-s0 / 6] * 3, [0.0, 0.0, 0.0]])
    torch.testing.assert_close(logprobs.grad, expected_grad)
    assert stats["clip_frac"].item() == pytest.approx(2 / 5)


def test_gspo_token_form_has_the_sequence_level_gradient():
    """With per-sequence advantages and seq_mean_token_mean, GSPO-token's gradient is GSPO's."""
    generator = torch.Generator().manual_seed(1)
    mask = torch.tensor([[1.0, 1.0, 1.0, 1.0], [1.0, 1.0, 0.0, 0.0], [1.0, 1.0, 1.0, 0.0]])
    old = -torch.rand(3, 4, generator=generator)
    base = old + 0.05 * torch.randn(3, 4, generator=generator)
    advantages = torch.tensor([[1.0], [-0.5], [2.0]]).expand(3, 4)

    token_form = base.clone().requires_grad_(True)
    loss, _ = policy_loss(
        token_form, old, advantages, mask, 0.2, 0.2, "seq_mean_token_mean", None, "sequence"
    )
    loss.backward()

    sequence_form = base.clone().requires_grad_(True)
    lengths = mask.sum(1)
    s = (((sequence_form - old) * mask).sum(1) / lengths).exp()  # [N]
    a = advantages[:, 0]
    gspo = torch.minimum(s * a, s.clamp(0.8, 1.2) * a).mean()
    (-gspo).backward()
    torch.testing.assert_close(loss, -gspo)
    torch.testing.assert_close(token_form.grad, sequence_form.grad)


@pytest.mark.parametrize("agg", ["token_mean", "seq_mean_token_mean", "constant"])
def test_sequence_level_equals_token_level_when_ratios_are_one(agg):
    token_loss, token_grad, _ = on_policy_loss(agg, constant=4, level="token")
    sequence_loss, sequence_grad, _ = on_policy_loss(agg, constant=4, level="sequence")
    torch.testing.assert_close(sequence_loss, token_loss)
    torch.testing.assert_close(sequence_grad, token_grad)
    assert token_grad.abs().sum() > 0


def test_sequence_level_differs_from_token_level_off_policy():
    old = torch.zeros(1, 2)
    logprobs = torch.tensor([[0.1, -0.1]])
    mask = torch.ones(1, 2)
    adv = torch.tensor([[1.0, 1.0]])
    token, _ = policy_loss(logprobs, old, adv, mask, 0.2, 0.2, "token_mean")
    sequence, _ = policy_loss(logprobs, old, adv, mask, 0.2, 0.2, "token_mean", None, "sequence")
    assert sequence.item() == pytest.approx(-1.0)  # mean log ratio 0 -> s = 1
    assert token.item() == pytest.approx(-(math.exp(0.1) + math.exp(-0.1)) / 2)


def test_unknown_importance_sampling_level():
    with pytest.raises(ValueError, match="importance_sampling_level 'group'"):
        policy_loss(
            torch.zeros(1, 1),
            torch.zeros(1, 1),
            torch.ones(1, 1),
            torch.ones(1, 1),
            importance_sampling_level="group",
        )


def test_kl_k3_by_hand():
    log2 = math.log(2.0)
    logprobs = torch.tensor([[0.0, -log2, 0.0, 5.0]])
    ref = torch.tensor([[-log2, 0.0, 0.0, -80.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0]])
    out = kl_k3(logprobs, ref, mask)
    # d = ref - logp: -log2 -> 0.5 + log2 - 1 ; +log2 -> 2 - log2 - 1 ; 0 -> 0 ; masked -> 0
    expected = torch.tensor([[log2 - 0.5, 1.0 - log2, 0.0, 0.0]])
    torch.testing.assert_close(out, expected)


def test_value_loss_by_hand_and_returns_are_constants():
    values = torch.tensor([[1.0, 2.0, 99.0]], requires_grad=True)
    returns = torch.tensor([[0.0, 0.0, 0.0]], requires_grad=True)
    mask = torch.tensor([[1.0, 1.0, 0.0]])
    loss = value_loss(values, returns, mask)
    assert loss.item() == pytest.approx(0.5 * (1 + 4) / 2)
    loss.backward()
    torch.testing.assert_close(values.grad, torch.tensor([[0.5, 1.0, 0.0]]))
    assert returns.grad is None


# ---- claim 1's empirical reading: d loss / d log pi(y_t) ---------------------------------------
WEIGHT_MASK = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
OUTCOME = torch.tensor([[2.0, 2.0, 2.0], [-1.0, -1.0, 5.0], [0.0, 0.0, 0.0]])  # one advantage a row
LOGPROBS = torch.tensor([[-1.0, -2.0, -0.5], [-3.0, -0.1, 9.0], [-0.7, 0.0, 0.0]])


def weights_at(logprobs, old, advantages=OUTCOME, **kwargs):
    kwargs = {"epsilon": 0.2, "epsilon_high": 0.2, "agg": "token_mean", **kwargs}
    return token_loss_weights(logprobs, old, advantages, WEIGHT_MASK, **kwargs)


@pytest.mark.parametrize(
    ("agg", "constant", "per_token"),
    [
        ("token_mean", None, torch.tensor([[1 / 6] * 3, [1 / 6] * 2 + [0], [1 / 6, 0, 0]])),
        ("seq_mean_token_mean", None, torch.tensor([[1 / 9] * 3, [1 / 6] * 2 + [0], [1 / 3, 0, 0]])),
        ("constant", 4, torch.full((3, 3), 1 / 12) * WEIGHT_MASK),  # dr_grpo
    ],
)
def test_on_policy_outcome_weights_are_minus_w_times_a_and_uniform(agg, constant, per_token):
    # one pass (old = the forward's own log-probs), no KL: d loss / d log pi_t = -w_t A_i
    weights = weights_at(LOGPROBS, LOGPROBS, agg=agg, constant=constant)
    torch.testing.assert_close(weights, -per_token * OUTCOME * WEIGHT_MASK)
    counts = uniform_weight_rollouts(weights, OUTCOME, WEIGHT_MASK)
    assert counts.tolist() == [2.0, 2.0, 0.0]  # row 2 has advantage 0: not informative


def test_clipped_tokens_get_zero_weight_and_ratios_scale_the_rest():
    # row 0 (A = 2 > 0): token 0 ratio e^0.5 > 1.2 is clipped (weight 0), token 1 ratio e^0.1 is
    # not (weight -rho A / T); row 1 (A = -1 < 0): token 0 ratio e^-0.5 < 0.8 is clipped
    old = LOGPROBS - torch.tensor([[0.5, 0.1, 0.0], [-0.5, 0.0, 0.0], [0.0, 0.0, 0.0]])
    weights = weights_at(LOGPROBS, old)
    want = torch.tensor([[0.0, -2 * math.exp(0.1) / 6, -2 / 6], [0.0, 1 / 6, 0.0], [0.0, 0.0, 0.0]])
    torch.testing.assert_close(weights, want)
    uniform, informative, spread = uniform_weight_rollouts(weights, OUTCOME, WEIGHT_MASK).tolist()
    assert (uniform, informative) == (0.0, 2.0)
    # relative spread max |w - mean w| / max |w|: row 1 [0, 1/6] -> 1/2; row 0 [0, a, b] -> |mean| / |a|
    a, b = -2 * math.exp(0.1) / 6, -2 / 6
    assert spread == pytest.approx(0.5 + abs((a + b) / 3) / abs(a))


def test_kl_term_adds_its_own_per_token_weight():
    ref = LOGPROBS + torch.tensor([[0.3, -0.2, 0.0], [0.0, 0.0, 0.0], [1.0, 0.0, 0.0]])
    weights = weights_at(LOGPROBS, LOGPROBS, ref_logprobs=ref, kl_coef=0.5,
                         kl_weights=WEIGHT_MASK / 6)
    # d/dlogp of exp(ref - logp) - (ref - logp) - 1 is 1 - exp(ref - logp)
    kl = 0.5 * (WEIGHT_MASK / 6) * (1 - torch.exp(ref - LOGPROBS))
    torch.testing.assert_close(weights, (-OUTCOME * WEIGHT_MASK / 6 + kl) * WEIGHT_MASK)
    # row 1 (KL gradient 0 there) stays uniform, row 0 does not
    assert uniform_weight_rollouts(weights, OUTCOME, WEIGHT_MASK).tolist()[:2] == [1.0, 2.0]


def test_per_token_advantages_are_not_uniform_and_the_tolerance_is_relative():
    # row 0 differs by float32 rounding (relative 2.4e-7 < 1e-6): uniform; row 1 does not
    per_token = torch.tensor([[1.0, 1.0, 1.0 + 2e-7], [3.0, 4.0, 0.0], [0.0, 0.0, 0.0]])
    weights = weights_at(LOGPROBS, LOGPROBS, advantages=per_token)
    assert uniform_weight_rollouts(weights, per_token, WEIGHT_MASK).tolist()[:2] == [1.0, 2.0]
    # a relative 1e-5 spread is not uniform at 1e-6, whatever the weights' scale
    scaled = torch.tensor([[1e-9, 1e-9, 1.00001e-9]] * 3) * WEIGHT_MASK
    assert uniform_weight_rollouts(scaled, OUTCOME, WEIGHT_MASK).tolist()[:2] == [1.0, 2.0]
