"""Claim 2's reading over R (grpo_cli/analysis/over_r.py) on closed-form cases."""

from __future__ import annotations

import math

import pytest

from grpo_cli.analysis.over_r import reading_over_r


def test_capped_and_missing_r_do_not_count():
    reading = reading_over_r({2: 1.0, 4: 2.2, 8: 2.6, 16: math.nan}, target=2.0)
    assert reading.judged == (4, 8) and reading.judged_text == "4,8"
    assert reading.slope == pytest.approx(0.4)  # one doubling from 4 to 8
    assert reading.max_deviation == pytest.approx(0.6)


def test_least_squares_slope_per_doubling():
    # rank = 2 + 0.25 log2(R) + noise that sums to zero against log2(R) - mean
    means = {4: 2.5 + 0.1, 8: 2.75 - 0.2, 16: 3.0 + 0.1}
    reading = reading_over_r(means, target=2.0)
    assert reading.slope == pytest.approx(0.25)
    assert reading.max_deviation == pytest.approx(1.1)


def test_nothing_to_judge_reads_nan():
    one = reading_over_r({2: 1.8, 4: 2.1}, target=2.0)
    assert one.judged == (4,) and math.isnan(one.slope) and one.max_deviation == pytest.approx(0.1)
    none = reading_over_r({2: 1.8}, target=2.0)
    assert none.judged == () and math.isnan(none.slope) and math.isnan(none.max_deviation)
