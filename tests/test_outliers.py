"""Issue 61: an outlying seed is detected and named, and claim 2 says its intervals rest on it
(analysis/outliers.py). Closed forms of the modified z-score; the rates are simulated in
tests/test_calibration.py."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from results_factory import write_sweep

from grpo_cli.analysis import outliers
from grpo_cli.analysis.rules import Rules

RULES = Rules()


def test_modified_z_closed_form():
    """[5.0, 5.2, 4.8, 1.0]: median 4.9, absolute deviations 0.1, 0.3, 0.1, 3.9, MAD 0.2, so the
    collapsed seed's z is 0.6745 x -3.9 / 0.2 = -13.15; the others within 1.01."""
    z = outliers.modified_z([5.0, 5.2, 4.8, 1.0])
    assert z == pytest.approx([0.33725, 1.01175, -0.33725, -13.15275])
    assert list(outliers.collapsed([5.0, 5.2, 4.8, 1.0], RULES)) == [False, False, False, True]
    assert not outliers.collapsed([5.0, 5.2, 4.8, 9.0], RULES).any()  # above: not a collapse


def test_a_zero_mad_needs_the_relative_fall_and_two_seeds_flag_nothing():
    assert outliers.modified_z([2.0, 2.0, 2.0, 1.5])[-1] == -math.inf
    assert list(outliers.collapsed([2.0, 2.0, 2.0, 1.5], RULES)) == [False, False, False, True]
    assert not outliers.collapsed([2.0, 2.0, 2.0, 1.9], RULES).any()  # 5% below: not 10%
    assert not outliers.collapsed([5.0, 1.0], RULES).any()  # 2 seeds: no median to stand on
    assert not outliers.collapsed([5.0, np.nan, 1.0], RULES).any()


def _collapsing_sweep(root):
    """grpo at R = 4, 8, 16, 4 seeds; seed 3 collapses: rank 1.5 against 2.4-2.6, and 1.2
    distinct completions a group against 0.34 R + 0.05 seed (metrics.csv distinct_completions):
    at R = 8 median 2.745, MAD 0.05, z = 0.6745 x -1.545 / 0.05 = -20.8."""
    def rank(size, seed, step):
        return 1.5 if seed == 3 else 2.4 + 0.05 * seed + 0.01 * step

    sweep = write_sweep(root, group_sizes=(4, 8, 16), seeds=(0, 1, 2, 3), rank=rank,
                        matrices=("rollout_group",))
    for path in sweep.iterdir():
        metrics = pd.read_csv(path / "metrics.csv")
        size, seed = int(path.name.split("-")[0][1:]), int(path.name.rsplit("s", 1)[1])
        metrics["distinct_completions"] = 1.2 if seed == 3 else 0.34 * size + 0.05 * seed
        metrics.to_csv(path / "metrics.csv", index=False)
    return sweep


def test_claim2_names_the_outlying_seed_and_reads_the_others(tmp_path):
    from grpo_cli.analysis.pipeline import analyze

    sweep = _collapsing_sweep(tmp_path / "sweep")
    result = analyze([sweep], figures=False)
    part = next(p for p in result.claims[1].parts if p.name == "2o")
    assert "seed 3 at R=8 (distinct_completions 1.20 against the 4 seeds' median 2.75, modified z -20.8)" in part.sentence
    assert "at R=4" not in part.sentence  # 1.20 against 1.36-1.51: z -2.5, not outlying
    assert "so they rest on it" in part.sentence
    assert "Without seed 3 (3 seeds that did not collapse)" in part.sentence
    assert part.sentence in result.claims[1].evidence
    assert "2o" not in result.claims[1].parts_text

