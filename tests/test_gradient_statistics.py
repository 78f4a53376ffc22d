"""Gradient statistics read off the per-rollout Gram (grpo_cli/measures.py, ProbeSuite): closed
forms, unbiasedness by simulation, and the probe's columns against per-rollout autograd in float64
on a tiny model, with the batch-norm alarm on a planted partial (one-of-two-shards) norm."""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
import torch
from conftest import tiny_llama
from test_probe_runner import padded_batch, step_output

from grpo_cli.algorithm.logprobs import token_logprobs
from grpo_cli.config.schema import ProbesConfig
from grpo_cli.measures import (
    batch_gradient_norm,
    gradient_noise,
    gradient_snr,
    group_abs_cosine,
    noise_scale,
    norm_summary,
    norms_disagree,
    rollout_gradient_norms,
)
from grpo_cli.probes.runner import ProbeSuite
from grpo_cli.results.rows import PROBE_METRICS
from grpo_cli.results.writer import METRIC_COLUMNS


# ---- closed forms --------------------------------------------------------------------------------
def test_identical_rows_have_no_noise():
    g = np.array([[1.0, 2.0, 2.0]] * 4)  # four copies of one gradient, norm 3
    gram = g @ g.T
    assert gradient_noise(gram) == pytest.approx((4 * 4 * 9.0, 0.0))  # |N g|^2, no variance
    assert noise_scale(gram) == 0.0
    assert gradient_snr(gram) == math.inf
    assert rollout_gradient_norms(gram) == pytest.approx([3.0] * 4)
    assert batch_gradient_norm(gram) == pytest.approx(12.0)


def test_orthogonal_rows_of_equal_norm_are_pure_noise():
    n, c = 5, 2.0
    gram = c * np.eye(n)
    signal, noise = gradient_noise(gram)
    assert signal == pytest.approx(0.0, abs=1e-12)
    assert noise == pytest.approx(n * n * c)  # x_i = N g_i: N^2 c each, mean ~ 0
    assert math.isnan(noise_scale(gram))  # no resolved signal
    assert gradient_snr(gram) == pytest.approx(0.0, abs=1e-12)
    assert batch_gradient_norm(gram) == pytest.approx(math.sqrt(n * c))


def test_row_weights_scale_the_rows():
    g = np.array([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])
    w = np.array([0.5, 2.0, -1.0])
    assert batch_gradient_norm(g @ g.T, w) == pytest.approx(np.linalg.norm(w @ g))
    assert gradient_noise(g @ g.T, w) == pytest.approx(gradient_noise((w[:, None] * g) @ (w[:, None] * g).T))


def test_norm_summary_and_the_snr_noise_scale_identity():
    summary = norm_summary([1.0, 2.0, 6.0])
    assert summary == pytest.approx({"mean": 3.0, "median": 2.0, "min": 1.0, "max": 6.0,
                                     "cv": np.std([1.0, 2.0, 6.0]) / 3.0})
    assert all(math.isnan(v) for v in norm_summary([]).values())
    g = np.random.default_rng(0).normal(size=(6, 4)) + 1.0
    assert gradient_snr(g @ g.T) == pytest.approx(6 / noise_scale(g @ g.T))


def test_noise_estimates_are_unbiased():
    """x_i ~ N(mu, diag(s^2)) iid: the mean over 4000 batches of |G|^2 and tr Sigma is within 4
    standard errors of |mu|^2 and sum s^2 (and the plug-in |mean x|^2 is not: it is off by tr/N)."""
    rng = np.random.default_rng(1)
    mu, s = np.array([1.0, -0.5, 0.25]), np.array([1.0, 2.0, 0.5])
    n, draws = 4, 4000
    x = mu + s * rng.normal(size=(draws, n, 3))  # [draws, N, 3] per-example gradients
    g = x / n  # rows whose sum is the batch mean
    estimates = np.array([gradient_noise(gi @ gi.T) for gi in g])  # [draws, 2]
    mean, se = estimates.mean(0), estimates.std(0, ddof=1) / math.sqrt(draws)
    truth = np.array([mu @ mu, (s**2).sum()])
    assert np.all(np.abs(mean - truth) < 4 * se), (mean, truth, se)
    plug_in = np.mean([np.linalg.norm(xi.mean(0)) ** 2 for xi in x])
    assert abs(plug_in - truth[0] - truth[1] / n) < 4 * se[0]
    assert abs(plug_in - truth[0]) > 10 * se[0]


def test_the_alarm_fires_on_a_partial_shard_norm_only():
    full = 3.7
    assert not norms_disagree(full, full * (1 + 1e-6), 1e-4)  # round-off
    assert norms_disagree(full, full / math.sqrt(2), 1e-4)  # one of two shards
    assert norms_disagree(full, full / math.sqrt(2), 5e-2)  # ... also at bf16's tolerance
    assert not norms_disagree(full, math.nan, 1e-4)


def test_the_columns_are_metrics_columns_the_probes_fill():
    names = ("grad_norm_rollout_mean", "grad_norm_batch_gram", "grad_norm_probed", "grad_norm_mismatch",
             "grad_noise_scale", "grad_noise_scale_groups", "grad_snr")
    assert set(names) <= set(METRIC_COLUMNS) and set(names) <= set(PROBE_METRICS)
    assert "grad_norm" not in PROBE_METRICS  # the trainer's own, every step


# ---- against per-rollout autograd in float64 -----------------------------------------------------
def autograd_rows(model, batch, coeff, params) -> np.ndarray:  # [N, P] float64
    """g_i = grad of f_i = sum_t coeff_it log p(y_it), one rollout at a time on its own."""
    rows = []
    for i in range(batch.num_rollouts):
        logprobs = token_logprobs(model, batch.input_ids[i : i + 1], batch.attention_mask[i : i + 1])
        objective = (coeff[i : i + 1] * logprobs).sum()
        grads = torch.autograd.grad(objective, list(params.values()), allow_unused=True)
        rows.append(torch.cat([(torch.zeros_like(p) if g is None else g).reshape(-1)
                               for g, p in zip(grads, params.values(), strict=True)]))
    return torch.stack(rows).double().numpy()


@pytest.fixture(scope="module")
def probed(tmp_path_factory):
    model = tiny_llama(vocab_size=24, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                       num_attention_heads=2, max_position_embeddings=32).double()
    batch = padded_batch()
    output = step_output(batch, torch.tensor([1.0, 0.0, 1.0, 1.0]))  # group 1 has zero variance
    suite = ProbeSuite(ProbesConfig(matrices=["rollout_batch"]), model,
                       tmp_path_factory.mktemp("probe") / "w0.pt")
    g = autograd_rows(model, batch, -(output.loss_weights * output.advantages), suite.gram_params)
    return model, batch, output, suite, g


def record(probed, planted_scale: float = 1.0, rtol: float | None = 1e-4):
    """Record one probe step whose trainer gradient is the rows' sum times `planted_scale`."""
    model, _, output, suite, g = probed
    total = torch.from_numpy(g.sum(0))
    start = 0
    for p in suite.gram_params.values():  # what the trainer's backward would leave in .grad
        p.grad = (planted_scale * total[start : start + p.numel()]).reshape(p.shape).to(p.dtype)
        start += p.numel()
    suite.capture_layer_grads()
    output.row_sum_rtol = rtol
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            rows = suite.record(0, output, model)
    finally:
        for p in suite.gram_params.values():
            p.grad = None
    return rows, [str(w.message) for w in caught]


def test_probe_columns_equal_per_rollout_autograd(probed):
    _, batch, output, suite, g = probed
    rows, caught = record(probed)
    m = rows.metrics
    norms = np.linalg.norm(g, axis=1)  # [N]
    live = norms[:2]  # group 0 is informative, group 1 (rewards 1, 1) has zero advantages
    assert norms[2:] == pytest.approx([0.0, 0.0], abs=1e-12)
    assert m["grad_norm_rollout_mean"] == pytest.approx(live.mean(), rel=1e-6)
    assert m["grad_norm_rollout_max"] == pytest.approx(live.max(), rel=1e-6)
    assert m["grad_norm_rollout_min"] == pytest.approx(live.min(), rel=1e-6)
    assert m["grad_norm_rollout_cv"] == pytest.approx(live.std() / live.mean(), rel=1e-5)
    assert m["grad_norm_batch_gram"] == pytest.approx(np.linalg.norm(g.sum(0)), rel=1e-6)
    assert m["grad_norm_probed"] == pytest.approx(np.linalg.norm(g.sum(0)), rel=1e-12)
    assert m["grad_norm_mismatch"] == 0.0 and not caught
    # McCandlish's estimators straight from the per-example gradients x_i = N g_i
    n = g.shape[0]
    x = n * g
    trace = x.var(axis=0, ddof=1).sum()
    signal = np.linalg.norm(x.mean(0)) ** 2 - trace / n
    assert gradient_noise(g @ g.T) == pytest.approx((signal, trace), rel=1e-9)
    # a zero-sum group of two nearly cancels: the signal is below its sampling error here
    assert signal < 0 and math.isnan(m["grad_noise_scale"])
    assert m["grad_snr"] == pytest.approx(signal / (trace / n), rel=1e-5)
    # one example per prompt: each group's summed gradient. Group 1's is 0, so with B = 2 the
    # unbiased |G|^2 is exactly 0 (|mean|^2 = tr Sigma / B): no resolved signal
    groups = g.reshape(2, 2, -1).sum(1)  # [B, P]
    assert gradient_noise(groups @ groups.T)[0] == pytest.approx(0.0, abs=1e-9 * np.linalg.norm(groups) ** 2)
    assert math.isnan(m["grad_noise_scale_groups"])
    # the side file: every rollout, with its group, reward and advantage
    per_rollout = [r for r in rows.grad_norms if "rollout" in r]  # then the batch's rows
    every = [r for r in per_rollout if r["layer"] == "all"]  # every probed parameter
    assert [r["rollout"] for r in every] == [0, 1, 2, 3]
    assert [r["group"] for r in every] == [0, 0, 1, 1]
    assert [r["grad_norm"] for r in every] == pytest.approx(norms, rel=1e-6, abs=1e-12)
    assert [r["advantage"] for r in per_rollout][2:4] == [0.0, 0.0]
    # per layer: a transformer block's parameters together, each other parameter on its own
    layers = per_layer_squares(g, suite.gram_params)
    assert set(layers) == {"model.embed_tokens.weight", "model.layers.0", "model.norm.weight", "lm_head.weight"}
    recorded = {}
    for r in per_rollout[4:]:
        recorded.setdefault(r["layer"], []).append(r["grad_norm"])
    assert set(recorded) == set(layers)
    for layer, squares in layers.items():
        assert recorded[layer] == pytest.approx(np.sqrt(squares), rel=1e-6, abs=1e-12), layer


def per_layer_squares(g: np.ndarray, params: dict) -> dict[str, np.ndarray]:  # g [rows, P]
    """{layer: each row's squared norm over the layer} with layer_squares' layers, by hand: the
    one transformer block's parameters together, each other parameter on its own."""
    layers, start = {}, 0
    for name, p in params.items():
        key = name.split(".layers.0.")[0] + ".layers.0" if ".layers.0." in name else name
        layers[key] = layers.get(key, 0.0) + (g[:, start : start + p.numel()] ** 2).sum(1)
        start += p.numel()
    return layers


def test_batch_norm_per_layer_equals_float64_autograd(probed):
    """The trainer's backward of the whole batch's loss (one pass, float64) leaves G in .grad; the
    probe's per-layer batch norms are those of the per-rollout autograd rows' sum, layer by layer,
    with `all` = grad_norm_probed and the largest layer's share of ||G||^2 in metrics."""
    model, batch, output, suite, g = probed
    coeff = -(output.loss_weights * output.advantages)  # [N, L]
    try:
        (coeff * token_logprobs(model, batch.input_ids, batch.attention_mask)).sum().backward()
        suite.capture_layer_grads()
        rows = suite.record(0, output, model)
    finally:
        model.zero_grad(set_to_none=True)
    expected = {layer: float(square[0]) for layer, square in per_layer_squares(g.sum(0, keepdims=True),
                                                                                suite.gram_params).items()}
    total = sum(expected.values())
    assert total > 0 and len(expected) == 4
    batch_rows = [r for r in rows.grad_norms if "rollout" not in r]  # after the per-rollout rows
    assert [r["layer"] for r in batch_rows] == ["all", *expected]
    assert batch_rows[0]["grad_norm"] == pytest.approx(math.sqrt(total), rel=1e-9)
    assert batch_rows[0]["grad_norm"] == pytest.approx(rows.metrics["grad_norm_probed"], rel=1e-12)
    for r in batch_rows[1:]:
        assert r["grad_norm"] == pytest.approx(math.sqrt(expected[r["layer"]]), rel=1e-9), r["layer"]
    share = rows.metrics["grad_norm_layer_max_share"]
    assert share == pytest.approx(max(expected.values()) / total, rel=1e-9)
    assert 1 / len(expected) < share < 1  # no layer holds the whole gradient here
    assert "grad_norm_layer_max_share" in METRIC_COLUMNS and "grad_norm_layer_max_share" in PROBE_METRICS


def mccandlish_estimates(examples: np.ndarray) -> tuple[float, float]:  # [n, P]
    """(|G|^2, tr Sigma), McCandlish et al.'s unbiased estimators straight from the examples,
    whose mean is the batch gradient."""
    trace = examples.var(axis=0, ddof=1).sum()
    return np.linalg.norm(examples.mean(0)) ** 2 - trace / examples.shape[0], trace


def test_finite_noise_scales_equal_per_rollout_autograd(probed):
    """Both groups informative (rewards 1, 0 | 0, 1): the signal is resolved over rollouts and over
    prompts, so B_simple is a number in both units, not only the NaN of the test above."""
    model, batch, _, suite, _ = probed
    output = step_output(batch, torch.tensor([1.0, 0.0, 0.0, 1.0]))
    g = autograd_rows(model, batch, -(output.loss_weights * output.advantages), suite.gram_params)
    rows, caught = record((model, batch, output, suite, g))
    m = rows.metrics
    n = g.shape[0]
    signal, trace = mccandlish_estimates(n * g)  # x_i = N g_i
    assert signal > 0 and m["grad_noise_scale"] == pytest.approx(trace / signal, rel=1e-5)
    assert m["grad_snr"] == pytest.approx(n * signal / trace, rel=1e-5)
    groups = g.reshape(2, 2, -1).sum(1)  # [B, P]: each prompt's summed gradient is one example
    signal, trace = mccandlish_estimates(2 * groups)
    assert signal > 0 and m["grad_noise_scale_groups"] == pytest.approx(trace / signal, rel=1e-5)
    assert m["grad_norm_mismatch"] == 0.0 and not caught


def test_the_alarm_fires_on_a_planted_partial_norm(probed):
    rows, caught = record(probed, planted_scale=1 / math.sqrt(2))  # one of two shards' norm
    assert rows.metrics["grad_norm_mismatch"] == 1.0
    assert len(caught) == 1 and "ratio 0.7071" in caught[0]
    rows, caught = record(probed, planted_scale=1 / math.sqrt(2), rtol=None)  # not comparable
    assert math.isnan(rows.metrics["grad_norm_mismatch"]) and not caught
    assert rows.metrics["grad_norm_probed"] == pytest.approx(rows.metrics["grad_norm_batch_gram"] / math.sqrt(2))


# ---- grpo run ------------------------------------------------------------------------------------
def test_grpo_run_writes_the_columns_and_its_gradient_adds_up(tmp_path, cache_dir):
    """The smoke run probing one layer: the Gram's batch norm equals the trainer's norm over that
    layer (smaller than grad_norm over every parameter), no alarm; grad_norms.csv has every rollout."""
    import pandas as pd
    from cli_helpers import grpo_run

    result = grpo_run(tmp_path, cache_dir, "train.steps=1", "probes.param_regex=layers\\.0\\.")
    assert result.exit_code == 0, result.output
    (out,) = (tmp_path / "smoke").iterdir()
    row = pd.read_csv(out / "metrics.csv").iloc[0]
    assert row.grad_norm_mismatch == 0.0
    assert abs(row.grad_norm_batch_gram - row.grad_norm_probed) <= 1e-4 * row.grad_norm_probed
    assert 0 < row.grad_norm_probed < row.grad_norm
    assert row.grad_norm_rollout_min <= row.grad_norm_rollout_median <= row.grad_norm_rollout_max
    norms = pd.read_csv(out / "grad_norms.csv")
    assert set(norms.layer) == {"all", "model.layers.0"}  # the probed block, one layer
    batch = norms[norms.rollout.isna()]  # the trainer's batch gradient, per layer
    assert list(batch.layer) == ["all", "model.layers.0"] and batch.group.isna().all()
    assert batch.grad_norm.tolist() == pytest.approx([row.grad_norm_probed] * 2, rel=1e-12)
    assert row.grad_norm_layer_max_share == pytest.approx(1.0, abs=1e-12)  # one probed layer holds all of it
    norms = norms[norms.rollout.notna()]
    assert list(norms[norms.layer == "all"].rollout) == list(range(16))  # 4 prompts x R = 4
    assert np.allclose(norms[norms.layer == "all"].grad_norm, norms[norms.layer != "all"].grad_norm)
    norms = norms[norms.layer == "all"]
    live = norms[norms.advantage != 0].grad_norm
    assert live.mean() == pytest.approx(row.grad_norm_rollout_mean, rel=1e-9)


# ---- grpo analyze ----------------------------------------------------------------------------------
def test_gradients_figure_marks_the_steps_whose_norms_disagree():
    import pandas as pd

    from grpo_cli.analysis.plots_training import GRADIENTS, gradients_figure
    from grpo_cli.analysis.style import Styles

    steps = [0, 5, 10]
    rows = [{"metric": metric, "x": step, "step": step, "value": 1.0 + step, "group_size": 4,
             "variant": "grpo", "run_id": "r0"} for metric in GRADIENTS for step in steps]
    rows += [{"metric": "grad_norm_probed", "x": step, "step": step, "value": 1.0 + step, "group_size": 4,
              "variant": "grpo", "run_id": "r0"} for step in steps]
    rows += [{"metric": "grad_norm_mismatch", "x": step, "step": step, "value": float(step == 5),
              "group_size": 4, "variant": "grpo", "run_id": "r0"} for step in steps]
    figure = gradients_figure(pd.DataFrame(rows), Styles(["grpo"]), "toy", "step")
    panel = next(ax for ax in figure.axes if ax.get_title() == "grad_norm_batch_gram")
    (marks,) = [line for line in panel.lines if line.get_marker() == "x"]
    assert list(marks.get_xdata()) == [5] and list(marks.get_ydata()) == [6.0]
    assert sum(line.get_linestyle() == "--" for line in panel.lines) == 1  # the trainer's norm
    empty = gradients_figure(pd.DataFrame(columns=["metric", "x", "value"]), Styles(["grpo"]), "toy", "step")
    assert len(empty.axes) == 1  # one panel saying there is nothing to draw
    titles = {ax.get_title(): ax for ax in figure.axes}
    assert list(titles) == list(GRADIENTS)  # one panel each, the grid's spare one removed
    assert titles["grad_norm_rollout_median_times_n"].get_ylabel().startswith("N x")
    assert {name for name, ax in titles.items() if ax.get_yscale() == "log"} == {
        "grad_noise_scale_running_median", "grad_noise_scale_groups_running_median"}


def test_gradient_table_scales_norms_by_n_and_takes_running_medians_of_the_noise_scale(tmp_path):
    """N x the per-rollout median (N = R x prompts per step = 8); the noise scale's centred
    running median over 5 probe steps keeps a 22000 spike among values 2-6 off the drawn line."""
    import pandas as pd

    from grpo_cli.analysis.load import Run
    from grpo_cli.analysis.plots_training import GRADIENT_COLUMNS, GRADIENTS
    from grpo_cli.analysis.tables import gradient_table

    metrics = pd.DataFrame({"step": range(7), "grad_norm_rollout_median": [0.1] * 7,
                            "grad_noise_scale": [2.0, 3.0, 22000.0, 4.0, 5.0, math.nan, 6.0]})
    empty = pd.DataFrame()
    run = Run(tmp_path / "r0", "completed", None, {},
              {"rollout.group_size": 4, "rollout.prompts_per_step": 2}, metrics, empty, empty, empty, None)
    table = gradient_table([run], list(GRADIENT_COLUMNS))
    scaled = table[table.metric == "grad_norm_rollout_median_times_n"]
    assert scaled.value.tolist() == pytest.approx([0.8] * 7)
    median = table[table.metric == "grad_noise_scale_running_median"]
    assert median.step.tolist() == [0, 1, 2, 3, 4, 6]  # probe steps with a value
    assert median.value.tolist() == pytest.approx([3.0, 3.5, 4.0, 5.0, 5.5, 5.0])
    assert set(table.metric) & set(GRADIENTS) == {"grad_norm_rollout_median_times_n",
                                                   "grad_noise_scale_running_median"}
    unknown = Run(tmp_path / "r1", "completed", None, {}, {"rollout.group_size": 4}, metrics, empty,
                  empty, empty, None)  # no prompts_per_step: N unknown, nothing scaled
    assert not gradient_table([unknown], list(GRADIENT_COLUMNS)).metric.str.endswith("_times_n").any()


# ---- cross-prompt orthogonality (arXiv 2601.23135) and the top-k energy (SALT) -----------------
def group_cosines(g: np.ndarray, group_size: int) -> np.ndarray:  # g [N, P] -> |cos| of each pair
    sums = g.reshape(-1, group_size, g.shape[1]).sum(1)  # [B, P] each prompt's summed gradient
    unit = sums / np.linalg.norm(sums, axis=1, keepdims=True)
    cos = unit @ unit.T
    return np.abs(cos[np.triu_indices(len(sums), 1)])


def test_group_cosine_closed_forms():
    """Two prompts whose summed gradients are orthogonal read 0, parallel or opposed 1; the rows
    within a group need not be (each group here has two rows whose sum is the direction)."""
    e1, e2, e3 = np.eye(3)
    orthogonal = np.stack([e1 + e3, -e3, e2 - e3, e3])  # sums e1 and e2
    parallel = np.stack([e1 + e3, -e3, 2 * e1 + e2, -e2])  # sums e1 and 2 e1
    opposed = np.stack([e1 + e3, -e3, -e1 + e2, -e2])  # sums e1 and -e1
    assert group_abs_cosine(orthogonal @ orthogonal.T, 2) == 0.0
    assert group_abs_cosine(parallel @ parallel.T, 2) == pytest.approx(1.0, abs=4 * np.finfo(float).eps)
    assert group_abs_cosine(opposed @ opposed.T, 2) == pytest.approx(1.0, abs=4 * np.finfo(float).eps)
    three = np.stack([e1, e2, e1 + e2])  # one row per group: pairs 0, 1/sqrt 2, 1/sqrt 2
    assert group_abs_cosine(three @ three.T, 1) == pytest.approx((0 + 2 / math.sqrt(2)) / 3, rel=1e-15)


def test_group_cosine_leaves_out_zero_gradients():
    """A group with every advantage 0 has a zero summed gradient, and so does one whose rows
    cancel to round-off: neither has a direction, so both are left out; fewer than two left: NaN."""
    e1, e2 = np.eye(2)
    g = np.stack([e1, e1, e2, e2, 0 * e1, 0 * e1, e1 + 1e-9 * e2, -e1])  # groups e1, e2, 0, ~0
    assert group_abs_cosine(g @ g.T, 2) == 0.0  # the pair e1, e2 only (1e-18 << 64 eps32 R tr K_b)
    assert math.isnan(group_abs_cosine(g[:6] @ g[:6].T * 0, 2))  # a zero gradient throughout
    assert math.isnan(group_abs_cosine(g[2:6] @ g[2:6].T, 2))  # one direction: no pair
    assert math.isnan(group_abs_cosine(np.ones((2, 2)), 2))  # one group


def test_group_cosine_and_top_energy_equal_float64_autograd(probed):
    """On the float64 model, metrics.csv's grad_group_abs_cosine is |cos| of the two prompts'
    summed autograd rows, and rollout_batch's top-k energy shares are those of the rows' own
    singular values (numpy's SVD). The probe's log-softmax is float32 (gram.py), so each K_ij is
    good to ~eps32 |g_i| |g_j|: a cosine of group sums to ~3 R^2 eps32 tr K / min_b |G_b|^2, an
    energy share (eigenvalues off by <= N eps32 tr K) to 2 k N eps32."""
    model, batch, _, suite, _ = probed
    output = step_output(batch, torch.tensor([1.0, 0.0, 0.0, 1.0]))  # both groups informative
    g = autograd_rows(model, batch, -(output.loss_weights * output.advantages), suite.gram_params)
    rows, _ = record((model, batch, output, suite, g))
    (expected,) = group_cosines(g, 2)
    assert 0.01 < expected < 0.99  # neither orthogonal nor parallel: the test can tell
    eps32 = float(np.finfo(np.float32).eps)
    sums = g.reshape(2, 2, -1).sum(1)  # [B, P]
    bound = 3 * 2**2 * eps32 * (g**2).sum() / (sums**2).sum(1).min()
    assert rows.metrics["grad_group_abs_cosine"] == pytest.approx(expected, abs=bound)
    energy = np.linalg.svd(g, compute_uv=False) ** 2
    (row,) = [r for r in rows.ranks if r["matrix"] == "rollout_batch"]
    for k in (1, 2, 3):
        assert row[f"top{k}_energy_share"] == pytest.approx(energy[:k].sum() / energy.sum(),
                                                            abs=2 * k * len(g) * eps32)
    assert "grad_group_abs_cosine" in METRIC_COLUMNS and "grad_group_abs_cosine" in PROBE_METRICS


def test_group_cosine_is_empty_when_one_prompt_is_informative(probed):
    rows, _ = record(probed)  # group 1's rewards 1, 1: a zero summed gradient
    assert math.isnan(rows.metrics["grad_group_abs_cosine"])
