"""The share of weights one step's update changed: the step-to-step counterpart of the since-start
`update_changed_frac` columns (verl's `changed_ratio`, slime's update density).

    step_changed_frac        = #{k : W_{t+1,k} != W_{t,k}} / n   in the weights as the model holds them
    step_changed_frac_master = the same in the optimizer's fp32 masters (NaN without them)
    step_changed_frac_bf16   = the same in a bf16 round-to-nearest copy of the full-precision
                               weights (arXiv 2511.08567: what bf16 weights would show)

over the probes' layer weights (probes.layer_regex, n entries, as `update_changed_frac`), exact
(no threshold). W_t is copied just before the step's first optimizer step (`before`) and compared
just after its last (`after`), so every step that updates has its previous weights, step 0
included (W_0: there the step-to-step fraction equals the since-start one); a step that takes no
optimizer step (`grpo probe`) has no `after`, and an `after` without a `before` is NaN. The copy
costs one more set of those weights in memory while the optimizer steps.
"""

from __future__ import annotations

import math

import torch

from grpo_cli.algorithm.optim import keeps_master, master_weight
from grpo_cli.probes.sparsity import changed_count
from grpo_cli.runtime.sharded import whole

STEP_CHANGED_COLUMNS = ("step_changed_frac", "step_changed_frac_master", "step_changed_frac_bf16")


class StepChange:
    """W_t of `params` (name -> parameter) before one step's update, then the update's changed
    fractions (STEP_CHANGED_COLUMNS). `optimizer`: where fp32 masters live (None: none)."""

    def __init__(self, params: dict[str, torch.Tensor], optimizer: torch.optim.Optimizer | None = None):
        self.params = params
        self.optimizer = optimizer
        self._before: dict[str, tuple[torch.Tensor, torch.Tensor | None]] | None = None

    def _master(self, param: torch.Tensor) -> torch.Tensor | None:
        return master_weight(self.optimizer, param) if keeps_master(self.optimizer, param) else None

    def before(self) -> None:
        """Copy every weight (and its master) as it is now, on its device."""
        self._before = {}
        for name, param in self.params.items():
            master = self._master(param)  # before the first step: the parameter itself
            self._before[name] = (param.detach().clone(),
                                  None if master is None else master.detach().clone())

    def after(self) -> torch.Tensor:  # [3] float64, STEP_CHANGED_COLUMNS' order, on the device
        """The changed fractions since `before`, kept on the device for the metrics row's one
        host read (under FSDP2 the counts are summed over the processes: a collective). NaN
        without a `before`."""
        before, self._before = self._before, None
        if before is None or not self.params:
            return torch.full((3,), math.nan, dtype=torch.float64)
        held, masters, bf16 = [], [], []  # 0-d counts per weight, on the device
        for name, param in self.params.items():
            held_before, master_before = before[name]
            master = self._master(param)
            full, full_before = (param, held_before) if master is None else (master, master_before)
            held.append(changed_count(param, held_before))
            if master is not None:
                masters.append(changed_count(master, master_before))
            bf16.append(changed_count(full, full_before, torch.bfloat16))
        held, bf16 = (whole(torch.stack(counts).sum()).double() for counts in (held, bf16))
        # NaN unless every weight has a master, as update_changed_frac_master
        masters = (whole(torch.stack(masters).sum()).double() if len(masters) == len(self.params)
                   else torch.full_like(held, math.nan))
        return torch.stack([held, masters, bf16]) / sum(p.numel() for p in self.params.values())


def step_change_due(every: int, step: int) -> bool:
    """Whether step `step` counts its changed weights (probes.changed_every; 0: never)."""
    return every > 0 and step % every == 0
