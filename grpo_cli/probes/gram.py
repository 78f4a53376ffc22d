"""Gram matrices K = G G^T [N, N] of per-rollout gradients, without forming G [N, P].

Row i of G is grad f_i, f_i = sum_t token_coeff[i, t] log p(token t) (see `per_sample.py`). The
spectrum of G is sqrt(eig(K)) (`rank_measures.singular_values_from_gram`), so the per-rollout
matrices of docs/results.md (rollout_batch, rollout_group, group_batch) all come from one K:
`group_blocks`, `group_sum_gram`. K is accumulated in float64; the activations and output-
gradients it is built from keep the model's precision (and `token_logprobs` differentiates a
float32 log-softmax), so a float32 model agrees with the naive reference to ~1e-7 relative.

Routes, chosen per parameter (`GramResult.methods`):

- `ghost`: the ghost inner-product identity (Goodfellow 2015; Li et al. 2022, "Large language
  models can be strong differentially private learners"): for G_i = sum_t A_i,t B_i,t^T,
  <G_i, G_j> = sum_{t,s} (A_i,t . A_j,s)(B_i,t . B_j,s). Cost ~ N^2 T^2 (a + b).
- `materialize`: per-rollout gradients sum_t A_i,t B_i,t^T in row chunks, then their Gram.
  Cost ~ N T a b + N^2 a b. `auto` picks the cheaper of the two per parameter.
- `direct`: biases and RMSNorm weights, whose per-rollout gradients are formed by the hooks.
- `sketch`: unbiased Kronecker sketch (below); vectors stay exact.
- `per_sample`: one backward per rollout, for layers the hooks do not cover, for parameters
  that fail the consistency check, and for the reference `naive_gram`.

Consistency check (exact routes): 1^T K 1 = ||sum_i G_i||^2 = ||grad sum_i f_i||^2, the ordinary
gradient from the same backward. A mismatch means a use of the parameter the hooks missed (e.g.
a weight read outside its module's forward); that parameter then falls back to `per_sample`.

Sketch error. Each matrix parameter [a, b] is sketched as Z_i = U^T G_i V, U [a, k1], V [b, k2]
i.i.d. N(0, 1/k1), N(0, 1/k2) (identity on a side that already fits), k1 k2 <= sketch_dim
(Kronecker projection as in LoGra, Choe et al. 2024): cost N T (a k1 + b k2), never P x k. Then
E[Z Z^T] = K and, by Var(u^T C u) <= 2 ||C||_F^2 and ||C_ij||_F <= ||G_i||_F ||G_j||_F,

    E ||K_hat - K||_F^2 <= (tr K)^2 (2/k2 + (2/k1)(1 + 2/k2))     (`sketch_mse_bound`)

summed over parameters (independent sketches). A dense Gaussian sketch of width k would give
((tr K)^2 + ||K||_F^2) / k, i.e. relative error sqrt(2/k) for a rank-one K; the Kronecker
bound decays like k^(-1/4) (worst case: all G_i sharing a factor). Measured relative
Frobenius errors: 0.13 at k = 1024 and 0.09 at k = 4096 (bound 0.53 / 0.37) on the 0.9M-param
Llama of scripts/bench_gram.py; near the bound on the 2-layer test model, whose G_i have rank
<= 11. `auto` (exact) is usually affordable; sketch when N^2 T^2 and N T a b both are not.

Note: the model's dropout (if any) acts in the single forward; run probes in eval mode.
"""

from __future__ import annotations

import math
import re
import warnings
import zlib
from collections.abc import Mapping
from dataclasses import dataclass, field

import torch
from torch import nn

from grpo_cli.probes.per_sample import (
    CHUNK_ELEMS,
    LayerCapture,
    ParamTerms,
    ghost_gram_terms,
    materialized_gram,
    per_sample_grads,
    rollout_objectives,
    select_params,
    sketched_rows,
)

METHODS = ("auto", "ghost", "per_sample", "sketch")
ParamSpec = Mapping[str, nn.Parameter] | str | None  # explicit parameters, a name regex, or all


@dataclass
class GramResult:
    """Gram of per-rollout gradients over the selected parameters."""

    gram: torch.Tensor  # [N, N] float64, sum over the selected parameters
    methods: dict[str, str]  # parameter name -> route that computed its share
    per_param: dict[str, torch.Tensor] = field(default_factory=dict)  # name -> [N, N] float64
    # name -> (a, k1, b, k2): sketched parameter [a, b] and its projection widths
    sketch_dims: dict[str, tuple[int, int, int, int]] = field(default_factory=dict)

    def restrict(self, param_regex: str) -> torch.Tensor:  # [N, N]
        """Gram over the parameters matching `param_regex` (needs per_param=True)."""
        pattern = re.compile(param_regex)
        if not self.per_param:
            raise ValueError("restrict needs a GramResult computed with per_param=True")
        out = torch.zeros_like(self.gram)
        for name, gram in self.per_param.items():
            if pattern.search(name):
                out += gram
        return out


# ---- pure helpers on a Gram --------------------------------------------------------------


def group_blocks(gram: torch.Tensor, group_size: int) -> torch.Tensor:  # [B, R, R]
    """Within-group Grams (rollout_group matrices); rows of a group contiguous."""
    n = gram.shape[0]
    b = n // group_size
    return gram.reshape(b, group_size, b, group_size).diagonal(dim1=0, dim2=2).permute(2, 0, 1)


def group_sum_gram(gram: torch.Tensor, group_size: int) -> torch.Tensor:  # [B, B]
    """Gram of the summed group gradients (group_batch): S K S^T, S the [B, N] group indicator."""
    n = gram.shape[0]
    b = n // group_size
    return gram.reshape(b, group_size, b, group_size).sum(dim=(1, 3))


def sketch_mse_bound(trace: float, rows: int, k1: int, cols: int, k2: int) -> float:
    """Bound on E||K_hat - K||_F^2 for one parameter's Kronecker sketch (module docstring)."""
    v = 2 / k2 if k2 < cols else 0.0
    u = (2 / k1) * (1 + v) if k1 < rows else 0.0
    return trace**2 * (u + v)


def sketch_widths(rows: int, cols: int, sketch_dim: int) -> tuple[int, int]:
    """(k1, k2) with k1 k2 <= sketch_dim, balanced; a side that fits is left unprojected."""
    if rows * cols <= sketch_dim:
        return rows, cols
    s = math.isqrt(sketch_dim)
    if rows <= s:
        return rows, sketch_dim // rows
    if cols <= s:
        return sketch_dim // cols, cols
    return s, s


# ---- sketch projections and one parameter's Gram ---------------------------------------


def _gaussian(shape: tuple[int, int], name: str, seed: int, salt: int, device) -> torch.Tensor:
    gen = torch.Generator().manual_seed(
        (seed * 1_000_003 + zlib.crc32(name.encode()) * 7 + salt) % 2**63
    )
    return (torch.randn(shape, generator=gen, dtype=torch.float64) / math.sqrt(shape[1])).to(device)


def _sketch_projections(name, rows, cols, sketch_dim, seed, device):
    """(U [a, k1] or None, V [b, k2] or None): None is the identity on that side."""
    k1, k2 = sketch_widths(rows, cols, sketch_dim)
    u = _gaussian((rows, k1), name, seed, 1, device) if k1 < rows else None
    v = _gaussian((cols, k2), name, seed, 2, device) if k2 < cols else None
    return u, v, k1, k2


def _close(x: torch.Tensor, y: torch.Tensor, scale: float, rtol: float) -> bool:
    return float((x - y).norm()) <= rtol * max(scale, float(y.norm()), 1e-300)


def _param_gram(name, terms: ParamTerms, full_grad, route, sketch_dim, seed, rtol, chunk_elems):
    """(gram [N, N], method, sketch dims or None, consistent?) for one covered parameter."""
    if not terms.matrix and terms.vector is None:  # no use reached the objective
        return None, "direct", None, full_grad is None or float(full_grad.norm()) == 0.0
    if terms.vector is not None:
        vec = terms.vector  # [N, numel]
        ok = full_grad is None or _close(
            vec.sum(0), full_grad.reshape(-1).double(), float(vec.norm(dim=1).sum()), rtol
        )
        return vec @ vec.T, "direct", None, ok
    a, b = terms.rows, terms.cols
    if route == "sketch":
        u, v, k1, k2 = _sketch_projections(name, a, b, sketch_dim, seed, terms.matrix[0][1].device)
        z = sketched_rows(terms.matrix, u, v, a)  # [N, k1*k2]
        ok = True
        if full_grad is not None:
            g = full_grad.reshape(a, b).double()
            g = g if u is None else u.T @ g
            g = g if v is None else g @ v
            ok = _close(z.sum(0), g.reshape(-1), float(z.norm(dim=1).sum()), rtol)
        return z @ z.T, "sketch", (a, k1, b, k2), ok
    n = terms.matrix[0][1].shape[0]
    t = sum(bt.shape[1] for _, bt in terms.matrix)
    a_eff = 1 if all(at.dtype == torch.long for at, _ in terms.matrix) else a
    ghost_cost = n * n * t * t * (a_eff + b) / 2
    mat_cost = n * t * a * b + n * n * a * b / 2
    if route == "ghost" or (route == "auto" and ghost_cost <= mat_cost):
        gram, method = ghost_gram_terms(terms.matrix, chunk_elems), "ghost"
    else:
        gram, method = materialized_gram(terms.matrix, a, b, chunk_elems), "materialize"
    ok = True
    if full_grad is not None:
        scale = float(gram.diagonal().clamp(min=0).sqrt().sum()) ** 2
        g2 = full_grad.double().pow(2).sum()
        ok = _close(gram.sum(), g2, scale, rtol)
    return gram, method, None, ok


def _check_rtol(model: nn.Module) -> float:
    dtype = next(model.parameters()).dtype
    return 1e-4 if dtype in (torch.float32, torch.float64) else 5e-2


def _resolve(model: nn.Module, params: ParamSpec) -> dict[str, nn.Parameter]:
    if params is None:
        return select_params(model)
    if isinstance(params, str):
        return select_params(model, params)
    return dict(params)


def _assemble(grams, methods, sketch_dims, n, device, per_param) -> GramResult:
    total = torch.zeros(n, n, dtype=torch.float64, device=device)
    for gram in grams.values():
        total += gram
    kept = dict(grams) if per_param else {}
    return GramResult(gram=total, methods=methods, per_param=kept, sketch_dims=sketch_dims)


def _hooked_grams(
    model,
    input_ids,
    attention_mask,
    coeffs,
    params,
    *,
    route,
    sketch_dim=4096,
    seed=0,
    per_param=False,
    check=True,
    chunk_elems=CHUNK_ELEMS,
) -> list[GramResult]:
    """One forward with hooks, then one backward per coefficient set; see module docstring."""
    n, device = input_ids.shape[0], input_ids.device
    with LayerCapture(model, params, n) as capture:
        rows_per_set = rollout_objectives(model, input_ids, attention_mask, coeffs)
    covered, targets, rtol = capture.covered, capture.targets(), _check_rtol(model)
    results = []
    for rows in rows_per_set:
        check_params = [params[name] for name in covered] if check else []
        inputs = targets + check_params
        grads = (
            torch.autograd.grad(rows.sum(), inputs, retain_graph=True, allow_unused=True)
            if inputs
            else ()
        )
        by_output = {id(t): g for t, g in zip(targets, grads[: len(targets)], strict=True)}
        full = dict(zip(covered, grads[len(targets) :], strict=True)) if check else {}
        grams, methods, sketch_dims, inconsistent = {}, {}, {}, []
        for name in covered:
            terms = capture.terms(name, by_output)
            gram, method, dims, ok = _param_gram(
                name, terms, full.get(name), route, sketch_dim, seed, rtol, chunk_elems
            )
            if not ok:
                inconsistent.append(name)
                continue
            if gram is None:  # the parameter does not reach the objective
                gram = torch.zeros(n, n, dtype=torch.float64, device=device)
            grams[name], methods[name] = gram, method
            if dims is not None:
                sketch_dims[name] = dims
        if inconsistent:
            warnings.warn(
                f"per-rollout gradient hooks missed a use of {inconsistent}; "
                "falling back to one backward per rollout",
                stacklevel=3,
            )
        fallback = {name: p for name, p in params.items() if name not in grams}
        for name, g in per_sample_grads(rows, fallback).items():
            grams[name], methods[name] = g @ g.T, "per_sample"
        results.append(_assemble(grams, methods, sketch_dims, n, device, per_param))
    return results


# ---- public entry points -------------------------------------------------------------------


def ghost_gram(
    model: nn.Module,
    input_ids: torch.Tensor,  # [N, L]
    attention_mask: torch.Tensor,  # [N, L]
    token_coeff: torch.Tensor,  # [N, L] float, zero on prompt and padding
    params: ParamSpec = None,
    *,
    route: str = "auto",
    per_param: bool = False,
    check: bool = True,
    chunk_elems: int = CHUNK_ELEMS,
) -> GramResult:
    """Exact K = G G^T from one forward and one backward (route: auto | ghost | materialize).

    params: {name: parameter}, a name regex, or None for every trainable parameter.
    The model's .grad fields are untouched and the hooks are removed on return.
    """
    if route not in ("auto", "ghost", "materialize"):
        raise ValueError(f"unknown route {route!r}")
    return _hooked_grams(
        model,
        input_ids,
        attention_mask,
        [token_coeff],
        _resolve(model, params),
        route=route,
        per_param=per_param,
        check=check,
        chunk_elems=chunk_elems,
    )[0]


def sketch_gram(
    model: nn.Module,
    input_ids: torch.Tensor,  # [N, L]
    attention_mask: torch.Tensor,  # [N, L]
    token_coeff: torch.Tensor,  # [N, L]
    params: ParamSpec = None,
    *,
    sketch_dim: int = 4096,
    seed: int = 0,
    per_param: bool = False,
    check: bool = True,
) -> GramResult:
    """Unbiased Kronecker-sketch estimate of K (error bound in the module docstring)."""
    return _hooked_grams(
        model,
        input_ids,
        attention_mask,
        [token_coeff],
        _resolve(model, params),
        route="sketch",
        sketch_dim=sketch_dim,
        seed=seed,
        per_param=per_param,
        check=check,
    )[0]


def naive_gram(
    model: nn.Module,
    input_ids: torch.Tensor,  # [N, L]
    attention_mask: torch.Tensor,  # [N, L]
    token_coeff: torch.Tensor,  # [N, L]
    params: ParamSpec = None,
    *,
    per_param: bool = False,
) -> GramResult:
    """Reference: one backward per rollout, G [N, P] stacked in float64, K = G G^T."""
    return per_rollout_grams(
        model,
        input_ids,
        attention_mask,
        {"k": token_coeff},
        params,
        method="per_sample",
        per_param=per_param,
    )["k"]


def per_rollout_grams(
    model: nn.Module,
    input_ids: torch.Tensor,  # [N, L]
    attention_mask: torch.Tensor,  # [N, L]
    token_coeffs: Mapping[str, torch.Tensor],  # name -> [N, L]
    params: ParamSpec = None,
    *,
    method: str = "auto",
    sketch_dim: int = 4096,
    seed: int = 0,
    per_param: bool = False,
) -> dict[str, GramResult]:
    """Grams for several coefficient sets (e.g. {"adv": A*w, "score": w}) from one forward.

    K_adv = diag(a) K_score diag(a) only when advantages are constant per rollout; per-token
    advantages need their own coefficient set, hence this general form.
    """
    if method not in METHODS:
        raise ValueError(f"unknown gram method {method!r}; expected one of {METHODS}")
    params = _resolve(model, params)
    names, coeffs = list(token_coeffs), list(token_coeffs.values())
    n, device = input_ids.shape[0], input_ids.device
    if method == "per_sample":
        results = []
        for rows in rollout_objectives(model, input_ids, attention_mask, coeffs):
            grads = per_sample_grads(rows, params)
            grams = {name: g @ g.T for name, g in grads.items()}
            results.append(
                _assemble(grams, dict.fromkeys(grams, "per_sample"), {}, n, device, per_param)
            )
    else:
        results = _hooked_grams(
            model,
            input_ids,
            attention_mask,
            coeffs,
            params,
            route=method,
            sketch_dim=sketch_dim,
            seed=seed,
            per_param=per_param,
        )
    return dict(zip(names, results, strict=True))


def gram_for_method(
    method: str,
    model: nn.Module,
    input_ids: torch.Tensor,  # [N, L]
    attention_mask: torch.Tensor,  # [N, L]
    token_coeff: torch.Tensor,  # [N, L]
    params: ParamSpec = None,
    *,
    sketch_dim: int = 4096,
    seed: int = 0,
    per_param: bool = False,
) -> GramResult:
    """Dispatch on `analysis.gram_method`.

    auto: exact, per parameter the cheaper of ghost / materialize; ghost: exact, the ghost
    identity for every matrix parameter; per_sample: one backward per rollout (reference);
    sketch: unbiased estimate with per-parameter width `sketch_dim`, seeded by `seed`.
    """
    return per_rollout_grams(
        model,
        input_ids,
        attention_mask,
        {"k": token_coeff},
        params,
        method=method,
        sketch_dim=sketch_dim,
        seed=seed,
        per_param=per_param,
    )["k"]
