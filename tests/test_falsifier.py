"""Claim 4's deciding reading (grpo_cli/analysis/falsifier.py) on constructed sweeps whose answer
is known: per-token credit that only adds zero-advantage rows grows the batch matrix but must
read "not raised" (contradicted); credit that adds directions must read "raised" (supported);
the same rollouts probed under two estimators are compared group by group."""

from __future__ import annotations

import json

import pandas as pd
import pytest
from results_factory import write_run

from grpo_cli.analysis.claims import falsifier_claim
from grpo_cli.analysis.credit_compare import same_rows_table
from grpo_cli.analysis.grouping import group_runs
from grpo_cli.analysis.load import load_runs
from grpo_cli.analysis.rules import Rules

SEEDS = (0, 1, 2)
SIZES = (2, 4, 8)
STEPS = (0, 5, 10, 15)


def _ranks(informative: float, zero_groups: int, batch: float, nonzero: int, seed: int,
           size: int, problem_steps=(2, 2)) -> pd.DataFrame:
    """ranks.csv rows: two informative groups of rollout_group at `informative` (+ seed noise),
    `zero_groups` zero-variance groups (minority 0) at rank 4, and one rollout_batch row."""
    noise = 0.03 * (seed - 1)
    rows = []
    for step in STEPS:
        groups = [(f"g{b}", 1, problem_steps[b], min(informative + noise + 0.1 * b, size))
                  for b in range(2)]
        groups += [(f"g{2 + b}", 0, 2, 4.0) for b in range(zero_groups)]
        for group, minority, steps, value in groups:
            rows.append({"step": step, "matrix": "rollout_group", "layer": "", "group": group,
                         "minority": minority, "problem_steps": steps, "erank_entropy": value})
        rows.append({"step": step, "matrix": "rollout_batch", "layer": "", "group": "all",
                     "n_nonzero_rows": nonzero * size,
                     "erank_entropy": (batch + noise) * size})
    return pd.DataFrame(rows)


def _sweep(root, per_token: dict, estimator: str = "ppo", problem_steps=(2, 2)) -> list:
    """grpo: informative groups at 2.2, batch 0.5 a row over 4R non-zero rows; the per-token
    estimator as `per_token` says (_ranks' keywords). Both sides see the same problems (a
    step's prompts depend on the seed and step only)."""
    sides = {"grpo": {"informative": 2.2, "zero_groups": 0, "batch": 2.0, "nonzero": 4},
             estimator: per_token}
    sides = {name: spec | {"problem_steps": problem_steps} for name, spec in sides.items()}
    for name, spec in sides.items():
        for size in SIZES:
            for seed in SEEDS:
                run = write_run(root, group_size=size, seed=seed, estimator=name,
                                matrices=("rollout_group", "rollout_batch"))
                _ranks(**spec, seed=seed, size=size).to_csv(run / "ranks.csv", index=False)
    runs = load_runs([root])
    group_runs(runs)
    return runs


def test_only_zero_advantage_rows_read_not_raised(tmp_path):
    """ppo's critic gives two zero-variance groups rows: the batch matrix doubles its non-zero
    rows and its rank (+2R), per non-zero row nothing changes, and the informative groups are
    grpo's: the deciding reading is contradicted at every judged R, R=2 capped."""
    runs = _sweep(tmp_path, {"informative": 2.2, "zero_groups": 2, "batch": 4.0, "nonzero": 8})
    claim = falsifier_claim(runs, Rules())
    assert claim.verdict == "contradicted"
    by_r = {row["R"]: row for row in claim.table.to_dict("records")}
    assert by_r[2]["verdict"] == "not judged"
    for size in (4, 8):
        assert by_r[size]["verdict"] == "contradicted"
        assert by_r[size]["difference"] == pytest.approx(0.0, abs=1e-9)
    assert "rollout_group, multi-step problems" in by_r[4]["reading"]
    # the side reading sees the batch matrix grow, and nothing per non-zero row
    side = claim.parts[-1]  # shown after the deciding parts, not in the verdict
    assert side.name == "4s" and side.verdict == "contrast" and "Side reading, rollout_batch" in side.sentence
    assert "Side reading, rollout_batch" in claim.evidence
    assert "R=4 +8.00" in claim.evidence and "R=8 +16.00" in claim.evidence
    per_row = claim.evidence.split("per non-zero row: ")[1]
    assert all(f"R={r} +0.000 [" in per_row for r in SIZES)


def test_added_directions_read_raised(tmp_path):
    """Per-token credit that raises the informative groups' rank by 1.3 (to 3.5): supported."""
    runs = _sweep(tmp_path, {"informative": 3.5, "zero_groups": 0, "batch": 3.5, "nonzero": 4})
    claim = falsifier_claim(runs, Rules())
    assert claim.verdict == "supported"
    judged = claim.table[claim.table["R"] > 2]
    assert (judged["verdict"] == "supported").all()
    assert judged["difference"].to_numpy() == pytest.approx([1.3, 1.3])
    assert (judged["difference low"] > 0.5).all()


def test_one_step_problems_are_left_out_on_both_sides(tmp_path):
    """process raises the rank only on one-step problems' groups (where its credit is uniform,
    so the values here are a planted error): on multi-step problems, the deciding rows, it
    reads not raised; the selection is the same for every estimator, not process's own."""
    runs = _sweep(tmp_path, {"informative": 2.2, "zero_groups": 0, "batch": 2.0, "nonzero": 4},
                  estimator="process", problem_steps=(2, 1))
    for run in runs:  # plant: process's one-step group g1 reads 4.0
        if run.config["algorithm.name"] == "process":
            ranks = run.ranks
            ranks.loc[(ranks["group"] == "g1"), "erank_entropy"] = 4.0
    claim = falsifier_claim(runs, Rules())
    judged = claim.table[claim.table["R"] > 2]
    assert claim.verdict == "contradicted"
    assert judged["difference"].to_numpy() == pytest.approx([0.0, 0.0], abs=1e-9)


def test_same_rollouts_probed_under_two_estimators_are_paired(tmp_path):
    """`grpo probe` of one checkpoint under grpo and process (the same rollouts): the
    per-token minus outcome difference is read group by group; process's groups sit 1.0 above
    grpo's, so the paired difference is 1.0 with no spread and the part is supported."""
    for name, lift in (("grpo", 0.0), ("process", 1.0)):
        for size in (4, 8):
            run = write_run(tmp_path, group_size=size, seed=0, estimator=name,
                            matrices=("rollout_group",))
            rows = [{"step": 40, "matrix": "rollout_group", "layer": "", "group": f"g{b}",
                     "minority": 1, "problem_steps": 2, "erank_entropy": 2.0 + 0.2 * b + lift}
                    for b in range(6)]
            pd.DataFrame(rows).to_csv(run / "ranks.csv", index=False)
            info = json.loads((run / "run.json").read_text())
            info |= {"kind": "probe", "probe": {"source": "runs/R8-s0"}}
            (run / "run.json").write_text(json.dumps(info))
    runs = load_runs([tmp_path])
    group_runs(runs)
    claim = falsifier_claim(runs, Rules())
    probe = claim.table[claim.table["reading"].str.contains("same rollouts")]
    assert list(probe["R"]) == [4, 8]
    assert probe["difference"].to_numpy() == pytest.approx([1.0, 1.0])
    assert (probe["verdict"] == "supported").all() and claim.verdict == "supported"


def test_claim4_figure_draws_the_deciding_reading(tmp_path):
    """claim4.png reads the claim's table: both ranks and the difference per judged R."""
    from grpo_cli.analysis.plots_claims import claim4_figure
    from grpo_cli.analysis.style import Styles

    runs = _sweep(tmp_path, {"informative": 3.5, "zero_groups": 0, "batch": 3.5, "nonzero": 4})
    claim = falsifier_claim(runs, Rules())
    variants = sorted({run.variant for run in runs})
    figure = claim4_figure(claim.table, Rules(), Styles(variants), "toy")
    ranks, differences = figure.axes[:2]
    # the difference line: R = 4, 8 (R = 2 capped, not drawn) at +1.3
    assert list(differences.lines[-1].get_xdata()) == [4, 8]
    assert list(differences.lines[-1].get_ydata()) == pytest.approx([1.3, 1.3])
    drawn = [list(line.get_ydata()) for line in ranks.lines if list(line.get_xdata()) == [4, 8]]
    # outcome (2.2 and 2.3 over the two groups) and per-token (3.5, 3.6) ranks at R = 4, 8
    assert drawn == [pytest.approx([2.25, 2.25]), pytest.approx([3.55, 3.55])]


def test_a_shared_same_rows_table_reads_as_claim_4s_own(tmp_path):
    """`grpo analyze` builds one same-rows table for every measure it reads and hands claim 4
    that table: the claim reads exactly as from the table of its own measure."""
    runs = _sweep(tmp_path, {"informative": 3.5, "zero_groups": 0, "batch": 3.5, "nonzero": 4})
    for run in runs:  # another measure, listed first in the shared table
        run.ranks = run.ranks.assign(participation_ratio=run.ranks["erank_entropy"] + 1.0)
    shared = same_rows_table(runs, ["participation_ratio", "erank_entropy"], Rules())
    assert set(shared["measure"]) > {"erank_entropy", "erank_entropy per non-zero row"}
    alone, given = falsifier_claim(runs, Rules()), falsifier_claim(runs, Rules(), shared)
    assert alone.verdict == "supported"
    assert given.verdict == alone.verdict and given.evidence == alone.evidence
    pd.testing.assert_frame_equal(given.table, alone.table)


def _t(estimate: float, se: float, df: int, n: int):
    import numpy as np

    from grpo_cli.analysis import bootstrap as bs

    return bs.t_interval(estimate, se, df, n, 0.9, np.random.default_rng(0), 200)


def test_a_part_reads_below_only_at_the_bonferroni_level_over_its_two_intervals():
    """Difference 0.04 with se 0.15 on 3 df: its 90% interval ends at 0.04 + 2.3534 x 0.15 =
    0.393 < 0.5, its 95% one at 0.04 + 3.1824 x 0.15 = 0.517 > 0.5: inconclusive, and the
    sentence says why. With se 0.1 the 95% one ends at 0.358: contradicted, naming it."""
    from grpo_cli.analysis.falsifier import judge_pair

    rules = Rules()
    outcome, per_token = _t(2.4, 0.1, 3, 4), _t(2.44, 0.1, 2, 3)  # per-token straddles 2.5
    part = judge_pair("process vs grpo at R=8", outcome, per_token, _t(0.04, 0.15, 3, 3), rules)
    assert part.verdict == "inconclusive"
    assert ("the difference is below 0.5 at 90% but not at 95%, the Bonferroni level over the two "
            "intervals; the per-token rank straddles 2.5") in part.sentence, part.sentence
    part = judge_pair("process vs grpo at R=8", outcome, per_token, _t(0.04, 0.1, 3, 3), rules)
    assert part.verdict == "contradicted"
    assert ("the difference [-0.28, +0.36] is wholly below 0.5 at 95%, the Bonferroni level over "
            "the two intervals") in part.sentence, part.sentence
