"""The probe runner on a real (tiny) model: derived Grams, group matrices, zero-variance groups."""

from __future__ import annotations

import math

import pytest
import torch
from conftest import outcome_advantages, tiny_llama

from grpo_cli.algorithm.scored import ScoredBatch
from grpo_cli.config.schema import AlgorithmConfig, ProbesConfig
from grpo_cli.measures import RANK_MEASURES
from grpo_cli.probes.capture import step_capture
from grpo_cli.probes.fused import per_rollout_advantage
from grpo_cli.probes.gram import per_rollout_grams
from grpo_cli.probes.runner import ProbeSuite
from grpo_cli.rollout.batch import RolloutBatch
from grpo_cli.train.step_data import StepOutput

GROUP_SIZE = 2


def tiny_model():
    return tiny_llama(vocab_size=24, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                      num_attention_heads=2, max_position_embeddings=32).double()


def padded_batch():
    """4 rollouts (2 groups of 2), left-padded prompts and right-padded unequal completions."""
    torch.manual_seed(1)
    ids = torch.randint(3, 24, (4, 9))
    attention = torch.ones_like(ids)
    completion = torch.zeros(4, 9)
    completion[:, 3:] = 1
    attention[0, 0] = 0  # a shorter prompt
    completion[1, 7:] = 0  # shorter completions
    attention[1, 7:] = 0
    completion[3, 5:] = 0
    attention[3, 5:] = 0
    return RolloutBatch(input_ids=ids, attention_mask=attention, completion_mask=completion,
                        sampler_logprobs=torch.zeros(4, 9), group_size=GROUP_SIZE, prompt_length=3)


def step_output(batch, rewards):
    from grpo_cli.algorithm.advantages import get_estimator, outcome_on_last_token

    mask = batch.completion_mask  # [N, L]
    advantages, _ = get_estimator("grpo").compute(
        outcome_on_last_token(rewards, mask), mask, GROUP_SIZE, AlgorithmConfig(),
        outcome_rewards=rewards,
    )
    weights = batch.completion_mask / batch.completion_mask.sum()
    scored = ScoredBatch(rewards=rewards, correct=rewards)
    return StepOutput(metrics={}, batch=batch, advantages=advantages.double(), scored=scored,
                      loss_weights=weights.double())


def test_derived_advantage_gram_equals_the_direct_one(tmp_path):
    model, batch = tiny_model(), padded_batch()
    output = step_output(batch, torch.tensor([1.0, 0.0, 0.0, 1.0]))
    suite = ProbeSuite(ProbesConfig(), model, tmp_path / "w0.pt")
    derived = suite.rollout_grams(0, batch, output.loss_weights, output.advantages, model)["advantage"]
    direct = per_rollout_grams(
        model, batch.input_ids, batch.attention_mask,
        {"k": -(output.loss_weights * output.advantages)}, suite.gram_params,
    )["k"].gram
    # log-softmax runs in float32 even for a float64 model, hence 1e-6 rather than 1e-12
    assert torch.allclose(derived, direct, rtol=1e-6, atol=1e-9 * direct.abs().max())


def test_zero_variance_groups_are_left_out_of_the_separate_pass(tmp_path):
    """Group 0 (rewards 1, 1) has zero advantages: its rows do not run, K_adv is zero there and
    its score block is NaN (read by no matrix); group 1's blocks equal a pass over every row."""
    model, batch = tiny_model(), padded_batch()
    output = step_output(batch, torch.tensor([1.0, 1.0, 0.0, 1.0]))
    suite = ProbeSuite(ProbesConfig(), model, tmp_path / "w0.pt")
    seen = []
    handle = model.register_forward_pre_hook(
        lambda module, args, kwargs: seen.append(kwargs["input_ids"].shape[0]), with_kwargs=True
    )
    try:
        grams = suite.rollout_grams(0, batch, output.loss_weights, output.advantages, model)
        every = per_rollout_grams(
            model, batch.input_ids, batch.attention_mask, {"k": output.loss_weights},
            suite.gram_params,
        )["k"].gram
    finally:
        handle.remove()
    assert seen == [2, 4]  # the probe ran group 1's two rows; the reference all four
    assert float(grams["advantage"][:2].abs().max()) == 0.0
    assert float(grams["advantage"][2:, 2:].abs().max()) > 0
    assert bool(grams["score_blocks"][0].isnan().all())
    assert torch.allclose(grams["score_blocks"][1], every[2:, 2:], rtol=1e-6, atol=1e-12)
    nothing = step_output(batch, torch.tensor([1.0, 1.0, 0.0, 0.0]))  # no informative group
    empty = suite.rollout_grams(0, batch, nothing.loss_weights, nothing.advantages, model)
    assert len(seen) == 2 and float(empty["advantage"].abs().max()) == 0.0


def test_grams_over_a_parameter_split_add_up_to_the_whole(tmp_path):
    """K = sum over parameters of each parameter's Gram: the shares the TRL callback's DDP
    processes compute (trl_distributed.parameter_share) sum to the single-process Grams."""
    from grpo_cli.integrations.trl_distributed import parameter_share

    model, batch = tiny_model(), padded_batch()
    output = step_output(batch, torch.tensor([1.0, 0.0, 0.0, 1.0]))
    suite = ProbeSuite(ProbesConfig(), model, tmp_path / "w0.pt")
    whole = suite.rollout_grams(0, batch, output.loss_weights, output.advantages, model)
    shares = [parameter_share(suite.gram_params, rank, 2) for rank in (0, 1)]
    assert shares[0] and shares[1] and not shares[0].keys() & shares[1].keys()
    parts = [suite.rollout_grams(0, batch, output.loss_weights, output.advantages, model, params=share)
             for share in shares]
    for key in ("advantage", "score_blocks"):
        total = parts[0][key] + parts[1][key]
        assert not torch.allclose(parts[0][key], whole[key])  # a share is not the whole
        assert torch.allclose(total, whole[key], rtol=1e-10, atol=1e-12 * whole[key].abs().max()), key


def test_per_rollout_advantage_detects_token_level_credit():
    mask = torch.tensor([[0.0, 1, 1], [0, 1, 0]])
    assert per_rollout_advantage(torch.tensor([[0.0, 2, 2], [0, -1, 0]]), mask).tolist() == [2, -1]
    assert per_rollout_advantage(torch.tensor([[0.0, 2, 1], [0, -1, 0]]), mask) is None


def test_group_matrices_r2_exact_spectra_and_zero_groups_no_nan(tmp_path):
    model, batch = tiny_model(), padded_batch()
    output = step_output(batch, torch.tensor([1.0, 0.0, 1.0, 1.0]))  # group 1 has zero variance
    suite = ProbeSuite(ProbesConfig(matrices=["rollout_group", "score_group", "rollout_batch",
                                                 "group_batch"]), model, tmp_path / "w0.pt")
    rows = suite.record(0, output, model)
    group_rows = [r for r in rows.ranks if r["matrix"] == "rollout_group"]
    per_group = [r for r in group_rows if r["group"].startswith("g")]
    assert [r["group"] for r in per_group] == ["g0"]  # the zero-variance group is not decomposed
    assert per_group[0]["minority"] == 1 and per_group[0]["majority"] == 1
    # two distinct rollouts with advantages (a, -a): full rank 2, and the advantage matrix's
    # spectrum is |a| times the score matrix's (K_adv = a^2 S K_score S with S = diag(1, -1))
    assert per_group[0]["numerical_rank"] == 2 and per_group[0]["distinct"] == 2
    score_g0 = next(r for r in rows.ranks if r["matrix"] == "score_group" and r["group"] == "g0")
    sigma = {
        matrix: sorted(s["sigma"] for s in rows.spectra if (s["matrix"], s["group"]) == (matrix, "g0"))
        for matrix in ("rollout_group", "score_group")
    }
    a = float(output.advantages[0, -1])  # rollout 0's advantage, on each of its tokens
    assert a > 0.9  # grpo on rewards (1, 0): (1 - 0.5) / (0.5 + 1e-6)
    assert sigma["rollout_group"] == pytest.approx([a * s for s in sigma["score_group"]], rel=1e-6)
    for measure in ("erank_entropy", "stable_rank", "participation_ratio"):
        assert per_group[0][measure] == pytest.approx(score_g0[measure], rel=1e-6), measure
    mean_row = next(r for r in group_rows if r["group"] == "mean")
    assert mean_row["n_zero_groups"] == 1
    for row in rows.ranks:
        for key, value in row.items():
            assert not (isinstance(value, float) and math.isnan(value) and key != "mean_abs_cosine"), key


def test_row_chunked_probe_matches_one_pass(tmp_path):
    """probes.gram_row_chunk = 3 over N = 4 rollouts: same Grams and spectra as one pass."""
    model, batch = tiny_model(), padded_batch()
    output = step_output(batch, torch.tensor([1.0, 0.0, 0.0, 1.0]))
    token_level = output.advantages * torch.linspace(0.5, 1.5, 9, dtype=torch.float64)  # [N, L]
    matrices = ["rollout_group", "score_group", "rollout_batch", "group_batch"]
    grams, spectra = {}, {}
    for row_chunk in (0, 3):
        cfg = ProbesConfig(matrices=matrices, gram_method="sketch", sketch_dim=64,
                             gram_row_chunk=row_chunk)
        suite = ProbeSuite(cfg, model, tmp_path / "w0.pt")
        # per-token advantages: two coefficient sets (advantage and score) through the chunks
        grams[row_chunk] = suite.rollout_grams(0, batch, output.loss_weights, token_level, model)
        spectra[row_chunk] = suite.record(0, output, model).spectra
    assert set(grams[3]) == {"advantage", "score_blocks", "param_diagonals"}
    for key, whole in grams[0].items():
        assert torch.allclose(grams[3][key], whole, rtol=1e-10, atol=0)
    assert [(r["matrix"], r["group"], r["k"]) for r in spectra[3]] == [
        (r["matrix"], r["group"], r["k"]) for r in spectra[0]
    ]
    sigma = {c: torch.tensor([r["sigma"] for r in spectra[c]]) for c in (0, 3)}
    assert torch.allclose(sigma[3], sigma[0], rtol=1e-9, atol=1e-12 * float(sigma[0].max()))


def test_consistency_check_runs_until_it_has_passed_once(tmp_path):
    """The hooks' check is structural: checked on the first probe, skipped once it passed, kept
    on while any parameter falls back to per-sample gradients."""
    model, batch = tiny_model(), padded_batch()
    output = step_output(batch, torch.tensor([1.0, 0.0, 0.0, 1.0]))
    suite = ProbeSuite(ProbesConfig(), model, tmp_path / "w0.pt")
    assert not suite.hooks_verified
    first = suite.rollout_grams(0, batch, output.loss_weights, output.advantages, model)["advantage"]
    assert suite.hooks_verified  # passed: the next probe runs without the check
    second = suite.rollout_grams(1, batch, output.loss_weights, output.advantages, model)["advantage"]
    torch.testing.assert_close(second, first, rtol=1e-12, atol=0)  # skipping it changes nothing

    # the final norm's weight also read outside its module's forward (a hook on the test's model):
    # the hooks miss that use, its check fails, it falls back, and the check stays on
    model.model.norm.register_forward_hook(lambda module, args, out: out * module.weight)
    suite = ProbeSuite(ProbesConfig(), model, tmp_path / "w1.pt")
    for step in range(2):
        with pytest.warns(UserWarning, match=r"hooks missed a use of \['model.norm.weight'\]"):
            suite.rollout_grams(step, batch, output.loss_weights, output.advantages, model)
        assert not suite.hooks_verified


def test_composition_predictions_only_where_their_assumptions_hold(tmp_path):
    """grpo: pred_* and pred_distinct_* written; a batch-mean baseline (reinforce): left empty."""
    from grpo_cli.algorithm.advantages import broadcast_to_tokens

    model, batch = tiny_model(), padded_batch()
    suite = ProbeSuite(ProbesConfig(matrices=["rollout_group"]), model, tmp_path / "w0.pt")
    rewards = torch.tensor([1.0, 0.0, 0.0, 0.0])
    rows = suite.record(0, step_output(batch, rewards), model).ranks
    g0 = next(r for r in rows if r["group"] == "g0")
    assert g0["pred_erank_entropy"] == 2.0  # m = M = 1: 2 sqrt(mM)
    # rows g_i = -a_i s_i with a = (c, -c): coherence (K11 + K22 - 2 K12) / (2 (K11 + K22)) of
    # the score Gram K, and the closed form at a zero-sum pair: (1 - cos) / 2
    output = step_output(batch, rewards)
    score = suite.rollout_grams(0, batch, output.loss_weights, output.advantages, model)["score_blocks"][0]
    k11, k22, k12 = float(score[0, 0]), float(score[1, 1]), float(score[0, 1])
    assert g0["coherence"] == pytest.approx((k11 + k22 - 2 * k12) / (2 * (k11 + k22)), rel=1e-6)
    assert g0["score_cosine"] == pytest.approx(k12 / math.sqrt(k11 * k22), rel=1e-6)
    assert g0["pred_coherence"] == pytest.approx((1 - g0["score_cosine"]) / 2, rel=1e-6)
    mean_row = next(r for r in rows if r["group"] == "mean")
    assert mean_row["coherence"] == pytest.approx(
        sum(r["coherence"] for r in rows if r["group"].startswith("g"))
        / sum(1 for r in rows if r["group"].startswith("g")))
    assert g0["distinct"] == 2 and g0["pred_distinct_numerical_rank"] == 2.0
    output = step_output(batch, rewards)
    output.advantages = broadcast_to_tokens(
        outcome_advantages("reinforce", rewards, GROUP_SIZE), batch.completion_mask
    )
    rows = suite.record(0, output, model).ranks
    per_group = [r for r in rows if r["group"].startswith("g")]
    assert [r["group"] for r in per_group] == ["g0", "g1"]  # both groups have advantages != 0
    assert all("pred_erank_entropy" not in r and "pred_distinct_erank_entropy" not in r
               for r in per_group)


def test_update_reads_fp32_masters_and_grad_sum_sums_raw_gradients(tmp_path):
    """bf16 weights with fp32 masters: `update` is master - W_0 (no rounding); `grad_sum` is the
    sum of the gradients handed to every step (closed form: the sum of the ones set here)."""
    from grpo_cli.algorithm.optim import MixedPrecisionAdamW

    model = tiny_model().to(torch.bfloat16)
    name = "model.layers.0.self_attn.q_proj.weight"
    weight = model.get_parameter(name)
    optimizer = MixedPrecisionAdamW(model.parameters(), lr=1e-6, master_params=[weight])
    suite = ProbeSuite(ProbesConfig(matrices=["update", "grad_sum"]), model, tmp_path / "w0.pt",
                       optimizer=optimizer)
    assert name not in suite.rounded_update_layers()
    assert "model.layers.0.self_attn.k_proj.weight" in suite.rounded_update_layers()
    torch.manual_seed(2)
    grad = torch.randn(16, 16).to(torch.bfloat16)
    grads = [grad, grad, grad]  # the same each step: Adam moves each weight by lr per step
    for grad in grads:
        for p in model.parameters():
            p.grad = grad.clone() if p is weight else torch.zeros_like(p)
        suite.accumulate_gradients()
        optimizer.step()
    expected = sum(g.float() for g in grads)
    assert suite.grad_sum[name].dtype == torch.float32
    torch.testing.assert_close(suite.grad_sum[name], expected)
    master = optimizer.master_weight(weight)
    assert master.dtype == torch.float32
    delta = master.double() - suite.initial[name].double()
    assert 2.9e-6 < delta.abs().min() and delta.abs().max() < 3.1e-6  # 3 Adam steps of lr
    rows = suite.record(5, None, model)
    by_matrix = {(row["matrix"], row["layer"]): row for row in rows.ranks}
    assert by_matrix[("grad_sum", name)]["n_rows"] == 16
    assert by_matrix[("update", name)]["n_rows"] == 16
    # every master entry moved by 3e-6; the bf16 weight (the master rounded to nearest) only
    # where 3e-6 reaches half its bf16 spacing, |w| <~ 2^8 x 3e-6: a few of 256 entries
    update = by_matrix[("update", name)]
    assert update["changed_frac_master"] == 1.0
    assert update["changed_frac"] == update["changed_frac_bf16"] < 0.2
    rounded = by_matrix[("update", "model.layers.0.self_attn.k_proj.weight")]
    assert math.isnan(rounded["changed_frac_master"]) and rounded["changed_frac"] == 0.0  # no grad
    assert math.isnan(rows.metrics["update_changed_frac_master"])  # some layers have no master
    assert 0 < rows.metrics["update_changed_frac"] <= 256 / sum(
        p.numel() for p in suite.layer_params.values())  # only q_proj moved
    grad_sigma = torch.linalg.svdvals(3 * grads[0].double())
    assert by_matrix[("grad_sum", name)]["top1_energy_share"] == pytest.approx(
        float(grad_sigma[0] ** 2 / (grad_sigma**2).sum()), rel=1e-4)
    restored = ProbeSuite(ProbesConfig(matrices=["grad_sum"]), model, tmp_path / "w1.pt")
    restored.load_state_dict(suite.state_dict())
    assert torch.equal(restored.grad_sum[name], suite.grad_sum[name])


def test_update_of_a_rank_one_change_to_some_entries(tmp_path):
    """fp32 weights, W_t - W_0 = u v^T on a 4 x 3 block of a 16 x 16 weight: top-1 energy share
    1, changed fraction 12/256 in the weights and in a bf16 copy (steps of 0.5 survive bf16's
    rounding), no masters."""
    model = tiny_model().float()
    name = "model.layers.0.mlp.gate_proj.weight"  # [32, 16]
    suite = ProbeSuite(ProbesConfig(matrices=["update"]), model, tmp_path / "w0.pt")
    weight = model.get_parameter(name)
    with torch.no_grad():
        weight[:4, :3] += torch.outer(torch.tensor([1.0, 2.0, -1.0, 0.5]), torch.tensor([0.5, 1.0, 2.0]))
    rows = suite.record(1, None, model)
    row = next(r for r in rows.ranks if r["matrix"] == "update" and r["layer"] == name)
    assert row["top1_energy_share"] == pytest.approx(1.0)
    assert row["changed_frac"] == row["changed_frac_bf16"] == 12 / weight.numel()
    assert math.isnan(row["changed_frac_master"])
    others = [r for r in rows.ranks if r["matrix"] == "update" and r["layer"] != name]
    assert others and all(r["changed_frac"] == 0.0 and r["top1_energy_share"] == 0.0 for r in others)
    total = sum(p.numel() for p in suite.layer_params.values())
    assert rows.metrics["update_changed_frac"] == pytest.approx(12 / total)


def test_the_step_hook_adds_every_pass_to_grad_sum_and_captures_only_on_probe_steps(tmp_path):
    """One hook between trainer and probes (StepCapture): off probe steps it captures nothing
    but still adds the pass's gradient to grad_sum; without grad_sum such a step has no hook."""
    model = tiny_model()
    name = "model.layers.0.self_attn.q_proj.weight"
    for p in model.parameters():
        p.grad = torch.ones_like(p) if p is model.get_parameter(name) else torch.zeros_like(p)
    suite = ProbeSuite(ProbesConfig(matrices=["layer", "grad_sum"]), model, tmp_path / "w0.pt")
    quiet = step_capture(suite, 1, model, probe=False)
    assert not quiet.training_pass
    assert quiet.before_update(None, None, None, fused=False) == ({}, {})
    quiet.after_backward()
    quiet.after_backward()  # a second pass (num_iterations = 2) adds its gradient too
    torch.testing.assert_close(suite.grad_sum[name], torch.full((16, 16), 2.0))
    probing = step_capture(suite, 2, model, probe=True)
    layer_grads, grams = probing.before_update(None, None, None, fused=False)
    assert torch.equal(layer_grads[name], torch.ones(16, 16, dtype=torch.float64)) and grams == {}
    quiet_off = ProbeSuite(ProbesConfig(matrices=["layer"], sparsity_every=0, changed_every=0), model,
                           tmp_path / "w1.pt")  # nothing asked: no sparsity, no step-to-step change
    assert step_capture(quiet_off, 1, model, probe=False) is None


def test_off_probe_steps_measure_the_gradients_sparsity_in_closed_form(tmp_path):
    """probes.sparsity_every=2: steps 0, 2, 4 ... measure grad_sparsity / grad_hoyer off probe
    steps (claim 3's points), the others ask nothing. One 16 x 16 weight of ones among zeros: a
    fraction 1 - 256/n is below the threshold, and Hoyer's measure is (sqrt(n) - 256/16) / (sqrt(n) - 1)."""
    model = tiny_model()
    name = "model.layers.0.self_attn.q_proj.weight"
    for p in model.parameters():
        p.grad = torch.ones_like(p) if p is model.get_parameter(name) else torch.zeros_like(p)
    n = sum(p.numel() for p in model.parameters())
    suite = ProbeSuite(ProbesConfig(matrices=["layer"], sparsity_every=2, changed_every=0), model,
                       tmp_path / "w0.pt")  # changed_every=0: odd steps ask nothing at all
    assert step_capture(suite, 3, model, probe=False) is None
    capture = step_capture(suite, 4, model, probe=False)
    assert capture.before_update(None, None, None, fused=False) == ({}, {})
    assert capture.metrics["grad_sparsity"] == pytest.approx(1 - 256 / n, abs=1e-12)
    assert capture.metrics["grad_hoyer"] == pytest.approx((math.sqrt(n) - 16) / (math.sqrt(n) - 1), abs=1e-12)


def test_non_zero_rows_same_groups_for_the_score_control_and_problem_steps(tmp_path):
    """Group 0 informative, group 1 zero-variance: rollout_batch has 2 non-zero rows of 4,
    group_batch 1 of 2, score_group covers group 0 only (as rollout_group does), and each group
    row names its problem's number of checked steps."""
    model, batch = tiny_model(), padded_batch()
    batch.problem_indices = [3, 1]
    output = step_output(batch, torch.tensor([1.0, 0.0, 1.0, 1.0]))
    matrices = ["rollout_group", "score_group", "rollout_batch", "group_batch"]
    suite = ProbeSuite(ProbesConfig(matrices=matrices), model, tmp_path / "w0.pt",
                       problem_steps=[1, 1, 1, 2])
    rows = suite.record(0, output, model).ranks
    by_key = {(r["matrix"], r["group"]): r for r in rows}
    assert by_key[("rollout_batch", "all")]["n_nonzero_rows"] == 2
    assert by_key[("group_batch", "all")]["n_nonzero_rows"] == 1
    for matrix in ("rollout_group", "score_group"):
        assert [g for m, g in by_key if m == matrix and g.startswith("g")] == ["g0"]
        assert by_key[(matrix, "g0")]["n_nonzero_rows"] == 2
        assert by_key[(matrix, "g0")]["problem_steps"] == 2  # problem 3
        assert by_key[(matrix, "mean")]["n_zero_groups"] == 1
        assert by_key[(matrix, "mean")]["n_nonzero_rows"] == 2.0


def test_non_zero_rows_count_rollouts_with_any_non_zero_token_advantage(tmp_path):
    """Per-token advantages: rollout 1 has none, rollout 0 one token's worth; group 1 all zero."""
    model, batch = tiny_model(), padded_batch()
    output = step_output(batch, torch.tensor([1.0, 0.0, 1.0, 1.0]))
    advantages = torch.zeros(4, 9, dtype=torch.float64)
    advantages[0, 4] = 0.5  # one completion token of rollout 0
    advantages[1, 0] = 7.0  # a prompt position of rollout 1: not a completion token
    output.advantages = advantages
    suite = ProbeSuite(ProbesConfig(matrices=["rollout_group", "rollout_batch"]), model,
                       tmp_path / "w0.pt")
    rows = {(r["matrix"], r["group"]): r for r in suite.record(0, output, model).ranks}
    assert rows[("rollout_batch", "all")]["n_nonzero_rows"] == 1
    assert rows[("rollout_group", "g0")]["n_nonzero_rows"] == 1
    assert rows[("rollout_group", "g0")]["numerical_rank"] == 1  # rank per non-zero row: 1
    assert ("rollout_group", "g1") not in rows


def gram_route_tolerance(shape) -> float:
    """How far the Gram route may move erank_entropy of a matrix [m, n] with one singular value
    above round-off (the rank-one update, whose float32 rounding leaves a tail of ~1e-8 sigma_1).

    G = A A^T (or A^T A) is formed and solved in float64 with eigenvalue error
    |d lambda| <= (m + n) eps64 sigma_1^2 (the product's m-term sums, then a backward-stable
    eigensolver), so each tail singular value sqrt(lambda) moves by up to d sigma_1,
    d = sqrt((m + n) eps64), 1.0e-7 at [32, 16]: the size of the tail itself. Each of the k - 1
    tail shares p_j = sigma_j / sum sigma (sum >= sigma_1) moves by <= d, and -p ln p by at
    most -d ln d (x ln x's modulus of continuity), sigma_1's share by their sum: the entropy by
    (k - 1) d (ln(1/d) + 1), 2.6e-5 at [32, 16]; exp(H) by as much (H ~ 1e-6). The other
    measures weigh sigma^2 (moved by d^2 ~ 1e-14) or count values above rank_rtol. rel 1e-9:
    full-rank spectra (grad_sum) move by (m + n) eps64 kappa^2 / 2 relative, kappa <= 137 on
    these seeded gradients: <= 1e-10, a few times that in the measures.
    """
    k = min(shape)
    d = math.sqrt(sum(shape) * torch.finfo(torch.float64).eps)
    return (k - 1) * d * (math.log(1 / d) + 1)


def test_layer_spectra_by_gram_and_by_svd_agree(tmp_path):
    """probes.layer_spectrum: the Gram route (the paper presets') and svdvals (the default) record
    the same layer, update and grad_sum measures (a rank-one update: numerical rank 1 either way;
    every rank measure within `gram_route_tolerance`). The power-law fit too: it reads only values
    above rank_rtol sigma_1, not the null tail's round-off, where the routes differ."""
    rows = {}
    for method in ("gram", "svd"):
        model = tiny_model().float()
        name = "model.layers.0.mlp.gate_proj.weight"  # [32, 16]
        suite = ProbeSuite(ProbesConfig(matrices=["update", "grad_sum"], layer_spectrum=method), model,
                           tmp_path / f"{method}.pt")
        weight = model.get_parameter(name)
        with torch.no_grad():
            weight += torch.outer(torch.linspace(-1, 1, 32), torch.linspace(0.5, 2, 16))
        generator = torch.Generator().manual_seed(3)
        for p in model.parameters():
            p.grad = torch.randn(p.shape, generator=generator)
        suite.accumulate_gradients()
        rows[method] = {(r["matrix"], r["layer"]): r for r in suite.record(1, None, model).ranks}
    assert rows["gram"].keys() == rows["svd"].keys()
    assert rows["gram"][("update", name)]["numerical_rank"] == rows["svd"][("update", name)]["numerical_rank"] == 1
    # each route ran (the setting is read): their round-off differs in the update's null tail
    assert rows["gram"][("update", name)]["erank_entropy"] != rows["svd"][("update", name)]["erank_entropy"]
    for key, by_svd in rows["svd"].items():
        shape = tuple(model.get_parameter(key[1]).shape)
        tail = gram_route_tolerance(shape) if key[0] == "update" else 0.0  # grad_sum: no null tail
        for measure in RANK_MEASURES:
            assert rows["gram"][key][measure] == pytest.approx(by_svd[measure], rel=1e-9, abs=tail,
                                                               nan_ok=True), (key, measure)
        assert rows["gram"][key]["powerlaw_alpha"] == pytest.approx(by_svd["powerlaw_alpha"], rel=1e-9,
                                                                    nan_ok=True), key
    fitted = [row["powerlaw_alpha"] for row in rows["svd"].values() if not math.isnan(row["powerlaw_alpha"])]
    assert len(fitted) == sum(matrix == "grad_sum" for matrix, _ in rows["svd"])  # full-rank random gradients
    assert math.isnan(rows["svd"][("update", name)]["powerlaw_alpha"])  # rank one: nothing above the cut to fit
