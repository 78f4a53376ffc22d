"""A scalar value head on the policy's final hidden states (for the `ppo` estimator).

The head reads detached hidden states, so the value loss trains the head only and leaves the
policy-gradient matrices that the probes measure untouched (a departure from PPO setups that
share the trunk).
"""

from __future__ import annotations

import torch


class ValueHead(torch.nn.Module):
    def __init__(self, hidden_size: int):
        super().__init__()
        self.linear = torch.nn.Linear(hidden_size, 1)
        torch.nn.init.zeros_(self.linear.weight)
        torch.nn.init.zeros_(self.linear.bias)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:  # [N, L, H] -> [N, L]
        """values[:, t] = V(state before token t), read from the hidden state at t-1."""
        scores = self.linear(hidden.detach().float()).squeeze(-1)  # [N, L]
        return torch.nn.functional.pad(scores[:, :-1], (1, 0))
