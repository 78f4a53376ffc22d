"""AdamW whose bf16 weights are updated with stochastic rounding (memory-neutral).

With bf16 weights, plain AdamW rounds every update to the nearest bf16 value: an update smaller
than half a weight's rounding step (about |w| * 2^-9) is lost. At RL learning rates (1e-6) that is
most of them. Here the step is computed in float32 and the new weight is rounded stochastically,
up or down with probabilities that make it unbiased: E[w_new] = w - update (Zamirai et al. 2020,
"Revisiting BFloat16 Training"). Moment estimates are stored in the parameter's dtype, like
`torch.optim.AdamW`, so memory is unchanged. For float32 parameters this is plain AdamW.
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

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0, seed=0):
        super().__init__(params, {"lr": lr, "betas": betas, "eps": eps, "weight_decay": weight_decay})
        self.seed = seed
        self._generators: dict[torch.device, torch.Generator] = {}

    def _generator(self, device: torch.device) -> torch.Generator:
        if device not in self._generators:
            self._generators[device] = torch.Generator(device=device).manual_seed(self.seed)
        return self._generators[device]

    @torch.no_grad()
    def step(self, closure=None):
        loss = closure() if closure is not None else None
        for group in self.param_groups:
            beta1, beta2 = group["betas"]
            for param in group["params"]:
                if param.grad is None:
                    continue
                state = self.state[param]
                if not state:
                    state["step"] = 0
                    state["exp_avg"] = torch.zeros_like(param)
                    state["exp_avg_sq"] = torch.zeros_like(param)
                state["step"] += 1
                grad = param.grad.float()
                exp_avg = state["exp_avg"].float().mul_(beta1).add_(grad, alpha=1 - beta1)
                exp_avg_sq = state["exp_avg_sq"].float().mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
                state["exp_avg"].copy_(exp_avg)
                state["exp_avg_sq"].copy_(exp_avg_sq)
                step_size = group["lr"] / (1 - beta1 ** state["step"])
                denom = (exp_avg_sq / (1 - beta2 ** state["step"])).sqrt_().add_(group["eps"])
                updated = param.float().mul_(1 - group["lr"] * group["weight_decay"])
                updated.addcdiv_(exp_avg, denom, value=-step_size)
                if param.dtype == torch.bfloat16:
                    param.copy_(stochastic_round_to_bf16(updated, self._generator(param.device)))
                else:
                    param.copy_(updated)
        return loss


def build_optimizer(params, optim_cfg, seed: int) -> torch.optim.Optimizer:
    """AdamW for float32 policies; the stochastic-rounding variant when any weight is bf16."""
    params = list(params)
    kwargs = {"lr": optim_cfg.lr, "betas": tuple(optim_cfg.betas),
              "weight_decay": optim_cfg.weight_decay}
    if any(p.dtype == torch.bfloat16 for p in params):
        return StochasticRoundingAdamW(params, seed=seed, **kwargs)
    return torch.optim.AdamW(params, **kwargs)

