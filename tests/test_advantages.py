import inspect
import math
from pathlib import Path

import pytest
import torch
from conftest import outcome_advantages

from grpo_cli.algorithm.advantages import (
    ESTIMATORS,
    TokenProbs,
    broadcast_to_tokens,
    gae,
    get_estimator,
    outcome_on_last_token,
    process_advantages,
    register_adv_est,
)
from grpo_cli.config.schema import AlgorithmConfig


def close(actual, expected, atol=1e-6):
    expected = torch.as_tensor(expected, dtype=actual.dtype)
    torch.testing.assert_close(actual, expected, atol=atol, rtol=0)


def outcome(name, rewards, group_size, **options):
    """Per-rollout advantages [N] of registered estimator `name`, one completion token per rollout."""
    advantages = outcome_advantages(name, rewards, group_size, **options)
    assert advantages.dtype == torch.float32
    return advantages


# --- registry -------------------------------------------------------------------------------------


def test_registry_holds_every_estimator_with_its_needs():
    assert set(ESTIMATORS) == {"grpo", "dr_grpo", "rloo", "reinforce", "ppo", "process", "otb"}
    assert get_estimator("rloo") is ESTIMATORS["rloo"]
    assert [name for name, e in ESTIMATORS.items() if e.needs_values] == ["ppo"]
    assert [name for name, e in ESTIMATORS.items() if e.needs_step_rewards] == ["process"]
    assert sorted(name for name, e in ESTIMATORS.items() if not e.group_baseline) == [
        "otb", "ppo", "reinforce"
    ]
    assert [name for name, e in ESTIMATORS.items() if e.needs_token_probs] == ["otb"]


def test_every_estimator_has_one_signature_and_a_yaml_file():
    signatures = {name: inspect.signature(e.compute) for name, e in ESTIMATORS.items()}
    params = {name: list(sig.parameters) for name, sig in signatures.items()}
    assert all(p == params["grpo"] for p in params.values()), params
    conf = Path(__file__).resolve().parents[1] / "conf" / "algorithm"
    for name in ESTIMATORS:
        assert f"name: {name}" in (conf / f"{name}.yaml").read_text()


def test_unknown_estimator_lists_known_names():
    with pytest.raises(ValueError, match="unknown advantage estimator 'grp0'.*dr_grpo.*grpo.*ppo"):
        get_estimator("grp0")


def test_register_adv_est_adds_and_refuses_duplicates():
    @register_adv_est("_test_zero", credit="per_token", zero_sum_group=False, needs_values=True)
    def zero(token_level_rewards, response_mask, group_size, config, **_):
        return torch.zeros_like(response_mask), None

    try:
        assert get_estimator("_test_zero").compute is zero
        assert get_estimator("_test_zero").needs_values
        assert get_estimator("_test_zero").facts() == {
            "name": "_test_zero", "credit": "per_token", "zero_sum_group": False}
        with pytest.raises(ValueError, match="already registered"):
            register_adv_est("_test_zero", credit="outcome", zero_sum_group=False)(zero)
    finally:
        del ESTIMATORS["_test_zero"]


@pytest.mark.parametrize(("credit", "zero_sum_group", "message"), [
    ("token", False, "credit='token' is not one of outcome, per_token"),
    ("per_token", True, "a zero-sum group gives one advantage per rollout"),
])
def test_register_adv_est_refuses_facts_that_cannot_hold(credit, zero_sum_group, message):
    with pytest.raises(ValueError, match=message):
        register_adv_est("_test_bad", credit=credit, zero_sum_group=zero_sum_group)
    assert "_test_bad" not in ESTIMATORS


def test_outcome_sits_on_the_last_completion_token():
    mask = torch.tensor([[0, 1, 1, 0], [0, 1, 1, 1], [0, 0, 0, 0]], dtype=torch.float32)
    out = outcome_on_last_token(torch.tensor([2.0, -1.0, 5.0]), mask)
    close(out, [[0, 0, 2, 0], [0, 0, 0, -1], [0, 0, 0, 0]])


def test_outcome_estimators_broadcast_over_completion_tokens():
    mask = torch.tensor([[0, 1, 1, 0], [0, 1, 0, 0]], dtype=torch.float32)
    rewards = torch.tensor([1.0, 0.0])
    for name in ("grpo", "dr_grpo", "rloo", "reinforce"):
        advantages, _ = get_estimator(name).compute(
            outcome_on_last_token(rewards, mask), mask, 2, AlgorithmConfig(),
            outcome_rewards=rewards,
        )
        assert advantages.dtype == torch.float32
        assert torch.equal(advantages == 0, mask == 0), name  # off completion: 0
        assert advantages[0, 1] == advantages[0, 2] > 0 > advantages[1, 1], name


def test_token_level_estimators_refuse_missing_inputs():
    mask = torch.ones(2, 3)
    rewards = torch.tensor([1.0, 0.0])
    with pytest.raises(ValueError, match="value head"):
        get_estimator("ppo").compute(mask, mask, 2, AlgorithmConfig(), outcome_rewards=rewards)
    with pytest.raises(ValueError, match="step rewards"):
        get_estimator("process").compute(mask, mask, 2, AlgorithmConfig(), outcome_rewards=rewards)
    with pytest.raises(ValueError, match="per-token probabilities"):
        get_estimator("otb").compute(mask, mask, 2, AlgorithmConfig(), outcome_rewards=rewards)


# --- grpo -----------------------------------------------------------------------------------------


def test_grpo_population_std():
    # mean .25, population std sqrt(3/16) = sqrt(3)/4
    out = outcome("grpo", torch.tensor([1.0, 0, 0, 0]), 4, std_epsilon=0.0)
    std = math.sqrt(3) / 4
    close(out, [0.75 / std, -0.25 / std, -0.25 / std, -0.25 / std])


def test_grpo_sample_std_and_epsilon():
    # sample std: sqrt((.75^2 + 3 * .25^2) / 3) = 0.5
    out = outcome("grpo", torch.tensor([1.0, 0, 0, 0]), 4, std="sample", std_epsilon=0.5)
    close(out, [0.75, -0.25, -0.25, -0.25])


def test_grpo_zero_variance_groups_are_exactly_zero():
    rewards = torch.tensor([0.1, 0.1, 0.1, 1.0, 0.0, 1.0])  # groups of 3
    out = outcome("grpo", rewards, 3, std_epsilon=0.0)
    assert torch.equal(out[:3], torch.zeros(3))
    assert not torch.isnan(out).any()
    # second group [1, 0, 1]: mean 2/3, population std sqrt(2)/3
    std = math.sqrt(2) / 3
    close(out[3:], [(1 / 3) / std, (-2 / 3) / std, (1 / 3) / std])


def test_grpo_rejects_bad_options():
    with pytest.raises(ValueError, match="population"):
        outcome("grpo", torch.tensor([1.0, 0.0]), 2, std="unbiased")
    with pytest.raises(ValueError, match="group_size >= 2"):
        outcome("grpo", torch.tensor([1.0, 0.0]), 1, std="sample")
    with pytest.raises(ValueError, match="groups of 3"):
        outcome("grpo", torch.tensor([1.0, 0.0]), 3)


# --- dr_grpo, rloo, reinforce ----------------------------------------------------------------------


def test_dr_grpo_mean_only_baseline():
    out = outcome("dr_grpo", torch.tensor([1.0, 0, 0, 0, 0.3, 0.3, 0.3, 0.3]), 4)
    close(out[:4], [0.75, -0.25, -0.25, -0.25])
    assert torch.equal(out[4:], torch.zeros(4))


def test_rloo_leave_one_out():
    # group [1, 0, 0, 0]: 1 - 0 = 1 ; 0 - 1/3 ; group [2, 1]: 2 - 1 = 1, 1 - 2 = -1
    out = outcome("rloo", torch.tensor([1.0, 0, 0, 0, 2.0, 1.0, 5.0, 3.0]), 4)
    close(out, [1.0, -1 / 3, -1 / 3, -1 / 3, 2.0 - 3.0, 1.0 - 10 / 3, 5.0 - 2.0, 3.0 - 8 / 3])


def test_rloo_is_scaled_dr_grpo():
    rewards = torch.rand(12, generator=torch.Generator().manual_seed(0))
    rloo = outcome("rloo", rewards, 4)
    dr = outcome("dr_grpo", rewards, 4)
    close(rloo, dr * 4 / 3, atol=1e-6)


def test_rloo_needs_two_rollouts():
    with pytest.raises(ValueError, match="rloo needs group_size >= 2"):
        outcome("rloo", torch.tensor([1.0, 0.0]), 1)


def test_reinforce_batch_mean_baseline():
    out = outcome("reinforce", torch.tensor([1.0, 1.0, 0.0, 0.0, 0.0, 0.0]), 2)
    close(out, [2 / 3, 2 / 3, -1 / 3, -1 / 3, -1 / 3, -1 / 3])
    assert torch.equal(outcome("reinforce", torch.full((4,), 0.7), 2), torch.zeros(4))


def test_broadcast_to_tokens():
    mask = torch.tensor([[0, 1, 1, 0], [0, 1, 1, 1]], dtype=torch.float32)
    out = broadcast_to_tokens(torch.tensor([2.0, -1.0]), mask)
    close(out, [[0, 2, 2, 0], [0, -1, -1, -1]])


# --- process advantages ---------------------------------------------------------------------------

# Group of 2 rollouts, one prompt column then completions.
# row 0: steps 0 (cols 1-2), 1 (cols 3-4), 2 = answer (col 5); step rewards .5, .5; outcome 1
# row 1: steps 0 (cols 1-2), 1 = answer (col 3), padding after; step reward 0; outcome 0
MASK = torch.tensor([[0, 1, 1, 1, 1, 1], [0, 1, 1, 1, 0, 0]], dtype=torch.float32)
STEP_INDEX = torch.tensor([[-1, 0, 0, 1, 1, 2], [-1, 0, 0, 1, -1, -1]])
STEP_REWARDS = torch.tensor([[0, 0, 0.5, 0, 0.5, 1.0], [0, 0, 0.0, 0.0, 0, 0]])


def test_process_return_to_go_hand_worked():
    out = process_advantages(STEP_REWARDS, MASK, STEP_INDEX, 2, baseline="return_to_go")
    # row 0 to-go: step0 2.0, step1 1.5, step2 1.0 ; row 1 to-go: step0 0, step1 0
    # baselines: step0 1.0, step1 .75, step2 1.0 (row 0 alone)
    close(out, [[0, 1.0, 1.0, 0.75, 0.75, 0.0], [0, -1.0, -1.0, -0.75, 0, 0]])


def test_process_step_group_hand_worked():
    out = process_advantages(STEP_REWARDS, MASK, STEP_INDEX, 2, baseline="step_group")
    # step rewards without outcome: row 0 [.5, .5, 0], row 1 [0, 0]; step baselines [.25, .25, 0]
    # outcome term: row 0 1 - .5 = .5, row 1 -.5
    close(out, [[0, 0.75, 0.75, 0.75, 0.75, 0.5], [0, -0.75, -0.75, -0.75, 0, 0]])


def test_process_tokens_differ_exactly_where_step_rewards_differ():
    # two rollouts with 3 steps each; row 0's step 1 is wrong, row 1's step 0 is wrong
    mask = torch.ones(2, 6)
    step_index = torch.tensor([[0, 0, 1, 1, 2, 2], [0, 0, 1, 1, 2, 2]])
    rewards = torch.tensor([[0, 0.5, 0, 0.0, 0, 1.0], [0, 0.0, 0, 0.5, 0, 1.0]])
    out = process_advantages(rewards, mask, step_index, 2, baseline="step_group")
    close(out, [[0.25, 0.25, -0.25, -0.25, 0, 0], [-0.25, -0.25, 0.25, 0.25, 0, 0]])
    to_go = process_advantages(rewards, mask, step_index, 2, baseline="return_to_go")
    # to-go row 0 [1.5, 1, 1], row 1 [1.5, 1.5, 1]; baselines [1.5, 1.25, 1]
    close(to_go, [[0, 0, -0.25, -0.25, 0, 0], [0, 0, 0.25, 0.25, 0, 0]])


def test_process_identical_rollouts_get_zero_and_groups_are_separate():
    rewards = torch.tensor([[0.5, 1.0], [0.5, 1.0], [0.0, 0.0], [0.5, 1.0]])
    step_index = torch.tensor([[0, 1]] * 4)
    mask = torch.ones(4, 2)
    for baseline in ("step_group", "return_to_go"):
        out = process_advantages(rewards, mask, step_index, 2, baseline=baseline)
        assert torch.equal(out[:2], torch.zeros(2, 2))
        assert (out[2] < 0).all() and (out[3] > 0).all()


def test_process_outcome_rewards_separate_a_step_ending_on_the_last_token():
    # the last calculator step ends on the last token: its 0.5 and the outcome 1 share a column
    mask = torch.ones(2, 4)
    step_index = torch.tensor([[0, 0, 1, 1], [0, 0, 1, 1]])
    rewards = torch.tensor([[0, 0.5, 0, 1.5], [0, 0.5, 0, 0.0]])
    outcome = torch.tensor([1.0, 0.0])
    out = process_advantages(rewards, mask, step_index, 2, "step_group", outcome_rewards=outcome)
    # steps: row 0 [.5, .5], row 1 [.5, 0] -> step 1 centred +-.25; outcome centred +-.5
    close(out, [[0.5, 0.5, 0.75, 0.75], [-0.5, -0.5, -0.75, -0.75]])
    merged = process_advantages(rewards, mask, step_index, 2, "step_group")
    # without it the 1.5 on the last token is all outcome: +-.75 everywhere
    close(merged, [[0.75] * 4, [-0.75] * 4])
    to_go = process_advantages(
        rewards, mask, step_index, 2, "return_to_go", outcome_rewards=outcome
    )
    close(to_go, process_advantages(rewards, mask, step_index, 2, "return_to_go"))


def test_process_rejects_unindexed_completion_tokens_and_bad_baseline():
    bad_index = STEP_INDEX.clone()
    bad_index[0, 1] = -1
    with pytest.raises(ValueError, match="step index"):
        process_advantages(STEP_REWARDS, MASK, bad_index, 2)
    with pytest.raises(ValueError, match="return_to_go"):
        process_advantages(STEP_REWARDS, MASK, STEP_INDEX, 2, baseline="outcome")


# --- GAE ------------------------------------------------------------------------------------------


def gae_reference(rewards, values, mask, gamma, lam):
    """Per-row loop over the row's completion tokens, the textbook recursion."""
    advantages = torch.zeros_like(values, dtype=torch.float64)
    for row in range(values.shape[0]):
        columns = [t for t in range(values.shape[1]) if mask[row, t] > 0]
        running = 0.0
        for position in reversed(range(len(columns))):
            t = columns[position]
            next_value = (
                values[row, columns[position + 1]].item() if position + 1 < len(columns) else 0.0
            )
            delta = rewards[row, t].item() + gamma * next_value - values[row, t].item()
            running = delta + gamma * lam * running
            advantages[row, t] = running
    returns = (advantages + values.double()) * mask
    return advantages, returns


def test_gae_hand_worked_single_row():
    # two completion tokens, gamma 1, lam 1: A = return - V
    rewards = torch.tensor([[0.0, 0.0, 1.0, 0.0]])
    values = torch.tensor([[9.0, 0.5, 0.25, 9.0]])
    mask = torch.tensor([[0.0, 1.0, 1.0, 0.0]])
    advantages, returns = gae(rewards, values, mask, gamma=1.0, lam=1.0)
    close(advantages, [[0, 0.5, 0.75, 0]])
    close(returns, [[0, 1.0, 1.0, 0]])
    # gamma .5, lam 0: A_t = r_t + .5 V_{t+1} - V_t
    advantages, _ = gae(rewards, values, mask, gamma=0.5, lam=0.0)
    close(advantages, [[0, 0.0 + 0.5 * 0.25 - 0.5, 1.0 - 0.25, 0]])


def test_gae_matches_per_row_loop_on_ragged_masks():
    generator = torch.Generator().manual_seed(0)
    rows, length = 7, 11
    rewards = torch.randn(rows, length, generator=generator)
    values = torch.randn(rows, length, generator=generator)
    starts = torch.randint(0, 4, (rows,), generator=generator)
    ends = torch.randint(4, length + 1, (rows,), generator=generator)
    columns = torch.arange(length)
    mask = ((columns >= starts[:, None]) & (columns < ends[:, None])).float()
    mask[0, 5] = 0.0  # a hole inside a completion is skipped
    mask[1] = 0.0  # an empty completion
    for gamma, lam in [(1.0, 0.95), (0.9, 0.5), (0.99, 1.0)]:
        advantages, returns = gae(rewards, values, mask, gamma, lam)
        expected_adv, expected_ret = gae_reference(rewards, values, mask, gamma, lam)
        torch.testing.assert_close(advantages.double(), expected_adv, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(returns.double(), expected_ret, atol=1e-5, rtol=1e-5)
    assert torch.equal(advantages[1], torch.zeros(length))
    assert advantages[0, 5] == 0.0


def test_every_registered_estimator_does_what_its_facts_say():
    """run.json records each estimator's registered facts and grpo analyze judges by them:
    outcome credit gives every token of a rollout the same advantage (per-token credit does
    not have to), and a zero-sum group's advantages sum to zero in every group."""
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0], [1, 1, 1, 1], [1, 0, 0, 0]], dtype=torch.float32)
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0])
    step_index = (mask.cumsum(1) - 1).clamp(min=0).long() // 2 * (mask > 0) - (mask == 0).long()
    token_rewards = outcome_on_last_token(rewards, mask) + 0.5 * (step_index == 0) * mask
    values = torch.linspace(-1, 1, 16).reshape(4, 4) * mask
    for name, estimator in ESTIMATORS.items():
        kind = estimator.credit
        assert kind in ("outcome", "per_token"), name
        advantages, _ = estimator.compute(
            token_rewards if estimator.needs_step_rewards else outcome_on_last_token(rewards, mask),
            mask, 2, AlgorithmConfig(), outcome_rewards=rewards, values=values,
            step_index=step_index, token_probs=TokenProbs(-values.abs() * mask, 0.3 * mask),
        )
        on = mask > 0
        spread = (advantages.masked_fill(~on, -1e9).max(1).values
                  - advantages.masked_fill(~on, 1e9).min(1).values)  # [N]
        if kind == "outcome":
            assert torch.equal(spread, torch.zeros(4)), name
        else:
            assert spread.max() > 0, name
        if estimator.zero_sum_group:  # one advantage per rollout, c (r_i - group mean), c > 0
            per_rollout = advantages[:, 0].double().reshape(2, 2)  # [B, R]
            centred = rewards.double().reshape(2, 2) - rewards.double().reshape(2, 2).mean(1, keepdim=True)
            torch.testing.assert_close(per_rollout.sum(1), torch.zeros(2, dtype=torch.float64))
            assert ((per_rollout * centred) > 0).all(), name


# --- otb (verl's Optimal Token Baseline) ----------------------------------------------------------


def otb_reference(token_rewards, mask, logprobs, sum_sq, group_size, zero_tail=True):
    """B_t = sum_i G_it W_it / (sum_i W_it + 1e-8) over a group's rows active at t, one loop per
    group and column (verl's definition, written out)."""
    rows, length = mask.shape
    advantages = torch.zeros(rows, length, dtype=torch.float64)
    for start in range(0, rows, group_size):
        group = range(start, start + group_size)
        to_go, energy = {}, {}
        for i in group:
            running = 0.0
            for t in range(length):
                if mask[i, t]:
                    running += 1 - 2 * math.exp(logprobs[i, t]) + float(sum_sq[i, t])
                energy[i, t] = running
                to_go[i, t] = sum(float(token_rewards[i, u] * mask[i, u]) for u in range(t, length))
        lengths = sorted(float(mask[i].sum()) for i in group)
        for t in range(length):
            active = [i for i in group if mask[i, t]]
            top = sum(to_go[i, t] * energy[i, t] for i in active)
            bottom = sum(energy[i, t] for i in active) + 1e-8
            for i in active:
                baseline = top / bottom if group_size > 1 else 0.0
                position = float(mask[i, : t + 1].sum())
                if (zero_tail and group_size > 1 and float(mask[i].sum()) == lengths[-1]
                        and lengths[-1] > lengths[-2] and position > lengths[-2]):
                    baseline = 0.0
                advantages[i, t] = to_go[i, t] - baseline
    return advantages


def run_otb(token_rewards, mask, logprobs, sum_sq, group_size, zero_tail=True):
    cfg = AlgorithmConfig(name="otb", otb_zero_tail=zero_tail)
    advantages, returns = get_estimator("otb").compute(
        token_rewards, mask, group_size, cfg, outcome_rewards=token_rewards.sum(1),
        token_probs=TokenProbs(logprobs, sum_sq),
    )
    assert returns is None and advantages.dtype == torch.float32
    return advantages


def test_otb_hand_worked_pair():
    """Rollout a (2 tokens, reward 1) and b (1 token, reward 0), pi = 1/2 and sum pi^2 = 1/2 on
    every token, so each token adds 1 - 1 + 1/2 = 1/2: W_a = [.5, 1], W_b = [.5], G_a = [1, 1],
    G_b = [0]. B_0 = (1 * .5 + 0 * .5) / 1 = .5; at t = 1 only a is active, and a is the one
    longest rollout: baseline 0 with the zero tail (A = 1), its own G otherwise (A = 0)."""
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0]])
    rewards = outcome_on_last_token(torch.tensor([1.0, 0.0]), mask)
    logprobs = torch.full((2, 2), math.log(0.5)) * mask
    sum_sq = torch.full((2, 2), 0.5) * mask
    close(run_otb(rewards, mask, logprobs, sum_sq, 2), [[0.5, 1.0], [-0.5, 0.0]])
    close(run_otb(rewards, mask, logprobs, sum_sq, 2, zero_tail=False), [[0.5, 0.0], [-0.5, 0.0]])


def test_otb_equal_energies_give_the_active_rows_mean():
    """With the same W_t on every row, B_t is the mean of G_t over the rows still generating:
    four rollouts of one length get r_i - mean r on every token (dr_grpo), up to the 1e-8."""
    mask = torch.ones(4, 3)
    outcomes = torch.tensor([1.0, 0.0, 0.0, 1.0])
    rewards = outcome_on_last_token(outcomes, mask)
    advantages = run_otb(rewards, mask, torch.full((4, 3), -0.7), torch.full((4, 3), 0.4), 4)
    close(advantages, (outcomes - outcomes.mean())[:, None].expand(4, 3), atol=1e-6)


def test_otb_matches_the_written_out_definition_on_ragged_groups():
    torch.manual_seed(0)
    group_size, groups, prompt, length = 3, 2, 2, 7
    rows = group_size * groups
    lengths = [5, 3, 2, 4, 4, 1]  # group 0 has one longest rollout, group 1 a tie
    mask = torch.zeros(rows, length)
    for row, n in enumerate(lengths):
        mask[row, prompt : prompt + n] = 1
    token_rewards = torch.randn(rows, length) * mask  # token-level rewards: G_t varies along rows
    logprobs = -torch.rand(rows, length) * 3 * mask
    sum_sq = (logprobs.exp() ** 2 + torch.rand(rows, length) * 0.3) * mask
    for zero_tail in (True, False):
        expected = otb_reference(token_rewards, mask, logprobs, sum_sq, group_size, zero_tail)
        got = run_otb(token_rewards, mask, logprobs, sum_sq, group_size, zero_tail)
        torch.testing.assert_close(got.double(), expected, atol=1e-5, rtol=1e-5)
    one = run_otb(token_rewards, mask, logprobs, sum_sq, 1)  # R = 1: no baseline, A_t = G_t
    torch.testing.assert_close(one.double(), otb_reference(token_rewards, mask, logprobs, sum_sq, 1))
    assert one[0, prompt] == pytest.approx(float(token_rewards[0].sum()), abs=1e-5)
