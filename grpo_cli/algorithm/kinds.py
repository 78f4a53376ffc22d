"""Estimator facts of results directories written before run.json recorded them (no torch).

The owner of what an estimator is, is its registration in grpo_cli/algorithm/advantages.py
(`credit`, `zero_sum_group`); every run records those facts in run.json (`estimator_facts`),
and `grpo analyze` reads them from there. This table is frozen: it says what the six estimators
that existed before that key meant, so that older directories are still judged. A new estimator
is never added here (its runs carry their own facts).

- zero_sum_group: one advantage per rollout, c * (r_i - mean of its group) with c > 0 the same
  for the whole group, so a group's advantages sum to zero (the rank-2 argument and the
  composition prediction, grpo_cli/measures.py, assume this).
- credit "outcome": one advantage per rollout, shared by all its tokens (the paper's claim 1);
  `reinforce` is one, but its baseline is the batch mean, not the group mean.
- credit "per_token": advantages that vary along a completion (the paper's falsifier): `ppo` (a
  learned value head and GAE) and `process` (per-step rewards).
"""

from types import MappingProxyType

LEGACY_ESTIMATOR_FACTS = MappingProxyType({  # name -> run.json's estimator_facts, as recorded today
    name: MappingProxyType({"name": name, "credit": credit, "zero_sum_group": zero_sum})
    for name, credit, zero_sum in (
        ("grpo", "outcome", True),
        ("dr_grpo", "outcome", True),
        ("rloo", "outcome", True),
        ("reinforce", "outcome", False),
        ("ppo", "per_token", False),
        ("process", "per_token", False),
    )
})
