"""AdamW whose bf16 weights are updated with stochastic rounding (memory-neutral).

With bf16 weights, plain AdamW rounds every update to the nearest bf16 value: an update smaller
than half a weight's rounding step (about |w| * 2^-9) is lost. At RL learning rates (1e-6) that is
most of them. Here the step is computed in float32 and the new weight is rounded stochastically,
up or down with probabilities that make it unbiased: E[w_new] = w - update (Zamirai et al. 2020,
"Revisiting BFloat16 Training"). Moment estimates are stored in the parameter's dtype, like
`torch.optim.AdamW`, so memory is unchanged. For float32 parameters this is plain AdamW. The update
is elementwise, so it runs over flat slices of each parameter (`slice_elements`), which bounds its
float32 temporaries whatever the largest matrix is.
"""

from __future__ import annotations

import torch


def stochastic_round_to_bf16(values: torch.Tensor, generator: torch.Generator | None = None):
    """float32 -> bfloat16, rounding up or down with probability given by the distance."""
    bits = values.float().contiguous().view(torch.int32)
    noise = torch.randint(0, 1 << 16, bits.shape, dtype=torch.int32, device=bits.device,
                          generator=generator)
    truncated = (bits + noise) & -65536  # keep the top 16 bits: exactly representable in bf16
    return truncated.view(torch.float32).to(torch.bfloat16)


class StochasticRoundingAdamW(torch.optim.Optimizer):
    """AdamW (Loshchilov & Hutter 2019) computed in float32; bf16 weights rounded stochastically."""

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0, seed=0,
                 slice_elements: int = 2**24):
        super().__init__(params, {"lr": lr, "betas": betas, "eps": eps, "weight_decay": weight_decay})
        self.seed = seed
        # Elements updated at a time: the float32 temporaries (gradient, both moments, the
        # denominator, the new weight and the rounding's int32 noise, ~8 copies) then take
        # 8 x 4 B x 2^24 = 0.5 GiB, where a whole 256000 x 3072 embedding would take ~23 GiB.
        self.slice_elements = slice_elements
        self._generators: dict[torch.device, torch.Generator] = {}

    def _generator(self, device: torch.device) -> torch.Generator:
        if device not in self._generators:
            self._generators[device] = torch.Generator(device=device).manual_seed(self.seed)
        return self._generators[device]

    @torch.no_grad()
    def step(self, closure=None):
        loss = closure() if closure is not None else None
        for group in self.param_groups:
            for param in group["params"]:
                if param.grad is None:
                    continue
                state = self.state[param]
                if not state:
                    state["step"] = 0
                    state["exp_avg"] = torch.zeros_like(param)
                    state["exp_avg_sq"] = torch.zeros_like(param)
                state["step"] += 1
                tensors = [param, param.grad, state["exp_avg"], state["exp_avg_sq"]]
                if not all(t.is_contiguous() for t in tensors):  # no flat view: one piece
                    self._update(*tensors, group, state["step"])
                    continue
                flat = [t.view(-1) for t in tensors]  # [numel] views: slices write through
                for start in range(0, param.numel(), self.slice_elements):
                    self._update(*(t[start : start + self.slice_elements] for t in flat),
                                 group, state["step"])
        return loss

    def _update(self, param, grad, exp_avg_store, exp_avg_sq_store, group, step: int) -> None:
        """AdamW on one flat slice [n] of a parameter, in float32; the slice is written back."""
        beta1, beta2 = group["betas"]
        grad = grad.float()
        exp_avg = exp_avg_store.float().mul_(beta1).add_(grad, alpha=1 - beta1)
        exp_avg_sq = exp_avg_sq_store.float().mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
        exp_avg_store.copy_(exp_avg)
        exp_avg_sq_store.copy_(exp_avg_sq)
        step_size = group["lr"] / (1 - beta1**step)
        denom = (exp_avg_sq / (1 - beta2**step)).sqrt_().add_(group["eps"])
        updated = param.float().mul_(1 - group["lr"] * group["weight_decay"])
        updated.addcdiv_(exp_avg, denom, value=-step_size)
        if param.dtype == torch.bfloat16:
            param.copy_(stochastic_round_to_bf16(updated, self._generator(param.device)))
        else:
            param.copy_(updated)


def build_optimizer(params, optim_cfg, seed: int) -> torch.optim.Optimizer:
    """AdamW for float32 policies; the stochastic-rounding variant when any weight is bf16."""
    params = list(params)
    kwargs = {"lr": optim_cfg.lr, "betas": tuple(optim_cfg.betas),
              "weight_decay": optim_cfg.weight_decay}
    if any(p.dtype == torch.bfloat16 for p in params):
        return StochasticRoundingAdamW(params, seed=seed, **kwargs)
    return torch.optim.AdamW(params, **kwargs)

