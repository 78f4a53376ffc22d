"""Running per-problem success rates and the per-prompt zero-variance expectation."""

from __future__ import annotations

import pytest

from grpo_cli.algorithm.scored import (
    expected_zero_variance_fraction,
    mean_expected_zero_variance_fraction,
)
from grpo_cli.train.problem_success import ProblemSuccess


def test_unseen_problems_get_the_batch_rate_so_both_expectations_agree():
    tracker = ProblemSuccess()
    rates = tracker.estimate([3, 9], batch_rate=0.25)
    assert rates == [0.25, 0.25]
    assert mean_expected_zero_variance_fraction(rates, 4) == expected_zero_variance_fraction(0.25, 4)


def test_estimate_uses_earlier_steps_only_shrunk_to_the_batch_rate():
    tracker = ProblemSuccess(prior_rollouts=4)
    tracker.update([1, 2], [[1, 1, 1, 1], [0, 0, 0, 0]])
    # problem 1: (4 + 4 * 0.5) / (4 + 4) = 0.75; problem 2: (0 + 2) / 8 = 0.25
    rates = tracker.estimate([1, 2], batch_rate=0.5)
    assert rates == pytest.approx([0.75, 0.25])
    # one easy and one hard problem: more all-equal groups expected than the batch rate says
    per_prompt = mean_expected_zero_variance_fraction(rates, 4)
    assert per_prompt == pytest.approx(0.75**4 + 0.25**4)
    assert per_prompt > expected_zero_variance_fraction(0.5, 4)
    tracker.update([1], [[0, 0, 0, 0]])
    assert tracker.estimate([1], batch_rate=0.5) == pytest.approx([6 / 12])


def test_state_round_trip_and_bad_input():
    tracker = ProblemSuccess(prior_rollouts=2)
    tracker.update([5], [[1, 0]])
    restored = ProblemSuccess()
    restored.load_state_dict(tracker.state_dict())
    assert restored.estimate([5, 6], 0.3) == tracker.estimate([5, 6], 0.3)
    with pytest.raises(ValueError, match="2 problems but 1 groups"):
        tracker.update([1, 2], [[1, 0]])
    with pytest.raises(ValueError, match="prior_rollouts"):
        ProblemSuccess(prior_rollouts=0)
