"""Gram matrices K = G G^T [N, N] of per-rollout gradients, without forming G [N, P].

Row i of G is grad f_i, f_i = sum_t token_coeff[i, t] log p(token t) (see `per_sample.py`). The
spectrum of G is sqrt(eig(K)) (`rank_measures.singular_values_from_gram`), so the per-rollout
matrices of docs/results.md (rollout_batch, rollout_group, group_batch) all come from one K:
`group_blocks`, `group_sum_gram`. K is accumulated in float64; the activations and output-
gradients it is built from keep the model's precision, and so do the per-rollout gradient
blocks, token inner products and block Gram products formed from them (as autograd's own
per-sample gradients would; `token_logprobs` differentiates a float32 log-softmax), so a float32
model agrees with the naive reference to ~1e-7 relative.

Routes, chosen per parameter (`GramResult.methods`):

- `ghost`: the ghost inner-product identity (Goodfellow 2015; Li et al. 2022, "Large language
  models can be strong differentially private learners"): for G_i = sum_t A_i,t B_i,t^T,
  <G_i, G_j> = sum_{t,s} (A_i,t . A_j,s)(B_i,t . B_j,s). Cost ~ N^2 T^2 (a + b).
- `materialize`: per-rollout gradients sum_t A_i,t B_i,t^T in row chunks, then their Gram.
  Cost ~ N T a b + N^2 a b.
- `vocab_rows`: an embedding (token-id factors, tied lm_head included): the per-rollout gradient
  on the V' rows the batch's ids select, G_ij = sum_{t in i, s in j} [id_t = id_s] <B_t, B_s>
  plus, for a tied weight, the lm_head part and the cross terms (`per_sample.vocab_rows_gram`).
  Cost ~ N^2 V' b, no V-sized tensor. `auto` picks the cheapest per parameter
  (`chunked_gram.route_costs`); on SmolLM2 that is materialize for every block weight and
  vocab_rows for the tied embedding.
- `direct`: biases and RMSNorm weights, whose per-rollout gradients are formed by the hooks.
- `sketch`: unbiased Kronecker sketch (below); vectors stay exact.
- `per_sample`: one backward per rollout, for layers the hooks do not cover, for parameters
  that fail the consistency check, and for the reference `naive_gram`.

Consistency check (exact routes): 1^T K 1 = ||sum_i G_i||^2 = ||grad sum_i f_i||^2, the ordinary
gradient from the same backward (sketch and vectors: sum_i Z_i against the projected gradient).
A mismatch means a use of the parameter the hooks missed (e.g. a weight read outside its
module's forward); that parameter then falls back to `per_sample`.

Row chunks (`row_chunk` = c > 0, `probes.gram_row_chunk`): the hooked forward/backward runs c
rollouts at a time and the check is made per chunk (`chunked_gram.py`). Peak memory is then one
chunk's graph plus what is kept across chunks: Z [N, k] per sketched parameter, but every
chunk's factors, N T (a + b) in the model's precision per parameter, for the exact routes. At 4B scale with a
256k vocabulary, `sketch` with small chunks is the route that fits (docs/gpu_memory_plan.md).

Sketch error. Each matrix parameter [a, b] is sketched as Z_i = U^T G_i V, U [a, k1], V [b, k2]
i.i.d. N(0, 1/k1), N(0, 1/k2) (identity on a side that already fits), k1 k2 <= sketch_dim
(Kronecker projection as in LoGra, Choe et al. 2024): cost N T (a k1 + b k2), never P x k. Then
E[Z Z^T] = K and, by Var(u^T C u) <= 2 ||C||_F^2 and ||C_ij||_F <= ||G_i||_F ||G_j||_F,

    E ||K_hat - K||_F^2 <= (tr K)^2 (2/k2 + (2/k1)(1 + 2/k2))     (`sketch.sketch_mse_bound`)

summed over parameters (independent sketches). A dense Gaussian sketch of width k would give
((tr K)^2 + ||K||_F^2) / k, i.e. relative error sqrt(2/k) for a rank-one K; the Kronecker
bound decays like k^(-1/4) (worst case: all G_i sharing a factor). Measured relative
Frobenius errors: 0.13 at k = 1024 and 0.09 at k = 4096 (bound 0.53 / 0.37) on the 0.9M-param
Llama of scripts/bench_gram.py; near the bound on the 2-layer test model, whose G_i have rank
<= 11. `auto` (exact) is usually affordable; sketch when N^2 T^2 and N T a b both are not.

Duplicate rollouts (`per_rollout_grams`, on by default): rows with the same tokens, attention
mask and coefficients have the same objective f_i, hence the same gradient G_i. The pass runs
on the distinct rows only and K [N, N] is read off their Gram by index, K_ij = K'_{u(i) u(j)}.
A low-entropy policy repeats completions (the CPU preset: ~half of a group's R rows at R = 8,
docs/speed_log.md), so this skips that share of the forward, backward and per-rollout gradients and
more of the Gram products. The values are the same up to rounding (the distinct rows run as a
smaller batch); `naive_gram`, the reference, runs every row.

Note: the model's dropout (if any) acts in each chunk's forward, and a fallback to `per_sample`
may run a chunk forward again; run probes in eval mode (with dropout, duplicates would differ).
"""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field

import torch
from torch import nn

from grpo_cli.probes.chunked_gram import ParamGrams, hooked_grams, per_sample_grams, used_positions
from grpo_cli.probes.per_sample import CHUNK_ELEMS, select_params
from grpo_cli.runtime.sharded import any_sharded

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


def distinct_rollouts(
    input_ids: torch.Tensor,  # [N, L]
    attention_mask: torch.Tensor,  # [N, L]
    coeffs: list[torch.Tensor],  # each [N, L]
) -> tuple[torch.Tensor, torch.Tensor] | None:  # ([U] rows kept, [N] each row's index in them)
    """Rows whose (tokens, mask, coefficients) appear first, in order, and for every row the
    position of its copy among them; None when all N rows are distinct (module docstring)."""
    n = input_ids.shape[0]
    key = torch.cat(
        [input_ids.double(), attention_mask.double()] + [c.double() for c in coeffs], dim=1
    )  # [N, L (2 + S)]: token ids and 0/1 masks are exact in float64
    _, inverse = torch.unique(key, dim=0, return_inverse=True)  # [N] in sorted-key order
    distinct = int(inverse.max()) + 1 if n else 0
    if distinct == n:
        return None
    rows = torch.arange(n, device=inverse.device)
    first = torch.full((distinct,), n, dtype=torch.long, device=inverse.device)
    first = first.scatter_reduce(0, inverse, rows, reduce="amin")  # [U] first row of each key
    order = first.argsort()  # keys by first appearance
    position = torch.empty_like(order)
    position[order] = torch.arange(distinct, device=order.device)
    return first[order], position[inverse]


def _expand(result: GramResult, index: torch.Tensor) -> GramResult:  # index [N] into [U]
    """K [N, N] from the distinct rows' K' [U, U]: K_ij = K'_{index_i, index_j}."""
    rows, cols = index.unsqueeze(1), index.unsqueeze(0)
    return GramResult(
        result.gram[rows, cols], result.methods,
        per_param={name: gram[rows, cols] for name, gram in result.per_param.items()},
        sketch_dims=result.sketch_dims,
    )


def _resolve(model: nn.Module, params: ParamSpec) -> dict[str, nn.Parameter]:
    if params is None:
        return select_params(model)
    if isinstance(params, str):
        return select_params(model, params)
    return dict(params)


def _result(parts: ParamGrams, n: int, device, per_param: bool) -> GramResult:
    total = torch.zeros(n, n, dtype=torch.float64, device=device)
    for gram in parts.grams.values():
        total += gram
    kept = dict(parts.grams) if per_param else {}
    return GramResult(total, parts.methods, per_param=kept, sketch_dims=parts.sketch_dims)


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
    row_chunk: int = 0,
) -> GramResult:
    """Exact K = G G^T from one forward and one backward (route: auto | ghost | materialize).

    params: {name: parameter}, a name regex, or None for every trainable parameter.
    row_chunk: rollouts per forward/backward (0: all N at once); see `chunked_gram.py`.
    The model's .grad fields are untouched and the hooks are removed on return.
    """
    if route not in ("auto", "ghost", "materialize"):
        raise ValueError(f"unknown route {route!r}")
    (parts,) = hooked_grams(
        model, input_ids, attention_mask, [token_coeff], _resolve(model, params),
        route=route, check=check, chunk_elems=chunk_elems, row_chunk=row_chunk,
    )
    return _result(parts, input_ids.shape[0], input_ids.device, per_param)


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
    row_chunk: int = 0,
) -> GramResult:
    """Unbiased Kronecker-sketch estimate of K (error bound in the module docstring)."""
    (parts,) = hooked_grams(
        model, input_ids, attention_mask, [token_coeff], _resolve(model, params),
        route="sketch", sketch_dim=sketch_dim, seed=seed, check=check, row_chunk=row_chunk,
    )
    return _result(parts, input_ids.shape[0], input_ids.device, per_param)


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
        merge_duplicates=False,
        skip_zero_rows=False,
    )["k"]


def per_rollout_grams(
    model: nn.Module,
    input_ids: torch.Tensor,  # [N, L]
    attention_mask: torch.Tensor,  # [N, L]
    token_coeffs: Mapping[str, torch.Tensor],  # name -> [N, L]
    params: ParamSpec = None,
    *,
    method: str = "auto", sketch_dim: int = 4096, seed: int = 0, per_param: bool = False,
    row_chunk: int = 0, check: bool = True, merge_duplicates: bool = True,
    skip_zero_rows: bool = True, own: Collection[str] | None = None,
) -> dict[str, GramResult]:
    """Grams for several coefficient sets (e.g. {"adv": A*w, "score": w}) from one forward
    per row chunk (row_chunk rollouts at a time; 0: all at once).

    `check=False` skips the consistency check (module docstring): it tests how the model uses
    its parameters, which does not change between calls, so a caller that has seen it pass on
    one batch may skip it afterwards and save the parameter gradients in the backward.

    `merge_duplicates`: run identical rollouts once (module docstring); False runs every row.
    `skip_zero_rows`: leave out the rows whose coefficients are all zero in every set (their G_i
    is exactly 0: zero rows and columns of K) and the all-padding columns at the batch's edges;
    an empty `methods` then means no pass ran. False runs the batch as given.

    `own`: the parameters whose Grams are computed; the rest of `params` are hooked and
    differentiated all the same (the same backward on every process of an FSDP2 run,
    `chunked_gram.hooked_grams`). Default: all of them.

    K_adv = diag(a) K_score diag(a) only when advantages are constant per rollout; per-token
    advantages need their own coefficient set, hence this general form.
    """
    if method not in METHODS:
        raise ValueError(f"unknown gram method {method!r}; expected one of {METHODS}")
    params = _resolve(model, params)
    names, coeffs = list(token_coeffs), list(token_coeffs.values())
    n_all, device = input_ids.shape[0], input_ids.device
    live_rows = None
    if skip_zero_rows:
        live = torch.stack([(c != 0).any(-1) for c in coeffs]).any(0).to(device)  # [N]
        if not bool(live.any()):  # every f_i is 0, so is every G_i: no pass at all
            zero = torch.zeros(n_all, n_all, dtype=torch.float64, device=device)
            kept = dict.fromkeys(params, zero) if per_param else {}
            return {name: GramResult(zero, {}, per_param=kept) for name in names}
        input_ids, attention_mask, coeffs, live_rows = _live_part(
            input_ids, attention_mask, coeffs, live
        )
    merged = distinct_rollouts(input_ids, attention_mask, coeffs) if merge_duplicates else None
    if merged is not None:
        kept, index = merged  # [U], [N]
        input_ids, attention_mask = input_ids[kept], attention_mask[kept]
        coeffs = [c[kept.to(c.device)] for c in coeffs]
    n = input_ids.shape[0]
    parts = _param_grams(model, input_ids, attention_mask, coeffs, params, method,
                         dict(sketch_dim=sketch_dim, seed=seed, row_chunk=row_chunk, check=check,
                              own=own))
    results = {name: _result(p, n, device, per_param) for name, p in zip(names, parts, strict=True)}
    if merged is not None:
        results = {name: _expand(result, index.to(device)) for name, result in results.items()}
    if live_rows is not None:
        results = {name: _embed(result, live_rows, n_all) for name, result in results.items()}
    return results


def _param_grams(model, input_ids, attention_mask, coeffs, params, method: str,
                 options: dict) -> list[ParamGrams]:
    """Each coefficient set's per-parameter Grams of the rows given, by `method`: per_sample
    (autograd to every parameter of `options["own"]`, default all) or the hooked routes;
    `options`: sketch_dim, seed, row_chunk, check, own (per_rollout_grams)."""
    if method != "per_sample":
        return hooked_grams(model, input_ids, attention_mask, coeffs, params, route=method, **options)
    if any_sharded(params.values()):
        raise ValueError("probes.gram_method=per_sample differentiates to the parameters, "
                         "which FSDP2 holds as DTensor shards; use auto, ghost or sketch")
    own = options["own"]
    owned = params if own is None else {name: p for name, p in params.items() if name in own}
    grams = per_sample_grams(model, input_ids, attention_mask, coeffs, owned,
                             row_chunk=options["row_chunk"])
    return [ParamGrams(g, dict.fromkeys(g, "per_sample")) for g in grams]


def _live_part(input_ids, attention_mask, coeffs, live):
    """The rows with a non-zero coefficient and the columns some kept row attends to (exact:
    a row whose coefficients are all zero has f_i = 0, so G_i = 0; a column no row attends to
    is padding, which no kept token sees and which carries no coefficient). Returns the trimmed
    inputs and the kept rows' indices [M] (None when every row is kept)."""
    rows = None if bool(live.all()) else live.nonzero().flatten()  # [M]
    if rows is not None:
        input_ids, attention_mask = input_ids[rows], attention_mask[rows]
        coeffs = [c[rows.to(c.device)] for c in coeffs]
    used = used_positions(attention_mask, coeffs).any(0)  # [L]
    if not bool(used.all()):
        first, last = int(used.nonzero()[0]), int(used.nonzero()[-1]) + 1  # all-padding edges
        input_ids, attention_mask = input_ids[:, first:last], attention_mask[:, first:last]
        coeffs = [c[:, first:last] for c in coeffs]
    return input_ids, attention_mask, coeffs, rows


def _embed(result: GramResult, rows: torch.Tensor, n: int) -> GramResult:  # rows [M] into [N]
    """K [N, N] from the kept rows' K [M, M]: zero rows and columns for the rows left out."""
    def full(gram: torch.Tensor) -> torch.Tensor:
        out = gram.new_zeros(n, n)
        out[rows.unsqueeze(1), rows.unsqueeze(0)] = gram
        return out

    return GramResult(full(result.gram), result.methods,
                      per_param={name: full(g) for name, g in result.per_param.items()},
                      sketch_dims=result.sketch_dims)


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
    row_chunk: int = 0,
) -> GramResult:
    """Dispatch on `probes.gram_method`.

    auto: exact, per parameter the cheaper of ghost / materialize; ghost: exact, the ghost
    identity for every matrix parameter; per_sample: one backward per rollout (reference);
    sketch: unbiased estimate with per-parameter width `sketch_dim`, seeded by `seed`.
    row_chunk: rollouts per forward/backward (0: all at once).
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
        row_chunk=row_chunk,
    )["k"]
