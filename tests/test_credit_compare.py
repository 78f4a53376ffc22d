"""Claim 4 on claim 2's matrices and rows (grpo_cli/analysis/credit_compare.py), on constructed
ranks.csv rows whose answer is known: ppo's zero-variance groups and extra non-zero rows, and
process's one-step problems, must not enter the comparison."""

from __future__ import annotations

import pandas as pd
import pytest
from results_factory import write_run

from grpo_cli.analysis import credit_compare
from grpo_cli.analysis.load import load_runs
from grpo_cli.analysis.rules import Rules

STEPS = (0, 5, 10, 15)
# (group, minority, problem_steps, erank_entropy) per-group rows of rollout_group
GROUPS = {
    "grpo": [("g0", 1, 1, 2.0), ("g1", 2, 3, 2.4)],  # informative groups only, as the probe writes
    "ppo": [("g0", 1, 3, 2.5), ("g1", 2, 3, 2.9), ("g2", 0, 3, 4.0)],  # g2: equal rewards
    "process": [("g0", 1, 1, 2.0), ("g1", 1, 3, 3.0)],  # g0: a one-step problem
}
# rollout_batch: (erank_entropy, n_nonzero_rows)
BATCH = {"grpo": (6.0, 12), "ppo": (9.0, 24), "process": (7.0, 12)}


def ranks_rows(estimator: str, size: int) -> pd.DataFrame:
    rows = []
    for step in STEPS:
        for group, minority, steps, value in GROUPS[estimator]:
            rows.append({"step": step, "matrix": "rollout_group", "layer": "", "group": group,
                         "minority": minority, "problem_steps": steps, "n_nonzero_rows": size,
                         "erank_entropy": value + 0.1 * (size == 8)})
        # the aggregate row is what claim 2 reads; it averages every group, g2 included
        rows.append({"step": step, "matrix": "rollout_group", "layer": "", "group": "mean",
                     "erank_entropy": 99.0})
        value, nonzero = BATCH[estimator]
        rows.append({"step": step, "matrix": "rollout_batch", "layer": "", "group": "all",
                     "n_nonzero_rows": nonzero, "erank_entropy": value * size / 4})
    return pd.DataFrame(rows)


@pytest.fixture
def runs(tmp_path):
    for estimator in GROUPS:
        for size in (4, 8):
            run = write_run(tmp_path / "sweep", group_size=size, seed=0, estimator=estimator,
                            matrices=("rollout_batch",))
            ranks_rows(estimator, size).to_csv(run / "ranks.csv", index=False)
    loaded = load_runs([tmp_path / "sweep"])
    for run in loaded:
        run.variant = run.config["algorithm.name"]
    return loaded


def test_same_rows_leave_out_zero_variance_groups_and_one_step_problems(runs):
    table = credit_compare.same_rows_table(runs, ["erank_entropy"], Rules())
    group = table[(table["matrix"] == "rollout_group") & (table["group_size"] == 4)]
    informative = group[group["stat"] == "informative groups"].groupby("variant")["value"].mean()
    assert informative["grpo"] == pytest.approx(2.2)
    assert informative["ppo"] == pytest.approx(2.7)  # not (2.5 + 2.9 + 4.0) / 3: g2's rewards are equal
    multi_step = group[group["stat"] == "multi-step problems"].groupby("variant")["value"].mean()
    assert multi_step["process"] == pytest.approx(3.0)  # g0's problem has one checked step
    assert multi_step["grpo"] == pytest.approx(2.4)  # ... and so has grpo's g0
    batch = table[(table["matrix"] == "rollout_batch") & (table["group_size"] == 4)]
    per_row = batch[batch["measure"] == "erank_entropy per non-zero row"].groupby("variant")["value"].mean()
    assert per_row.to_dict() == pytest.approx({"grpo": 0.5, "ppo": 0.375, "process": 7 / 12})


def test_comparison_puts_outcome_rank_slope_and_difference_on_each_matrix(runs):
    table = credit_compare.comparison_table(runs, ["erank_entropy"], Rules(last_fraction=0.25))
    rows = {(r["matrix"], r["measure"], r["per-token"], r["rows"]): r
            for r in table.to_dict("records")}
    group = rows[("rollout_group", "erank_entropy", "ppo", "informative groups")]
    assert group["outcome rank"] == "R=4: 2.20, R=8: 2.30"
    assert group["outcome slope"] == pytest.approx(0.1)  # +0.1 from R=4 to R=8, one doubling
    assert group["difference"] == "R=4: +0.50, R=8: +0.50"
    assert group["reading"].startswith("per group")
    # every per-token estimator also on multi-step problems, on both sides (claim 4's rows):
    # grpo's g0 is a one-step problem, ppo's g2 a zero-variance group
    assert rows[("rollout_group", "erank_entropy", "ppo", "multi-step problems")][
        "mean difference"] == pytest.approx(0.3)
    process = rows[("rollout_group", "erank_entropy", "process", "multi-step problems")]
    assert process["mean difference"] == pytest.approx(0.6)
    assert process["reading"].endswith("multi-step problems")
    # on the batch matrix ppo reads +3 (R=4) and +6 (R=8) from its extra rows, but per
    # non-zero row it is lower: (9/24 - 6/12) * R/4
    batch = rows[("rollout_batch", "erank_entropy", "ppo", "all")]
    assert batch["difference"] == "R=4: +3.00, R=8: +6.00"
    per_row = rows[("rollout_batch", "erank_entropy per non-zero row", "ppo", "all")]
    assert per_row["difference"] == "R=4: -0.12, R=8: -0.25"
    assert per_row["mean difference"] == pytest.approx(-0.1875)
    assert {r["outcome"] for r in rows.values()} == {"grpo"}


def test_one_table_for_several_measures_holds_each_measures_own(runs):
    """`grpo analyze` builds the same-rows table once for every measure: one measure's rows of
    it are that measure's own table, in its order, and the comparison reads the same from it."""
    for run in runs:
        run.ranks = run.ranks.assign(participation_ratio=run.ranks["erank_entropy"] / 2)
    rules = Rules(last_fraction=0.25)
    both = credit_compare.same_rows_table(runs, ["participation_ratio", "erank_entropy"], rules)
    alone = credit_compare.same_rows_table(runs, ["erank_entropy"], rules)
    assert len(both) > len(alone) > 0
    picked = credit_compare.measure_rows(both, ["erank_entropy"]).reset_index(drop=True)
    pd.testing.assert_frame_equal(picked, alone)
    pd.testing.assert_frame_equal(credit_compare.comparison_table(runs, ["erank_entropy"], rules, both),
                                  credit_compare.comparison_table(runs, ["erank_entropy"], rules))


def test_no_comparison_without_both_kinds_of_estimator(runs):
    grpo_only = [run for run in runs if run.variant == "grpo"]
    assert credit_compare.comparison_table(grpo_only, ["erank_entropy"], Rules(last_fraction=0.25)).empty


def test_analyze_shows_the_table_in_the_claims_section(runs, tmp_path):
    from grpo_cli.analysis.pipeline import analyze

    result = analyze([tmp_path / "sweep"], measure="erank_entropy", figures=False)
    # (grpo vs ppo, process) x (rollout_group: informative, multi-step; rollout_batch: whole,
    # per non-zero row)
    assert len(result.credit_comparison) == 2 * 4
    summary = result.files["details_md"].read_text()
    claims_section = summary.split("## Runs")[0]
    assert "Claim 4 on claim 2's matrices" in claims_section
    assert "R=4: -0.12, R=8: -0.25" in claims_section
