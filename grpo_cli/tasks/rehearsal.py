"""`task.reward=random`: coin-flip rewards for rehearsals (`experiment=paper_rehearsal`).

A policy with random weights never solves a problem, so every group would have zero reward
variance, zero advantages and no gradient: backward, the optimizer and the probes would not run as
they do in a real experiment. These rewards are Bernoulli(1/2) per rollout, seeded by (training
seed, the group's problem, the group's completions), so a resumed run or a re-scored batch gets
the same values; a group whose coins all agree has one flipped, so every group of R >= 2 has
non-zero variance. They measure nothing: runs that use them say so in run.json and in `grpo
analyze`'s report.
"""

from __future__ import annotations

import hashlib
import json
import random

REWARDS = ("task", "random")


def random_group_rewards(seed: int, problem: int, completions: list[str]) -> list[float]:
    """One group's coins (module docstring)."""
    digest = hashlib.sha256(json.dumps([seed, problem, completions]).encode()).hexdigest()
    rng = random.Random(digest)
    coins = [float(rng.random() < 0.5) for _ in completions]
    if len(coins) > 1 and len(set(coins)) == 1:
        flipped = rng.randrange(len(coins))
        coins[flipped] = 1.0 - coins[flipped]
    return coins


def random_rewards(
    seed: int, problems: list[int], completions: list[str], group_size: int
) -> list[float]:
    """Coins for a batch whose groups are contiguous runs of `group_size` rows."""
    if len(completions) != len(problems) * group_size:
        raise ValueError(f"{len(completions)} completions for {len(problems)} groups of {group_size}")
    return [
        coin
        for index, problem in enumerate(problems)
        for coin in random_group_rewards(
            seed, problem, completions[index * group_size : (index + 1) * group_size]
        )
    ]
