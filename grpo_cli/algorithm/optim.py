"""AdamW computed in float32 for bf16 weights: fp32 master weights, or stochastic rounding.

With bf16 weights, plain AdamW rounds every update to the nearest bf16 value: an update smaller
than half a weight's rounding step (about |w| * 2^-9) is lost. At RL learning rates (1e-6) that is
most of them. `MixedPrecisionAdamW` computes every step in float32 and, per bf16 parameter, either

- keeps an fp32 master copy with fp32 moments (the usual mixed-precision recipe): the step
  updates the master and the bf16 weight is the master rounded to nearest, so W_t - W_0 read
  from the master is the sum of the Adam steps, free of rounding (`model.master_weights=fp32`;
  +8 bytes per parameter: a 4-byte master, and moments of 8 bytes instead of 4); or
- updates the bf16 weight in place and rounds it stochastically, up or down with probabilities
  that make it unbiased, E[w_new] = w - update (Zamirai et al. 2020, "Revisiting BFloat16
  Training"), moments in bf16: memory-neutral, but W_t - W_0 then carries the rounding noise
  (`model.master_weights=none`).

For float32 parameters both are plain AdamW. The rounding generators' states are part of the
optimizer's state dict, so a resumed run draws the same rounding as an uninterrupted one. The
update is elementwise, so it runs over flat slices of each parameter (`slice_elements`), which
bounds its float32 temporaries whatever the largest matrix is.
"""

from __future__ import annotations

import re

import torch

MASTER_WEIGHTS = ("fp32", "probed", "none")


def stochastic_round_to_bf16(values: torch.Tensor, generator: torch.Generator | None = None):
    """float32 -> bfloat16, rounding up or down with probability given by the distance."""
    bits = values.float().contiguous().view(torch.int32)
    noise = torch.randint(0, 1 << 16, bits.shape, dtype=torch.int32, device=bits.device,
                          generator=generator)
    truncated = (bits + noise) & -65536  # keep the top 16 bits: exactly representable in bf16
    return truncated.view(torch.float32).to(torch.bfloat16)


class MixedPrecisionAdamW(torch.optim.Optimizer):
    """AdamW (Loshchilov & Hutter 2019) in float32; bf16 weights in `master_params` get fp32
    masters and fp32 moments, other bf16 weights stochastic rounding (module docstring)."""

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0, seed=0,
                 slice_elements: int = 2**24, master_params=()):
        super().__init__(params, {"lr": lr, "betas": betas, "eps": eps, "weight_decay": weight_decay})
        self.seed = seed
        # Elements updated at a time: the float32 temporaries (gradient, both moments, the
        # denominator, the new weight and the rounding's int32 noise, ~8 copies) then take
        # 8 x 4 B x 2^24 = 0.5 GiB, where a whole 256000 x 3072 embedding would take ~23 GiB.
        self.slice_elements = slice_elements
        self._master_ids = {id(p) for p in master_params if p.dtype != torch.float32}
        self._generators: dict[str, torch.Generator] = {}

    def keeps_master(self, param: torch.Tensor) -> bool:
        return id(param) in self._master_ids

    def master_weight(self, param: torch.Tensor) -> torch.Tensor:
        """The full-precision value of `param`: its fp32 master, else the parameter itself."""
        master = self.state[param].get("master") if param in self.state else None
        return param if master is None else master

    def _generator(self, device: torch.device) -> torch.Generator:
        key = str(device)
        if key not in self._generators:
            self._generators[key] = torch.Generator(device=device).manual_seed(self.seed)
        return self._generators[key]

    @torch.no_grad()
    def step(self, closure=None):
        loss = closure() if closure is not None else None
        for group in self.param_groups:
            for param in group["params"]:
                if param.grad is None:
                    continue
                state = self.state[param]
                master = self.keeps_master(param)
                if not state:
                    state["step"] = 0
                    moments_dtype = torch.float32 if master else param.dtype
                    state["exp_avg"] = torch.zeros_like(param, dtype=moments_dtype)
                    state["exp_avg_sq"] = torch.zeros_like(param, dtype=moments_dtype)
                    if master:
                        state["master"] = param.float()  # exact: every bf16 value is an fp32 one
                state["step"] += 1
                tensors = [param, param.grad, state["exp_avg"], state["exp_avg_sq"]]
                if master:
                    tensors.append(state["master"])
                if not all(t.is_contiguous() for t in tensors):  # no flat view: one piece
                    self._update(*tensors[:4], group, state["step"], *tensors[4:])
                    continue
                flat = [t.view(-1) for t in tensors]  # [numel] views: slices write through
                for start in range(0, param.numel(), self.slice_elements):
                    pieces = [t[start : start + self.slice_elements] for t in flat]
                    self._update(*pieces[:4], group, state["step"], *pieces[4:])
        return loss

    def _update(self, param, grad, exp_avg_store, exp_avg_sq_store, group, step: int,
                master=None) -> None:
        """AdamW on one flat slice [n] of a parameter, in float32; the slice is written back
        (with `master`, the fp32 master slice is updated and rounded to nearest into param)."""
        beta1, beta2 = group["betas"]
        grad = grad.float()
        exp_avg = exp_avg_store.float().mul_(beta1).add_(grad, alpha=1 - beta1)
        exp_avg_sq = exp_avg_sq_store.float().mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
        exp_avg_store.copy_(exp_avg)
        exp_avg_sq_store.copy_(exp_avg_sq)
        step_size = group["lr"] / (1 - beta1**step)
        denom = (exp_avg_sq / (1 - beta2**step)).sqrt_().add_(group["eps"])
        updated = master if master is not None else param.float()
        updated.mul_(1 - group["lr"] * group["weight_decay"])
        updated.addcdiv_(exp_avg, denom, value=-step_size)
        if param.dtype == torch.bfloat16 and master is None:
            param.copy_(stochastic_round_to_bf16(updated, self._generator(param.device)))
        else:
            param.copy_(updated)  # float32, or a master rounded to nearest into the bf16 copy

    def state_dict(self) -> dict:
        state = super().state_dict()
        state["rounding_generators"] = {key: g.get_state() for key, g in self._generators.items()}
        return state

    def load_state_dict(self, state_dict: dict) -> None:
        super().load_state_dict(state_dict)
        # torch casts floating-point state to the parameter's dtype on load; masters and their
        # moments stay float32.
        params = [p for group in self.param_groups for p in group["params"]]
        for index, param in enumerate(params):
            saved = state_dict["state"].get(index, {})
            if "master" in saved:
                for key in ("master", "exp_avg", "exp_avg_sq"):
                    self.state[param][key] = saved[key].to(param.device, torch.float32)
        for key, generator_state in state_dict.get("rounding_generators", {}).items():
            self._generator(torch.device(key)).set_state(generator_state.cpu())


def master_params(named_params, master_weights: str, probed_regex: str) -> list[torch.nn.Parameter]:
    """The parameters that get fp32 masters: all (fp32), those the `update`/`grad_sum` probes
    read (probed: 2-D weights matching `probes.layer_regex`), or none."""
    if master_weights not in MASTER_WEIGHTS:
        raise ValueError(
            f"model.master_weights={master_weights!r} is not one of {', '.join(MASTER_WEIGHTS)}"
        )
    if master_weights == "none":
        return []
    pattern = re.compile(probed_regex)
    return [p for name, p in named_params
            if master_weights == "fp32" or (p.ndim == 2 and pattern.search(name))]


def build_optimizer(params, optim_cfg, seed: int, master=()) -> torch.optim.Optimizer:
    """AdamW for float32 policies; the mixed-precision variant when any weight is bf16, with
    fp32 masters for the bf16 weights in `master` (see `master_params`)."""
    params = list(params)
    kwargs = {"lr": optim_cfg.lr, "betas": tuple(optim_cfg.betas),
              "weight_decay": optim_cfg.weight_decay}
    if any(p.dtype == torch.bfloat16 for p in params):
        return MixedPrecisionAdamW(params, seed=seed, master_params=master, **kwargs)
    return torch.optim.AdamW(params, **kwargs)


def master_weight(optimizer: torch.optim.Optimizer, param: torch.Tensor) -> torch.Tensor:
    """`param`'s full-precision value under `optimizer` (its fp32 master where it keeps one)."""
    read = getattr(optimizer, "master_weight", None)
    return param if read is None else read(param)


def keeps_master(optimizer: torch.optim.Optimizer, param: torch.Tensor) -> bool:
    check = getattr(optimizer, "keeps_master", None)
    return bool(check(param)) if check is not None else False
