"""How each advantage estimator assigns credit, by name (no torch import: the analysis reads it).

- GROUP_ZERO_SUM_ESTIMATORS: one advantage per rollout, c * (r_i - mean of its group) with c > 0
  the same for the whole group, so a group's advantages sum to zero. The paper's rank-2 argument
  and the closed-form composition prediction (grpo_cli/measures.py) assume this.
- OUTCOME_ESTIMATORS: one advantage per rollout, shared by all its tokens (the paper's claim 1);
  `reinforce` is one of them, but its baseline is the batch mean, not the group mean.
- TOKEN_LEVEL_ESTIMATORS: advantages that vary along a completion (the paper's falsifier):
  `ppo` (a learned value head and GAE), `process` (per-step rewards) and `otb` (verl's Optimal
  Token Baseline: a per-timestep baseline from the policy's probabilities, outcome reward only).
"""

GROUP_ZERO_SUM_ESTIMATORS = ("grpo", "dr_grpo", "rloo")
OUTCOME_ESTIMATORS = (*GROUP_ZERO_SUM_ESTIMATORS, "reinforce")
TOKEN_LEVEL_ESTIMATORS = ("ppo", "process", "otb")


def credit_kind(estimator: str | None) -> str:
    """ "outcome", "per_token", or "unknown" for an `algorithm.name`."""
    if estimator in OUTCOME_ESTIMATORS:
        return "outcome"
    if estimator in TOKEN_LEVEL_ESTIMATORS:
        return "per_token"
    return "unknown"
