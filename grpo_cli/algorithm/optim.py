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
optimizer's state dict, so a resumed run draws the same rounding as an uninterrupted one.

The update is elementwise, so it runs over flat slices of at most `slice_elements` elements,
which bounds its float32 temporaries whatever the largest matrix is. On CUDA, parameters of one
device, dtype and kind (master or not) are also packed together, whole where they fit, into
chunks of that size, each updated with ~11-21 multi-tensor `torch._foreach_*` ops where a loop
over parameters launches ~15 kernels per tensor (SmolLM2-135M: 99 ops a step instead of 4,095).
On CPU the loop is faster and is the default (`foreach`); the two agree bit for bit there (the
same elementwise kernels; CPU random draws are serial, so one rounding draw per chunk equals one
per slice). Timings: docs/speed_log.md.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import TYPE_CHECKING, NamedTuple

import torch

if TYPE_CHECKING:
    from grpo_cli.config.schema import OptimConfig

MASTER_WEIGHTS = ("fp32", "probed", "none")


def stochastic_round_to_bf16(values: torch.Tensor, generator: torch.Generator | None = None):
    """float32 -> bfloat16, rounding up or down with probability given by the distance."""
    bits = values.float().contiguous().view(torch.int32)
    noise = torch.randint(0, 1 << 16, bits.shape, dtype=torch.int32, device=bits.device,
                          generator=generator)
    truncated = (bits + noise) & -65536  # keep the top 16 bits: exactly representable in bf16
    return truncated.view(torch.float32).to(torch.bfloat16)


class _Piece(NamedTuple):
    """Matching flat slices [n] of one parameter's tensors (whole tensors if non-contiguous)."""

    param: torch.Tensor
    grad: torch.Tensor
    exp_avg: torch.Tensor
    exp_avg_sq: torch.Tensor
    master: torch.Tensor | None
    step: int


class MixedPrecisionAdamW(torch.optim.Optimizer):
    """AdamW (Loshchilov & Hutter 2019) in float32; bf16 weights in `master_params` get fp32
    masters and fp32 moments, other bf16 weights stochastic rounding (module docstring)."""

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0, seed=0,
                 slice_elements: int = 2**24, master_params=(), foreach: bool | None = None):
        if slice_elements < 1:
            raise ValueError(f"slice_elements={slice_elements}: must be >= 1")
        super().__init__(params, {"lr": lr, "betas": betas, "eps": eps, "weight_decay": weight_decay})
        self.seed = seed
        # Elements updated at a time: the float32 temporaries (gradient, both moments, the
        # denominator, the new weight and the rounding's int32 noise, ~8 copies) then take
        # 8 x 4 B x 2^24 = 0.5 GiB, where a whole 256000 x 3072 embedding would take ~23 GiB.
        self.slice_elements = slice_elements
        # True: multi-tensor ops over chunks of parameters; False: a loop over parameters;
        # None: multi-tensor on CUDA, where the loop is bound by kernel launches, the loop
        # elsewhere (torch's optimizers decide so too; CPU timings: docs/speed_log.md)
        self.foreach = foreach
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
            params = [p for p in group["params"] if p.grad is not None]
            for param in params:
                state = self.state[param]
                if not state:
                    master = self.keeps_master(param)
                    state["step"] = 0
                    moments_dtype = torch.float32 if master else param.dtype
                    state["exp_avg"] = torch.zeros_like(param, dtype=moments_dtype)
                    state["exp_avg_sq"] = torch.zeros_like(param, dtype=moments_dtype)
                    if master:
                        state["master"] = param.float()  # exact: every bf16 value is an fp32 one
                state["step"] += 1
            kinds: dict[tuple, list[torch.Tensor]] = {}  # same device, dtype, master or not
            for param in params:
                kind = (param.device, param.dtype, "master" in self.state[param])
                kinds.setdefault(kind, []).append(param)
            for (device, _, _), same_kind in kinds.items():
                if self.uses_foreach(device):
                    for chunk in self._chunks(same_kind):
                        self._update_chunk(chunk, group)
                    continue
                for param in same_kind:
                    self._update_param(param, group)
        return loss

    def uses_foreach(self, device: torch.device) -> bool:
        """Multi-tensor ops for parameters on `device`: `foreach`, or if None on CUDA only."""
        return self.foreach if self.foreach is not None else device.type == "cuda"

    def _update_param(self, param: torch.Tensor, group) -> None:
        """The per-parameter path: `_update` on flat slices of one parameter's tensors."""
        state = self.state[param]
        tensors = [param, param.grad, state["exp_avg"], state["exp_avg_sq"]]
        tensors += [state["master"]] if "master" in state else []
        if not all(t.is_contiguous() for t in tensors):  # no flat view: one piece
            self._update(*tensors[:4], group, state["step"], *tensors[4:])
            return
        flat = [t.view(-1) for t in tensors]  # [numel] views: slices write through
        for start in range(0, param.numel(), self.slice_elements):
            pieces = [t[start : start + self.slice_elements] for t in flat]
            self._update(*pieces[:4], group, state["step"], *pieces[4:])

    def _chunks(self, params) -> Iterator[list[_Piece]]:
        """`params`' tensors as pieces, packed in order into chunks of at most `slice_elements`
        elements: a tensor that fits goes whole, a larger one in the flat slices `_update_param`
        takes (a non-contiguous one has no flat view: it goes whole, in a chunk of its own)."""
        chunk, room = [], self.slice_elements
        for param in params:
            state = self.state[param]
            tensors = (param, param.grad, state["exp_avg"], state["exp_avg_sq"], state.get("master"))
            pieces = [_Piece(*tensors, state["step"])]
            present = [t for t in tensors if t is not None]
            if param.numel() > self.slice_elements and all(t.is_contiguous() for t in present):
                flat = [None if t is None else t.view(-1) for t in tensors]  # [numel] views
                pieces = [_Piece(*(None if t is None else t[start : start + self.slice_elements]
                                   for t in flat), state["step"])
                          for start in range(0, param.numel(), self.slice_elements)]
            for piece in pieces:
                size = piece.param.numel()
                if chunk and size > room:
                    yield chunk
                    chunk, room = [], self.slice_elements
                chunk.append(piece)
                room -= size
        if chunk:
            yield chunk

    def _update_chunk(self, pieces: list[_Piece], group) -> None:
        """`_update` on a chunk of pieces of one device, dtype and kind: the same float32
        arithmetic, each line one multi-tensor op over the chunk. Float32 copies of bf16
        values are views of one flat buffer [n], n = the chunk's elements."""
        beta1, beta2 = group["betas"]
        sizes = [piece.param.numel() for piece in pieces]

        def float32(tensors):  # (float32 values, their flat buffer or None if in place)
            if tensors[0].dtype == torch.float32:
                return tensors, None
            flat = torch.empty(sum(sizes), dtype=torch.float32, device=tensors[0].device)
            copies = [c.view(t.shape) for c, t in zip(flat.split(sizes), tensors, strict=True)]
            torch._foreach_copy_(copies, tensors)
            return copies, flat

        params = [piece.param for piece in pieces]
        grads, _ = float32([piece.grad for piece in pieces])
        exp_avg_stores = [piece.exp_avg for piece in pieces]
        exp_avg_sq_stores = [piece.exp_avg_sq for piece in pieces]
        exp_avgs, copied = float32(exp_avg_stores)
        exp_avg_sqs, _ = float32(exp_avg_sq_stores)
        torch._foreach_mul_(exp_avgs, beta1)
        torch._foreach_add_(exp_avgs, grads, alpha=1 - beta1)
        torch._foreach_mul_(exp_avg_sqs, beta2)
        torch._foreach_addcmul_(exp_avg_sqs, grads, grads, value=1 - beta2)
        if copied is not None:  # bf16 moments: round the float32 values back to nearest
            torch._foreach_copy_(exp_avg_stores, exp_avgs)
            torch._foreach_copy_(exp_avg_sq_stores, exp_avg_sqs)
        denom = torch._foreach_div(exp_avg_sqs, [1 - beta2**piece.step for piece in pieces])
        torch._foreach_sqrt_(denom)
        torch._foreach_add_(denom, group["eps"])
        if pieces[0].master is not None:
            updated, flat = [piece.master for piece in pieces], None
        else:
            updated, flat = float32(params)
        torch._foreach_mul_(updated, 1 - group["lr"] * group["weight_decay"])
        step_sizes = [-group["lr"] / (1 - beta1**piece.step) for piece in pieces]
        torch._foreach_addcdiv_(updated, exp_avgs, denom, step_sizes)
        if updated is params:
            return  # float32 parameters, updated in place
        if flat is not None and params[0].dtype == torch.bfloat16:
            rounded = stochastic_round_to_bf16(flat, self._generator(params[0].device))  # [n]
            updated = [r.view(p.shape) for r, p in zip(rounded.split(sizes), params, strict=True)]
        torch._foreach_copy_(params, updated)  # rounded, or masters rounded to nearest

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


def build_optimizer(params, optim_cfg: OptimConfig, seed: int, master=()) -> torch.optim.Optimizer:
    """AdamW for float32 policies; the mixed-precision variant when any weight is bf16, with
    fp32 masters for the bf16 weights in `master` (see `master_params`)."""
    params = list(params)
    kwargs = {"lr": optim_cfg.lr, "betas": tuple(optim_cfg.betas),
              "weight_decay": optim_cfg.weight_decay}
    if any(p.dtype == torch.bfloat16 for p in params):
        if optim_cfg.fused:  # None (auto) takes this branch's optimizer
            raise ValueError("optim.fused=true is torch's AdamW for float32 weights; bf16 weights "
                             "use MixedPrecisionAdamW (multi-tensor already): set optim.fused=false")
        return MixedPrecisionAdamW(params, seed=seed, master_params=master, **kwargs)
    # fused (default: auto = on): one kernel per tensor instead of ~10 ops (CPU: SmolLM2's step
    # 0.81 -> 0.15 s, 1 thread); optim.fused=false keeps torch's default (foreach or loop)
    return torch.optim.AdamW(params, fused=True if optim_cfg.fused is not False else None, **kwargs)


def master_weight(optimizer: torch.optim.Optimizer, param: torch.Tensor) -> torch.Tensor:
    """`param`'s full-precision value under `optimizer` (its fp32 master where it keeps one)."""
    read = getattr(optimizer, "master_weight", None)
    return param if read is None else read(param)


def keeps_master(optimizer: torch.optim.Optimizer, param: torch.Tensor) -> bool:
    check = getattr(optimizer, "keeps_master", None)
    return bool(check(param)) if check is not None else False
