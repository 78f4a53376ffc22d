"""Running per-problem success rates, for the per-prompt zero-variance expectation.

A group of R rollouts of one prompt has all-equal binary rewards with probability
p_b^R + (1 - p_b)^R, p_b that prompt's success rate. Since this is convex in p, the value at the
batch success rate, p^R + (1 - p)^R, is a lower bound on the mean over prompts whenever
difficulty varies (Jensen): metrics.csv keeps it as `expected_zero_variance_frac_batch`.

Estimating p_b from the group's own R rollouts would be circular (an all-wrong group gives
p_b = 0 and "expects" exactly what it shows), so p_b comes from the problem's rollouts at earlier
steps only, shrunk towards the current batch success rate with the weight of
`prior_rollouts` pseudo-rollouts (a Beta prior):

    p_b = (successes_b + prior_rollouts * batch_rate) / (rollouts_b + prior_rollouts).

A problem never seen before gets the batch rate, so the per-prompt expectation equals the batch
value until problems recur (it departs from it as training revisits problems: small train sets,
long runs).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

PRIOR_ROLLOUTS = 4.0  # weight of the batch-rate prior, in rollouts


class ProblemSuccess:
    """Successes and rollouts per problem index, over the steps seen so far."""

    def __init__(self, prior_rollouts: float = PRIOR_ROLLOUTS) -> None:
        if prior_rollouts <= 0:
            raise ValueError(f"prior_rollouts must be > 0, got {prior_rollouts}")
        self.prior_rollouts = prior_rollouts
        self.counts: dict[int, tuple[float, int]] = {}  # problem -> (successes, rollouts)

    def estimate(self, problems: Iterable[int], batch_rate: float) -> list[float]:
        """p_b for each problem, from earlier steps only (module docstring).

        >>> tracker = ProblemSuccess(prior_rollouts=2)
        >>> tracker.update([7], [[1.0, 1.0]])
        >>> tracker.estimate([7, 8], batch_rate=0.5)
        [0.75, 0.5]
        """
        rates = []
        for problem in problems:
            successes, rollouts = self.counts.get(int(problem), (0.0, 0))
            prior = self.prior_rollouts
            rates.append((successes + prior * batch_rate) / (rollouts + prior))
        return rates

    def update(self, problems: Sequence[int], correct: Iterable[Iterable[float]]) -> None:
        """Add one step's outcomes: `correct[b]` holds group b's R rewards (1 right, 0 wrong)."""
        groups = [list(map(float, group)) for group in correct]
        if len(groups) != len(problems):
            raise ValueError(f"{len(problems)} problems but {len(groups)} groups of outcomes")
        for problem, group in zip(problems, groups, strict=True):
            successes, rollouts = self.counts.get(int(problem), (0.0, 0))
            self.counts[int(problem)] = (successes + sum(group), rollouts + len(group))

    def state_dict(self) -> dict[str, Any]:
        return {"prior_rollouts": self.prior_rollouts, "counts": dict(self.counts)}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.prior_rollouts = float(state["prior_rollouts"])
        self.counts = {int(k): (float(s), int(n)) for k, (s, n) in state["counts"].items()}
