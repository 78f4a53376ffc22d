"""Issue 64's per-step readings that need no Gram: the output head's and embedding's share of
||g||^2 (probes/head_share.py), the weights one step changed (probes/step_change.py), the token
entropy by the advantage's sign and the distinct correct completions (probes/step_metrics.py,
probes/composition.py). Closed forms first, then the named failure modes, then `grpo run`'s
loop and `grpo analyze`'s table beside claim 3."""

from __future__ import annotations

import math

import pandas as pd
import pytest
import torch
from conftest import tiny_llama
from results_factory import write_run
from step_parity import setup_for

from grpo_cli.algorithm.scored import ScoredBatch
from grpo_cli.analysis.load import load_runs
from grpo_cli.analysis.pipeline import analyze
from grpo_cli.analysis.update_density import density_table
from grpo_cli.probes.composition import correct_distinct_mean, distinct_correct_per_group
from grpo_cli.probes.head_share import HEAD_SHARE_COLUMNS, head_gradient_squares, head_shares
from grpo_cli.probes.step_change import STEP_CHANGED_COLUMNS, StepChange
from grpo_cli.probes.step_metrics import ENTROPY_SIGN_COLUMNS, LossTotals, read_batch, step_metrics
from grpo_cli.rollout.batch import assemble_batch
from grpo_cli.train.loop import TrainingLoop

# float64 sums of exact squares (integers here), then sqrt and squaring back: a few ulps
F64 = 4 * 2.0**-52


def unit_gradients(model) -> int:
    """Every parameter's .grad all ones: ||g_p||^2 = its entry count; returns ||g||^2."""
    for p in model.parameters():
        p.grad = torch.ones_like(p)
    return sum(p.numel() for p in model.parameters())


def test_head_share_of_unit_gradients_is_the_head_entry_fraction():
    model = tiny_llama(tie_word_embeddings=False)
    total = unit_gradients(model)
    head, embedding = model.lm_head.weight.numel(), model.model.embed_tokens.weight.numel()
    shares = head_shares(head_gradient_squares(model).tolist(), math.sqrt(total))
    assert shares["grad_share_head"] == pytest.approx(head / total, rel=F64)
    assert shares["grad_share_embedding"] == pytest.approx(embedding / total, rel=F64)
    assert shares["grad_share_head_embedding"] == pytest.approx((head + embedding) / total, rel=F64)


def test_a_tied_head_is_counted_once_and_its_parts_are_empty():
    model = tiny_llama(tie_word_embeddings=True)
    assert model.lm_head.weight is model.model.embed_tokens.weight
    total = unit_gradients(model)  # named once in parameters()
    union, head, embedding = head_gradient_squares(model).tolist()
    assert union == model.lm_head.weight.numel()  # once, not twice
    assert math.isnan(head) and math.isnan(embedding)
    shares = head_shares([union, head, embedding], math.sqrt(total))
    assert shares["grad_share_head_embedding"] == pytest.approx(union / total, rel=F64)


def test_a_zero_gradient_leaves_every_share_empty():
    model = tiny_llama()
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    squares = head_gradient_squares(model).tolist()
    assert squares == [0.0, 0.0, 0.0]
    assert all(math.isnan(v) for v in head_shares(squares, 0.0).values())  # 0 / 0: NaN, not 0
    assert all(math.isnan(v) for v in head_shares(None, 1.0).values())  # not measured


class Masters:
    """What the probes read of an optimizer that keeps fp32 masters (algorithm/optim.py)."""

    def __init__(self, pairs):
        self.masters = {id(param): master for param, master in pairs}

    def keeps_master(self, param) -> bool:
        return id(param) in self.masters

    def master_weight(self, param):
        return self.masters[id(param)]


# at 1.0 bf16's spacing is 2^-7: a 2^-10 step rounds away, a 2^-6 step does not
BELOW, ABOVE = 2.0**-10, 2.0**-6


def nudge(weights: torch.Tensor) -> None:
    """Entries 0-2 move below half bf16's spacing, 3-4 above it, 5-7 not at all."""
    weights[:3] += BELOW
    weights[3:5] += ABOVE


def fractions_of(change: StepChange) -> dict[str, float]:
    return dict(zip(STEP_CHANGED_COLUMNS, change.after().tolist(), strict=True))


def test_fp32_weights_count_every_change_and_bf16_only_the_large_ones():
    weight = torch.ones(8)
    change = StepChange({"w": weight})
    change.before()
    nudge(weight)
    fractions = fractions_of(change)
    assert fractions["step_changed_frac"] == 5 / 8
    assert fractions["step_changed_frac_bf16"] == 2 / 8
    assert math.isnan(fractions["step_changed_frac_master"])  # no master


def test_bf16_weights_with_fp32_masters():
    master = torch.ones(8)
    weight = master.to(torch.bfloat16)
    change = StepChange({"w": weight}, Masters([(weight, master)]))
    change.before()
    nudge(master)
    weight.copy_(master)  # the bf16 copy of the master, rounded to nearest
    fractions = fractions_of(change)
    assert fractions == {"step_changed_frac": 2 / 8, "step_changed_frac_master": 5 / 8,
                         "step_changed_frac_bf16": 2 / 8}


def test_no_previous_weights_is_empty_and_an_unchanged_step_is_zero():
    weight = torch.ones(8)
    change = StepChange({"w": weight})
    assert all(math.isnan(v) for v in fractions_of(change).values())  # no `before`
    change.before()
    fractions = fractions_of(change)  # nothing moved
    assert fractions["step_changed_frac"] == 0.0 and fractions["step_changed_frac_bf16"] == 0.0
    assert all(math.isnan(v) for v in fractions_of(change).values())  # `after` takes the copy: a second is empty


# two groups of 2; group 1's rows hold the same tokens under different masks
COMPLETIONS = torch.tensor([[5, 6, 7], [5, 6, 7], [9, 9, 9], [9, 9, 9]])
MASK = torch.tensor([[1.0, 1, 1], [1, 1, 1], [1, 1, 1], [1, 0, 0]])


def test_distinct_correct_completions_by_hand():
    correct = torch.tensor([1.0, 1.0, 1.0, 1.0])
    assert distinct_correct_per_group(COMPLETIONS, MASK, correct, 2).tolist() == [1, 2]
    assert distinct_correct_per_group(COMPLETIONS, MASK, torch.tensor([1.0, 0, 0, 1]), 2).tolist() == [1, 1]
    # only groups with a correct rollout count: group 0 (one distinct) alone
    assert float(correct_distinct_mean(COMPLETIONS, MASK, torch.tensor([0.0, 1, 0, 0]), 2)) == 1.0
    assert math.isnan(float(correct_distinct_mean(COMPLETIONS, MASK, torch.zeros(4), 2)))  # none correct


def hand_readings(**given):
    batch = assemble_batch(torch.ones(4, 1, dtype=torch.long), torch.ones(4, 1, dtype=torch.long),
                           COMPLETIONS, MASK, torch.zeros(4, 3), group_size=2)
    correct = torch.tensor([1.0, 0.0, 1.0, 1.0])
    advantages = torch.zeros(4, 4)
    return read_batch(batch, ScoredBatch(rewards=correct, correct=correct), advantages,
                      torch.zeros(3, dtype=torch.float64), **given)


def test_entropy_split_and_shares_in_the_metrics_row():
    sums = torch.tensor([3.0, 2.0, 0.0, 2.0, 1.0, 0.0], dtype=torch.float64)  # no zero-advantage token
    squares = torch.tensor([2.0, 0.5, 1.5], dtype=torch.float64)
    readings = hand_readings(entropy_sums=sums, head_squares=squares)
    assert (readings.entropy_adv_positive, readings.entropy_adv_negative) == (1.5, 2.0)
    assert math.isnan(readings.entropy_adv_zero)  # no token: empty, not 0
    assert readings.distinct_correct == 1.5  # group 0: one correct; group 1: two distinct
    losses = LossTotals(loss=0.0, pg_loss=0.0, kl=math.nan, value_loss=math.nan, entropy=1.0, clip_frac=0.0)
    row = step_metrics(0, readings, losses, grad_norm=2.0)
    assert [row[c] for c in HEAD_SHARE_COLUMNS] == [0.5, 0.125, 0.375]
    assert all(math.isnan(v) for v in (step_metrics(0, readings, losses, grad_norm=0.0)[c]
                                       for c in HEAD_SHARE_COLUMNS))
    unmeasured = hand_readings()  # a trainer that gives neither
    assert all(math.isnan(getattr(unmeasured, c)) for c in ENTROPY_SIGN_COLUMNS)
    assert all(math.isnan(v) for v in unmeasured.head_squares)


def test_a_grpo_run_step_fills_every_reading(tmp_path):
    """Step 0's previous weights are W_0, so its step-to-step fraction is the since-start one;
    the entropy split's token-weighted mean is the step's entropy; the shares are of grad_norm^2."""
    setup = setup_for(tmp_path, "probes.every=1", "probes.matrices=[update]")
    loop = TrainingLoop(setup.cfg, setup)
    first = loop.run_step(0).output
    metrics = first.metrics
    for column in ("frac", "frac_bf16"):
        assert metrics[f"step_changed_{column}"] == metrics[f"update_changed_{column}"] > 0
    advantages, mask = first.advantages, first.batch.completion_mask > 0
    counts = [float(((sign) & mask).sum()) for sign in (advantages > 0, advantages < 0, advantages == 0)]
    split = [metrics[c] for c in ENTROPY_SIGN_COLUMNS]
    weighted = sum(count * value for count, value in zip(counts, split, strict=True) if count)
    # float32 token entropies summed per micro-batch in float32 for `entropy`, in float64 for the
    # split: T eps_32 relative, T <= 120 tokens here
    assert weighted / sum(counts) == pytest.approx(metrics["entropy"], rel=120 * 2.0**-24)
    union = metrics["grad_share_head_embedding"]
    assert 0 < union < 1
    if not math.isnan(metrics["grad_share_head"]):  # untied: the parts add up
        assert union == pytest.approx(metrics["grad_share_head"] + metrics["grad_share_embedding"], rel=F64)
    second = loop.run_step(1).output.metrics
    assert 0 < second["step_changed_frac"] <= 1  # since step 1's previous weights, not W_0


def test_changed_every_zero_and_a_probe_without_update_leave_it_empty(tmp_path):
    setup = setup_for(tmp_path, "probes.every=1", "probes.matrices=[update]", "probes.changed_every=0")
    metrics = TrainingLoop(setup.cfg, setup).run_step(0).output.metrics
    assert all(math.isnan(metrics[c]) for c in STEP_CHANGED_COLUMNS)
    setup = setup_for(tmp_path / "probe", "probes.every=1", "probes.matrices=[layer]")
    metrics = TrainingLoop(setup.cfg, setup).run_step(0, update=False).output.metrics  # grpo probe
    assert all(math.isnan(metrics[c]) for c in STEP_CHANGED_COLUMNS)


def with_step_readings(run, step_changed):
    metrics = pd.read_csv(run / "metrics.csv")
    metrics["step_changed_frac"] = [step_changed(step) for step in metrics.step]
    metrics["grad_share_head_embedding"] = 0.25
    metrics.to_csv(run / "metrics.csv", index=False)


def test_analyze_reads_the_update_density_beside_claim_3(tmp_path):
    root = tmp_path / "sweep"
    for seed in (0, 1):  # 20 steps: early = steps 0-9, late = 10-19
        with_step_readings(write_run(root, group_size=4, seed=seed, matrices=("rollout_group",)),
                           lambda step: 1.0 - 0.01 * step)
    write_run(root, group_size=8, seed=0, matrices=("rollout_group",))  # results from before them
    table = density_table(load_runs([root])).set_index(["group_size", "measure"])
    assert table.loc[(4, "step_changed_frac"), "early"] == pytest.approx(0.955)
    assert table.loc[(4, "step_changed_frac"), "late"] == pytest.approx(0.855)
    assert table.loc[(4, "step_changed_frac"), "runs"] == 2
    assert table.loc[(4, "grad_share_head_embedding"), "change"] == pytest.approx(0.0)
    # sparsity beside it: the factory writes it on probe steps 0, 5, 10, 15
    assert table.loc[(4, "grad_sparsity"), "early"] == pytest.approx(0.2 + 0.01 * 2.5)
    assert (8, "step_changed_frac") not in table.index
    details = analyze([root], measure="erank_entropy", figures=False).files["details_md"].read_text()
    assert "Beside claim 3: how dense each step's update is" in details
    assert "weights changed per step 0.955 -> 0.855" in details


def test_analyze_without_step_readings_has_no_such_section(tmp_path):
    root = tmp_path / "sweep"
    write_run(root, group_size=4, seed=0, matrices=("rollout_group",))
    assert density_table(load_runs([root])).empty
    details = analyze([root], measure="erank_entropy", figures=False).files["details_md"].read_text()
    assert "Beside claim 3" not in details
