"""Matched progress (grpo_cli/analysis/matching.py): matching is possible only where the R values'
ranges overlap, and matches nothing where every R reaches the same bins."""

from __future__ import annotations

import pandas as pd
import pytest

from grpo_cli.analysis import matching
from grpo_cli.analysis.rules import Rules
from grpo_cli.analysis.words_frames import matching_sentences


def frame(progress: dict[int, list[float]], ranks: dict[int, list[float]]) -> pd.DataFrame:
    rows = [{"variant": "", "group_size": size, "run_id": f"R{size}", "step": 5 * i,
             "progress": value, "rank": ranks[size][i]}
            for size, values in progress.items() for i, value in enumerate(values)]
    return pd.DataFrame(rows)


def test_overlapping_ranges_are_matched_where_they_overlap():
    # 2 bins over [1, 3]: R=4 reaches bins 0 and 1, R=8 bin 1 only
    data = frame({4: [1.0, 2.0], 8: [2.0, 3.0]}, {4: [2.0, 2.2], 8: [2.5, 2.7]})
    coverage = matching.coverage_table(data, "distinct_completions", bins=2, rules=Rules()).set_index("group_size")
    assert set(coverage["matching"]) == {"possible"}
    assert coverage["in common bins"].to_dict() == {4: 0.5, 8: 1.0}
    assert coverage.loc[4, "matched mean"] == pytest.approx(2.2)  # bin 1 only
    assert coverage.loc[8, "matched mean"] == pytest.approx(2.6)
    assert coverage.loc[4, "all-steps mean"] == pytest.approx(2.1)
    per_bin = matching.per_bin_table(data, "distinct_completions", bins=2, rules=Rules())
    assert per_bin["bin"].tolist() == ["2-3"]
    assert per_bin["slope / doubling"].iloc[0] == pytest.approx(0.4)  # 2.2 -> 2.6 in one doubling
    assert "moves by at most 0.10 from its all-steps mean" in matching_sentences(coverage.reset_index())[0]


def test_capped_r_does_not_decide_the_common_bins():
    # R=2 sits at 2 distinct completions, outside the range R=4 and R=8 share
    data = frame({2: [1.0, 1.0], 4: [3.0, 4.0], 8: [3.0, 4.0]},
                 {2: [1.5, 1.5], 4: [2.0, 2.2], 8: [2.5, 2.7]})
    coverage = matching.coverage_table(data, "distinct_completions", bins=3, rules=Rules()).set_index("group_size")
    assert set(coverage["matching"]) == {"reweights only"}
    assert coverage.loc[2, "in common bins"] == 0.0


def test_disjoint_ranges_say_no_matching_is_possible():
    data = frame({4: [1.0, 2.0], 8: [5.0, 6.0]}, {4: [2.0, 2.2], 8: [2.5, 2.7]})
    coverage = matching.coverage_table(data, "reward", bins=2, rules=Rules())
    assert set(coverage["matching"]) == {"not possible"}
    assert matching.per_bin_table(data, "reward", bins=2, rules=Rules()).empty
    assert "no matching is possible" in matching_sentences(coverage)[0]


def test_identical_ranges_say_the_matched_mean_is_a_reweighted_average():
    data = frame({4: [0.1, 0.5, 0.9], 8: [0.1, 0.5, 0.9]}, {4: [2.0, 2.0, 2.3], 8: [3.0, 2.0, 2.0]})
    coverage = matching.coverage_table(data, "reward", bins=3, rules=Rules())
    assert set(coverage["matching"]) == {"reweights only"}
    sentence = matching_sentences(coverage)[0]
    assert sentence.startswith("training reward (rolling mean of reward_mean): no matching is possible")
    assert "reweighted whole-run average" in sentence and "R=8: 2.33 matched vs 2.33" in sentence
    # one R's step outside the common range: 2 of 3 steps in common bins, below 90%
    shifted = frame({4: [0.1, 0.5, 0.9], 8: [0.5, 0.9, 1.3]}, {4: [2.0] * 3, 8: [3.0] * 3})
    assert set(matching.coverage_table(shifted, "reward", bins=3, rules=Rules())["matching"]) == {"possible"}
    per_bin = matching.per_bin_table(data, "reward", bins=3, rules=Rules())
    assert per_bin["slope / doubling"].tolist() == pytest.approx([1.0, 0.0, -0.3])
