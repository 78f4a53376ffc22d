"""Claims 2 and 4 at matched diversity (grpo_cli/analysis/diversity.py), claim 4's bar where
distinct completions leave room for it (falsifier.judge_difference) and the layer gradient
beside claim 2 (layer_gradient.py), on hand-computed frames whose answers are closed forms."""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd
import pytest
from results_factory import LAYER_OFFSETS, write_run

from grpo_cli.analysis import bootstrap as bs
from grpo_cli.analysis import diversity, layer_gradient
from grpo_cli.analysis.claims import falsifier_claim
from grpo_cli.analysis.falsifier import judge_difference, judge_pair
from grpo_cli.analysis.grouping import group_runs
from grpo_cli.analysis.load import load_runs
from grpo_cli.analysis.rules import Rules
from grpo_cli.analysis.tables import LAYER_MEAN, rank_table

RULES = Rules()
# float64 round-off of a least-squares fit over ~100 rows of values ~10: far below 1e-12
EXACT = 1e-12


def _frame(slope: float, seeds=(0, 1, 2), effect=lambda d: 0.8 * d, level=lambda s: 0.1 * s):
    """Group rows whose rank is exactly level(seed) + slope log2 R + effect(distinct); a larger
    R samples more distinct completions (R=4: 2-3, R=8: 3-4, R=16: 4-5), so the raw slope
    carries the distinct completions' effect too."""
    rows = []
    for seed in seeds:
        for size, distincts in ((4, (2, 3)), (8, (3, 4)), (16, (4, 5))):
            for step in (10, 20):
                for g, d in enumerate(distincts * 2):
                    rows.append({"run_id": f"R{size}-s{seed}", "seed": seed, "group_size": size,
                                 "variant": "", "step": step, "group": f"g{g}", "distinct": d,
                                 "value": level(seed) + slope * math.log2(size) + effect(d),
                                 "predicted_distinct": 1.25 * d})
    return pd.DataFrame(rows)


def test_within_slope_recovers_the_slope_at_fixed_categories():
    """y = 1 + 0.3 x + c[k] exactly: the coefficient is 0.3 with no residual (se 0), and the
    df are n - categories - 1; x constant within each category leaves it unidentified."""
    x = np.array([0.0, 1.0, 2.0, 1.0, 2.0, 3.0])
    k = np.array([0, 0, 0, 1, 1, 1])
    y = 1 + 0.3 * x + np.where(k == 1, 5.0, -2.0)
    coefficient, se, df = diversity.within_slope(y, x, k)
    assert coefficient == pytest.approx(0.3, abs=EXACT) and se == pytest.approx(0.0, abs=EXACT)
    assert df == 6 - 2 - 1
    assert math.isnan(diversity.within_slope(y, k.astype(float), k)[0])


def test_slope_at_matched_diversity_is_the_slope_the_ranks_were_built_with():
    """Per seed the regression with distinct completions as categories returns the planted
    0.1 per doubling exactly (interval [0.1, 0.1]: no spread between seeds); without the
    control it is 0.1 + 0.8 (one more distinct completion per doubling): diversity."""
    reading = diversity.slope_readings(_frame(0.1), RULES, np.random.default_rng(0))
    assert reading.units == "seeds" and reading.judged == (4, 8, 16)
    assert reading.matched.estimate == pytest.approx(0.1, abs=EXACT)
    assert (reading.matched.low, reading.matched.high) == pytest.approx((0.1, 0.1), abs=EXACT)
    assert reading.raw.estimate == pytest.approx(0.9, abs=EXACT)
    assert diversity.growth_source(reading.raw, reading.matched, RULES) == diversity.DIVERSITY
    geometry = diversity.slope_readings(_frame(0.5), RULES, np.random.default_rng(0))
    assert diversity.growth_source(geometry.raw, geometry.matched, RULES) == diversity.GEOMETRY


def test_one_set_of_weights_takes_its_groups_as_units():
    """One seed of a `grpo probe`: the regression's own se over the groups; exact ranks give a
    zero-width interval at the planted slope, with n the number of group rows."""
    frame = _frame(0.2, seeds=(0,))
    reading = diversity.slope_readings(frame, RULES, np.random.default_rng(0), groups_are_units=True)
    assert reading.units == "groups" and reading.matched.n == len(frame)
    assert reading.matched.estimate == pytest.approx(0.2, abs=EXACT)
    # a training run's single seed has no interval: its groups share its weights
    assert not diversity.slope_readings(frame, RULES, np.random.default_rng(0)).matched.finite


def test_ranks_proportional_to_the_closed_form_read_a_constant_share():
    """rank = 0.76 x pred_distinct in every group: the share is 0.76 at every R and its slope
    per doubling 0."""
    frame = _frame(0.0)
    frame["value"] = 0.76 * frame["predicted_distinct"]
    share = diversity.closed_form_share(frame, RULES, np.random.default_rng(0))
    assert [r for r, _ in share.per_r] == [4, 8, 16]
    assert all(iv.estimate == pytest.approx(0.76, abs=EXACT) for _, iv in share.per_r)
    assert share.slope.estimate == pytest.approx(0.0, abs=EXACT)
    assert diversity.closed_form_share(frame.assign(predicted_distinct=np.nan), RULES,
                                       np.random.default_rng(0)) is None


def test_on_one_set_of_weights_the_share_takes_the_groups_as_units():
    """One `grpo probe` seed: the share per R is the mean over its groups (n = the group rows
    at that R), the slope the regression's own; both exact for ranks proportional to the
    closed form."""
    frame = _frame(0.0, seeds=(0,))
    frame["value"] = 0.76 * frame["predicted_distinct"]
    share = diversity.closed_form_share(frame, RULES, np.random.default_rng(0), groups_are_units=True)
    assert all(iv.estimate == pytest.approx(0.76, abs=EXACT) and iv.n == 8 for _, iv in share.per_r)
    assert share.slope.estimate == pytest.approx(0.0, abs=EXACT) and share.slope.n == len(frame)


def test_growth_source_reads_each_interval_against_the_tolerance():
    def iv(low, high):
        return bs.Interval((low + high) / 2, low, high, 4)

    assert diversity.growth_source(iv(0.7, 1.0), iv(-0.29, -0.15), RULES) == diversity.DIVERSITY
    assert diversity.growth_source(iv(0.7, 1.0), iv(0.3, 0.6), RULES) == diversity.GEOMETRY
    assert diversity.growth_source(iv(0.7, 1.0), iv(0.1, 0.4), RULES) == diversity.UNDECIDED
    assert diversity.growth_source(iv(-0.1, 0.2), iv(0.3, 0.6), RULES) == diversity.NO_GROWTH


def test_per_distinct_difference_is_the_planted_difference_per_completion():
    """per-token rank = outcome rank - 0.06 x distinct in every group: -0.06 per distinct
    completion, paired by seed (the same seeds on both sides); other seeds give Welch's."""
    outcome = _frame(0.1)
    outcome = outcome[outcome["group_size"] == 8]
    per_token = outcome.assign(value=outcome["value"] - 0.06 * outcome["distinct"])
    reading = diversity.per_distinct_difference(outcome, per_token, RULES, np.random.default_rng(0))
    assert reading.paired and reading.difference.estimate == pytest.approx(-0.06, abs=EXACT)
    assert reading.distinct_outcome == reading.distinct_per_token == pytest.approx(3.5)
    shifted = per_token.assign(seed=per_token["seed"] + 10)
    welch = diversity.per_distinct_difference(outcome, shifted, RULES, np.random.default_rng(0))
    assert not welch.paired and welch.difference.estimate == pytest.approx(-0.06, abs=EXACT)


def test_the_bar_is_judged_where_distinct_completions_leave_a_margin_above_it():
    """target + 2 margin: 3 at the defaults, 4 with a margin of 1."""
    assert not diversity.bar_reachable(2.99, RULES) and diversity.bar_reachable(3.0, RULES)
    assert not diversity.bar_reachable(3.9, Rules(margin=1.0))


def _t(estimate, se, df=3, n=4):
    return bs.t_interval(estimate, se, df, n, 0.9, np.random.default_rng(0), 200)


def test_a_pair_below_an_unreachable_bar_reads_its_difference_alone():
    """A per-token rank of 1.94 [1.75, 2.12] with 2.69 distinct completions per group: judge_pair
    contradicts it on the bar, which is out of reach there, so the part reads the difference
    alone, one interval at 90% (t_3 = 2.353): +0.30 +- 0.59 straddles 0.5 (inconclusive), -0.14
    +- 0.59 lies wholly below it (contradicted), +0.80 +- 0.12 above it (supported)."""
    outcome, per_token = _t(2.08, 0.05), _t(1.94, 0.077)
    assert judge_pair("R=4", outcome, per_token, _t(0.3, 0.25), RULES).verdict == "contradicted"
    part = judge_difference("R=4", outcome, per_token, _t(0.3, 0.25), 2.69, RULES)
    assert part.verdict == "inconclusive" and len(part.contradiction.tests) == 1
    assert "2.69 distinct completions" in part.sentence and "not judged here" in part.sentence
    below = judge_difference("R=4", outcome, per_token, _t(-0.14, 0.25), 2.69, RULES)
    assert below.verdict == "contradicted" and "wholly below 0.5" in below.sentence
    above = judge_difference("R=4", outcome, _t(2.7, 0.05), _t(0.8, 0.05), 2.69, RULES)
    assert above.verdict == "supported"


def test_layer_readings_pool_and_split_the_weights(tmp_path):
    """Every layer's rank is rank(R, seed, step) + its LAYER_OFFSETS entry (offsets average to
    0): the pooled reading is the mean over seeds of each run's window mean, each weight's is
    that plus its offset; the slope is the planted 0.2 per doubling."""
    def rank(size, seed, step):
        return 2.0 + 0.2 * math.log2(size) + 0.05 * seed

    for size in (4, 8, 16):
        for seed in (0, 1, 2):
            write_run(tmp_path, group_size=size, seed=seed, rank=rank, matrices=("layer",))
    runs = load_runs([tmp_path])
    group_runs(runs)
    ranks = rank_table(runs, ["stable_rank", "erank_entropy"])
    readings = layer_gradient.layer_readings(ranks, sorted({r.variant for r in runs}), RULES)
    pooled = [x for x in readings if x.pooled]
    assert [x.measure for x in pooled] == ["stable_rank", "erank_entropy"]
    for x in pooled:
        assert x.layer == LAYER_MEAN and x.slope.estimate == pytest.approx(0.2, abs=EXACT)
        assert dict(x.per_r)[16].estimate == pytest.approx(rank(16, 1, 0), abs=EXACT)
    low, high = layer_gradient.spread(readings, "stable_rank", 16)
    assert (low, high) == pytest.approx((rank(16, 1, 0) + min(LAYER_OFFSETS.values()),
                                         rank(16, 1, 0) + max(LAYER_OFFSETS.values())), abs=EXACT)


@pytest.mark.parametrize("distinct", [None, 2])
def test_probed_pairs_read_the_bar_only_where_distinct_completions_reach_it(tmp_path, distinct):
    """`grpo probe` of one checkpoint under grpo and process (the same rollouts): process sits
    0.7 above grpo's 1.6-1.7, so its rank (2.3-2.4) is below the bar 2.5 and the difference
    above the margin. Without distinct completions recorded the bar is judged (contradicted);
    with 2 per group it is out of reach and the difference alone reads supported."""
    for name, lift in (("grpo", 0.0), ("process", 0.7)):
        for size in (4, 8):
            run = write_run(tmp_path, group_size=size, seed=0, estimator=name,
                            matrices=("rollout_group",))
            rows = [{"step": 40, "matrix": "rollout_group", "layer": "", "group": f"g{b}",
                     "minority": 1, "problem_steps": 2, "erank_entropy": 1.6 + 0.02 * b + lift}
                    | ({} if distinct is None else {"distinct": distinct}) for b in range(6)]
            pd.DataFrame(rows).to_csv(run / "ranks.csv", index=False)
            info = json.loads((run / "run.json").read_text())
            info |= {"kind": "probe", "probe": {"source": "runs/R8-s0"}}
            (run / "run.json").write_text(json.dumps(info))
    runs = load_runs([tmp_path])
    group_runs(runs)
    table = falsifier_claim(runs, RULES).table
    assert list(table["R"]) == [4, 8]
    assert list(table["bar judged"]) == [distinct is None] * 2
    assert list(table["verdict"]) == ["contradicted" if distinct is None else "supported"] * 2


def test_claim_2_says_its_growth_is_diversity_when_it_is(tmp_path):
    """Training runs whose informative groups rank exactly 0.1 seed + 0.1 log2 R + 0.8 distinct
    (R = 4, 8, 16 sample 2-3, 3-4, 4-5 distinct completions): claim 2's raw growth is 0.9 per
    doubling, at matched diversity 0.1, so its matched-diversity sentence (2m, beside the
    verdict) and table read 'diversity'; the share of the closed form (1.25 distinct) is shown."""
    from grpo_cli.analysis.pipeline import analyze

    for size, distincts in ((4, (2, 3)), (8, (3, 4)), (16, (4, 5))):
        for seed in (0, 1, 2):
            run = write_run(tmp_path, group_size=size, seed=seed, matrices=("rollout_group",))
            rows = [{"step": step, "matrix": "rollout_group", "layer": "", "group": f"g{g}",
                     "minority": 1, "distinct": d, "pred_distinct_erank_entropy": 1.25 * d,
                     "erank_entropy": 0.1 * seed + 0.1 * math.log2(size) + 0.8 * d}
                    for step in (0, 5, 10, 15) for g, d in enumerate(distincts * 2)]
            pd.DataFrame(rows).to_csv(run / "ranks.csv", index=False)
    claim = analyze([tmp_path], figures=False, measure="erank_entropy").claims[1]
    [part] = [p for p in claim.parts if p.name == "2m"]
    assert "the growth with R is diversity" in part.sentence and part.sentence in claim.evidence
    assert "+0.90 [+0.90, +0.90] without control and +0.10 [+0.10, +0.10]" in part.sentence
    assert ("early in training (each run's first half of probe steps) +0.90 [+0.90, +0.90] "
            "without control and +0.10 [+0.10, +0.10] with it") in part.sentence
    row = claim.table.iloc[0]
    assert row["growth is"] == "diversity" and row["slope at matched diversity"] == "+0.10 [+0.10, +0.10]"
    assert row["verdict"] == "contradicted"  # the verdict reads the raw rank, as before


def test_per_group_rows_alone_are_averaged_into_the_mean_row():
    """ranks.csv with per-group rollout_group rows and no mean / median row (older files):
    tables.rank_table averages the groups per step (mean and median), not rows of NaN."""
    from grpo_cli.analysis.tables import _matrix_rows

    ranks = pd.DataFrame({"step": [0, 0, 5, 5], "matrix": "rollout_group", "layer": "",
                          "group": ["g0", "g1", "g0", "g1"], "erank_entropy": [2.0, 3.0, 4.0, 6.0]})
    rows = _matrix_rows(ranks, "rollout_group", ["erank_entropy"])
    mean = rows[rows["stat"] == "mean"].set_index("step")["erank_entropy"]
    assert mean.to_dict() == {0: 2.5, 5: 5.0} and len(rows) == 4


def test_early_is_each_runs_first_half_of_its_probe_steps():
    """4 probe steps: the first 2; 5: the first 2 (the middle one is late), per run."""
    frame = pd.DataFrame({"run_id": ["a"] * 8 + ["b"] * 5,
                          "step": [0, 0, 5, 5, 10, 10, 15, 15, 0, 5, 10, 15, 20]})
    first = diversity.early(frame)
    assert first.groupby("run_id")["step"].unique().map(list).to_dict() == {"a": [0, 5], "b": [0, 5]}
    assert len(first) == 6
