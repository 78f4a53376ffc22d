"""Per-rollout Grams from hooked forward/backward passes over row chunks (routes: `gram.py`).

With `row_chunk = c > 0` the N rollouts run c at a time: one hooked forward of the chunk, one
backward per coefficient set, and the chunk's graph (activations, logits) is freed before the
next chunk runs; `row_chunk = 0` is one chunk of all N rows. Rollouts do not interact
(`per_sample.py`), so each chunk yields its own rows' shares of every parameter, combined as:

- `sketch` and `direct` (vector) parameters: row i's sketch Z_i (or gradient) depends on rollout
  i only, so the chunks' rows are stacked and K = Z Z^T. Only Z [N, k] is kept per parameter.
  The projections are drawn once per parameter (`sketch.py`) and shared by every chunk.
- exact routes (`ghost`, `materialize`, `auto`): each chunk's factors (A, B) stay on the Gram's
  device in the model's precision and K is built from them after the last chunk (materialize:
  chunk by chunk over each chunk's own tokens; ghost and vocab_rows: the chunks stacked, padded).
  That keeps N T (a + b) x 4 bytes per parameter for a float32 model (2 for bf16; N T x 8 for an
  embedding's ids): at 4B scale, tens of GiB
  for a few layers, so the paper preset uses `sketch` with chunks.
- `per_sample`: one backward per rollout through the chunk's graph; rows stacked.

Consistency check, per chunk: the chunk's rows must add up to the chunk's ordinary gradient
(exact routes: 1^T K_cc 1 = ||sum_{i in chunk} G_i||^2 on the chunk's diagonal block of K). A
parameter that fails in any chunk, or whose hooks cover only some chunks, falls back to
`per_sample` for all rows; chunks whose graph is gone are run forward again for it.
"""

from __future__ import annotations

import warnings
from collections import defaultdict
from collections.abc import Collection
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn

from grpo_cli.probes.per_sample import (
    CHUNK_ELEMS,
    LayerCapture,
    ParamTerms,
    ghost_gram_terms,
    materialized_gram,
    per_sample_grads,
    rollout_objectives,
    sketched_rows,
    vocab_rows_gram,
)
from grpo_cli.probes.sketch import Projections, project_gradient, sketch_projections
from grpo_cli.runtime.sharded import any_sharded

FactorPairs = list[tuple[torch.Tensor, torch.Tensor]]  # (A [c, T, a] or ids [c, T], B [c, T, b])


@dataclass
class ParamGrams:
    """Per-parameter Grams of one coefficient set."""

    grams: dict[str, torch.Tensor] = field(default_factory=dict)  # name -> [N, N] float64
    methods: dict[str, str] = field(default_factory=dict)  # name -> route that computed it
    # name -> (a, k1, b, k2): sketched parameter [a, b] and its projection widths
    sketch_dims: dict[str, tuple[int, int, int, int]] = field(default_factory=dict)


@dataclass
class ChunkShare:
    """One parameter's share of one row chunk, for one coefficient set."""

    kind: str  # "unused" (no use reaches the objective) | "direct" | "sketch" | "exact"
    ok: bool = True  # the chunk's consistency check (exact: settled once K is built)
    rows: torch.Tensor | None = None  # [c, k] gradients (direct) or sketches Z (sketch)
    terms: FactorPairs = field(default_factory=list)  # exact: the chunk's factors (model precision)
    shape: tuple[int, int] = (0, 0)  # exact: the parameter's [a, b]
    grad_sq: torch.Tensor | None = None  # exact: ||chunk gradient||^2, float64 (None: no check)


def row_spans(n: int, row_chunk: int) -> list[slice]:
    """Rows of each forward/backward: all N at once when row_chunk <= 0 or >= N."""
    step = n if row_chunk <= 0 else min(row_chunk, n)
    return [slice(start, min(start + step, n)) for start in range(0, n, max(step, 1))]


def used_positions(attention_mask: torch.Tensor, coeffs: list[torch.Tensor]) -> torch.Tensor:
    """[N, L] bool: the positions a row attends to or holds a coefficient at; the rest are
    padding, which no kept token sees and which carries no coefficient."""
    used = attention_mask.bool()
    for c in coeffs:
        used = used | (c != 0).to(used.device)
    return used


def width_order(attention_mask: torch.Tensor, coeffs: list[torch.Tensor], row_chunk: int
                ) -> tuple[torch.Tensor | None, list[int]]:
    """(row order [N] or None, each chunk's columns): with row chunks (0 < row_chunk < N) the
    rows run widest first, so that each chunk stops at its own widest row's last used column
    (the columns after it are padding in every row of the chunk: no row attends to them, and no
    coefficient sits there). Without, one chunk of every column."""
    n, width = attention_mask.shape
    if row_chunk <= 0 or row_chunk >= n:
        return None, [width] * len(row_spans(n, row_chunk))
    used = used_positions(attention_mask, coeffs)
    columns = torch.arange(1, width + 1, device=used.device)
    ends = (used * columns).amax(dim=1)  # [N] each row's last used column + 1
    order = torch.argsort(ends, descending=True, stable=True)
    ends = ends[order].tolist()
    return order, [ends[span.start] for span in row_spans(n, row_chunk)]


def check_rtol(model: nn.Module) -> float:
    dtype = next(model.parameters()).dtype
    return 1e-4 if dtype in (torch.float32, torch.float64) else 5e-2


def _close(x: torch.Tensor, y: torch.Tensor, scale: float, rtol: float) -> bool:
    return float((x - y).norm()) <= rtol * max(scale, float(y.norm()), 1e-300)


def _squared_norm(t: torch.Tensor, chunk_elems: int) -> torch.Tensor:  # float64 scalar
    """||t||^2 in float64 without a float64 copy of all of t."""
    flat = t.reshape(-1)
    total = torch.zeros((), dtype=torch.float64, device=t.device)
    for start in range(0, flat.numel(), chunk_elems):
        total += flat[start : start + chunk_elems].double().pow(2).sum()
    return total


def _stack_rows(chunks: list[torch.Tensor]) -> torch.Tensor:  # [N, k]
    return chunks[0] if len(chunks) == 1 else torch.cat(chunks)


def _pad_tokens(x: torch.Tensor, tokens: int) -> torch.Tensor:  # [c, T, ...] -> [c, tokens, ...]
    """Zeros appended on the token dim: a zero B row (or id 0 beside it) adds nothing to G_i."""
    if x.shape[1] == tokens:
        return x
    return F.pad(x, [0, 0] * (x.dim() - 2) + [0, tokens - x.shape[1]])


def _uses_match(parts: list[FactorPairs]) -> bool:
    """Every block has the same uses of the parameter, with factors of the same kinds (a use
    missing in one block means a hook missed it)."""
    return len({len(terms) for terms in parts}) == 1 and all(
        len({a.dtype for a, _ in uses}) == 1 for uses in zip(*parts, strict=True))


def stack_chunk_terms(per_chunk: list[FactorPairs]) -> FactorPairs | None:
    """Each factor pair's rows stacked over the chunks; None if the chunks' factors differ."""
    if len(per_chunk) == 1:
        return per_chunk[0]
    if not _uses_match(per_chunk):
        return None
    stacked = []
    for pairs in zip(*per_chunk, strict=True):  # one use of the parameter, every chunk
        tokens = max(b.shape[1] for _, b in pairs)
        stacked.append(
            (
                torch.cat([_pad_tokens(a, tokens) for a, _ in pairs]),
                torch.cat([_pad_tokens(b, tokens) for _, b in pairs]),
            )
        )
    return stacked


def route_costs(parts: list[FactorPairs], rows: int, cols: int) -> dict[str, float]:
    """Multiply-adds of each exact route for one parameter [rows, cols] from its factors over
    blocks of rollouts (`parts`; N rollouts in all, T tokens over its uses): ghost ~ N^2 T^2 (a +
    b) / 2, materialize ~ N T a b + N^2 a b / 2, and, when some factor is token ids (an
    embedding), vocab_rows ~ N T b + N T_D V' b + N^2 V' b plus the dense factors' own cheaper
    route (`per_sample.vocab_rows_gram`). Materialize runs block by block over each block's own
    T; the others over the blocks stacked, each padded to the longest."""
    n = sum(terms[0][1].shape[0] for terms in parts)
    uses = list(zip(*parts, strict=True))  # each use of the parameter, in every block

    def stacked_tokens(which) -> int:  # T of the stacked blocks over the uses `which`
        return sum(max(b.shape[1] for _, b in uses[k]) for k in which)

    t = stacked_tokens(range(len(uses)))
    ids = [k for k, pairs in enumerate(uses) if pairs[0][0].dtype == torch.long]
    dense = [k for k in range(len(uses)) if k not in ids]
    a_eff = 1 if len(ids) == len(uses) else rows
    row_tokens = sum(terms[0][1].shape[0] * sum(b.shape[1] for _, b in terms) for terms in parts)
    costs = {"ghost": n * n * t * t * (a_eff + cols) / 2,
             "materialize": row_tokens * rows * cols + n * n * rows * cols / 2}
    if ids:
        kept = int(torch.unique(torch.cat([a.reshape(-1) for k in ids for a, _ in uses[k]])).numel())
        own = min(route_costs([[terms[k] for k in dense] for terms in parts], rows, cols).values()) if dense else 0.0
        costs["vocab_rows"] = own + n * t * cols + n * stacked_tokens(dense) * kept * cols + n * n * kept * cols
    return costs


def exact_gram(parts: list[FactorPairs], rows: int, cols: int, route: str, chunk_elems: int):
    """(K [N, N], route) from a parameter's factors over consecutive blocks of rollouts
    (`parts`, each over its own tokens); (None, "") when the blocks' uses differ. `auto` takes
    the cheapest of `route_costs` per parameter."""
    if not _uses_match(parts):
        return None, ""
    if route == "auto":
        costs = route_costs(parts, rows, cols)
        route = min(costs, key=costs.get)
    if route not in ("vocab_rows", "ghost"):
        return materialized_gram(parts, rows, cols, chunk_elems), "materialize"
    terms = stack_chunk_terms(parts)  # the blocks stacked, padded to the longest
    if route == "vocab_rows":
        dense = [(a, b) for a, b in terms if a.dtype != torch.long]
        own = exact_gram([dense], rows, cols, "auto", chunk_elems)[0] if dense else None
        return vocab_rows_gram(terms, rows, cols, own)[0], "vocab_rows"
    return ghost_gram_terms(terms, chunk_elems), "ghost"


@dataclass
class ShareBuilder:
    """Turns one chunk's factors of a parameter into its `ChunkShare` for the chosen route."""

    route: str  # auto | ghost | materialize | sketch
    rtol: float  # consistency-check tolerance
    device: torch.device  # where kept rows and factors live (the Gram's device)
    sketch_dim: int
    seed: int
    chunk_elems: int
    projections: dict[str, Projections] = field(default_factory=dict)  # drawn once per parameter
    # name -> (a, k1, b, k2): sketched parameter [a, b] and its projection widths
    sketch_dims: dict[str, tuple[int, int, int, int]] = field(default_factory=dict)

    def __call__(self, name: str, terms: ParamTerms, grad: torch.Tensor | None) -> ChunkShare:
        if not terms.matrix and terms.vector is None:
            return ChunkShare("unused", ok=grad is None or float(grad.norm()) == 0.0)
        if terms.vector is not None:
            vec = terms.vector  # [c, numel]
            ok = grad is None or _close(
                vec.sum(0), grad.reshape(-1).double(), float(vec.norm(dim=1).sum()), self.rtol
            )
            return ChunkShare("direct", ok, rows=vec.to(self.device))
        a, b = terms.rows, terms.cols
        if self.route != "sketch":
            terms_here = [(x.to(self.device), y.to(self.device)) for x, y in terms.matrix]
            grad_sq = None if grad is None else _squared_norm(grad, self.chunk_elems)
            return ChunkShare("exact", terms=terms_here, shape=(a, b), grad_sq=grad_sq)
        if name not in self.projections:
            self.projections[name] = sketch_projections(
                name, a, b, self.sketch_dim, self.seed, terms.matrix[0][1].device
            )
            self.sketch_dims[name] = (a, self.projections[name][2], b, self.projections[name][3])
        u, v, _, _ = self.projections[name]
        z = sketched_rows(terms.matrix, u, v, a)  # [c, k1*k2]
        ok = grad is None or _close(
            z.sum(0),
            project_gradient(grad.reshape(a, b), u, v, self.chunk_elems).reshape(-1),
            float(z.norm(dim=1).sum()),
            self.rtol,
        )
        return ChunkShare("sketch", ok, rows=z.to(self.device))

    def combine(self, shares: list[ChunkShare], spans: list[slice]):
        """(K [N, N], route) from every chunk's share of one parameter; (None, "") on a failed
        check or factors that differ between chunks."""
        n = spans[-1].stop
        kinds = {share.kind for share in shares}
        if len(kinds) != 1 or not all(share.ok for share in shares):
            return None, ""
        kind = kinds.pop()
        if kind == "unused":
            return torch.zeros(n, n, dtype=torch.float64, device=self.device), "direct"
        if kind in ("direct", "sketch"):
            z = _stack_rows([share.rows for share in shares])  # [N, k]
            return z @ z.T, kind
        gram, method = exact_gram([share.terms for share in shares], *shares[0].shape, self.route,
                                  self.chunk_elems)
        if gram is None:
            return None, ""
        for span, share in zip(spans, shares, strict=True):
            if share.grad_sq is None:  # check=False
                continue
            block = gram[span, span]  # [c, c]: the chunk's own Gram
            scale = float(block.diagonal().clamp(min=0).sqrt().sum()) ** 2
            if not _close(block.sum(), share.grad_sq, scale, self.rtol):
                return None, ""
        return gram, method


def _backward_shares(rows, capture, params, builder, check, own) -> dict[str, ChunkShare]:
    """One backward of sum_i rows_i to every captured output: each covered parameter in `own`'s
    share of the chunk."""
    covered, targets = [name for name in capture.covered if name in own], capture.targets()
    check_params = [params[name] for name in covered] if check else []
    inputs = targets + check_params
    grads = (
        torch.autograd.grad(rows.sum(), inputs, retain_graph=True, allow_unused=True)
        if inputs
        else ()
    )
    by_output = {id(t): g for t, g in zip(targets, grads[: len(targets)], strict=True)}
    full = dict(zip(covered, grads[len(targets) :], strict=True)) if check else {}
    return {name: builder(name, capture.terms(name, by_output), full.get(name)) for name in covered}


def _hooked_chunk(model, input_ids, attention_mask, coeffs, params, builder, check, own):
    """One chunk: a hooked forward, then per coefficient set the covered parameters' shares
    and, for parameters the hooks do not cover, per-rollout gradients [c, numel] (of those in
    `own` only)."""
    with LayerCapture(model, params, input_ids.shape[0]) as capture:
        rows_per_set = rollout_objectives(model, input_ids, attention_mask, coeffs)
    uncovered = {name: p for name, p in params.items() if name not in capture.covered and name in own}
    if uncovered and any_sharded(params.values()):
        _refuse_sharded_fallback(uncovered, "the hooks do not capture every use")
    shares, samples = [], []
    for rows in rows_per_set:
        shares.append(_backward_shares(rows, capture, params, builder, check, own))
        samples.append(per_sample_grads(rows, uncovered))
    return shares, samples  # the chunk's graph is freed on return


def _per_sample_chunk(model, input_ids, attention_mask, coeffs, wanted):
    """One forward, then one backward per rollout: {name: [c, numel]} of wanted[s] per set s."""
    rows_per_set = rollout_objectives(model, input_ids, attention_mask, coeffs)
    return [per_sample_grads(rows, ps) for rows, ps in zip(rows_per_set, wanted, strict=True)]


def per_sample_grams(model, input_ids, attention_mask, coeffs, params, *, row_chunk=0):
    """Per coefficient set, {name: K [N, N]} from one backward per rollout, c rollouts a forward."""
    chunks = [
        _per_sample_chunk(
            model, input_ids[span], attention_mask[span], [c[span] for c in coeffs],
            [params] * len(coeffs),
        )
        for span in row_spans(input_ids.shape[0], row_chunk)
    ]  # chunk -> set -> name -> [c, numel]
    grams = []
    for s in range(len(coeffs)):
        per_name = {name: _stack_rows([chunk[s][name] for chunk in chunks]) for name in params}
        grams.append({name: g @ g.T for name, g in per_name.items()})
    return grams


def hooked_grams(
    model: nn.Module,
    input_ids: torch.Tensor,  # [N, L]
    attention_mask: torch.Tensor,  # [N, L]
    coeffs: list[torch.Tensor],  # each [N, L]
    params: dict[str, nn.Parameter],
    *,
    route: str,
    sketch_dim: int = 4096,
    seed: int = 0,
    check: bool = True,
    chunk_elems: int = CHUNK_ELEMS,
    row_chunk: int = 0,
    own: Collection[str] | None = None,
) -> list[ParamGrams]:
    """Per coefficient set, every parameter's Gram: hooked routes, per_sample where needed.
    Row chunks take the rows widest first, each chunk cut after its last used column
    (`width_order`); the Grams come back in the rows' order.

    `own`: the parameters whose Grams this process computes (default: all of `params`). The
    others are hooked and their outputs differentiated all the same, so every process runs the
    same forward and backward: under FSDP2 each layer's all-gathers then match across processes.
    FSDP2's parameters (DTensor shards) cannot be differentiated to (autograd finds them "not
    used in the graph"; the forward runs on gathered copies), so for them the consistency check
    is off (the trainer-norm cross-check, `grad_norm_mismatch`, remains) and a parameter the
    hooks miss is refused instead of falling back to per_sample."""
    own = set(params) if own is None else set(own)
    sharded = any_sharded(params.values())
    check = check and not sharded
    spans = row_spans(input_ids.shape[0], row_chunk)
    order, widths = width_order(attention_mask, coeffs, row_chunk)
    if order is not None:
        input_ids, attention_mask = input_ids[order], attention_mask[order]
        coeffs = [c[order.to(c.device)] for c in coeffs]
    chunks = [(input_ids[span, :w], attention_mask[span, :w], [c[span, :w] for c in coeffs])
              for span, w in zip(spans, widths, strict=True)]  # views
    device = input_ids.device  # the Gram's
    builder = ShareBuilder(route, check_rtol(model), device, sketch_dim, seed, chunk_elems)
    shares = [defaultdict(dict) for _ in coeffs]  # set -> name -> chunk -> ChunkShare
    samples = [defaultdict(dict) for _ in coeffs]  # set -> name -> chunk -> [c, numel]
    for k, (chunk_ids, chunk_mask, chunk_coeffs) in enumerate(chunks):
        chunk_shares, chunk_samples = _hooked_chunk(
            model, chunk_ids, chunk_mask, chunk_coeffs, params, builder, check, own,
        )
        for s in range(len(coeffs)):
            for name, share in chunk_shares[s].items():
                shares[s][name][k] = share
            for name, rows in chunk_samples[s].items():
                samples[s][name][k] = rows
    owned = {name: p for name, p in params.items() if name in own}
    settled = [_settle(shares[s], owned, spans, builder) for s in range(len(coeffs))]
    fallbacks = [fallback for _, fallback in settled]
    if sharded and any(fallbacks):
        _refuse_sharded_fallback(sorted({n for f in fallbacks for n in f}), "their hooks missed a row chunk")
    _rerun_for_fallbacks(model, chunks, params, fallbacks, samples)
    return _completed(settled, samples, len(spans), order, device)


def _completed(settled, samples, chunks: int, order: torch.Tensor | None, device) -> list[ParamGrams]:
    """Each set's ParamGrams with the per_sample Grams of its fallback parameters filled in from
    their rows (`samples`: set -> name -> chunk -> [c, numel]), in the rows' order again where
    `order` [N] took them widest first."""
    for (result, fallback), rows_by_name in zip(settled, samples, strict=True):
        for name in fallback:
            g = _stack_rows([rows_by_name[name][k] for k in range(chunks)])  # [N, numel]
            result.grams[name], result.methods[name] = g @ g.T, "per_sample"
    if order is not None:  # back to the rows' order
        back = torch.argsort(order).to(device)
        for result, _ in settled:
            result.grams = {name: g[back][:, back] for name, g in result.grams.items()}
    return [result for result, _ in settled]


def _refuse_sharded_fallback(names, why: str):
    raise ValueError(
        f"per-rollout Grams of FSDP2-sharded parameters {sorted(names)}: {why}, and a DTensor "
        "shard cannot be differentiated one rollout at a time (per_sample); leave them out of "
        "probes.param_regex"
    )


def _settle(shares, params, spans, builder) -> tuple[ParamGrams, list[str]]:
    """One coefficient set: the Grams of the parameters whose hooks held in every chunk, and
    the names left to per_sample (warning about those whose check failed)."""
    result, fallback, missed = ParamGrams(), [], []
    for name in params:
        by_chunk = shares.pop(name, {})  # popped: each parameter's factors are freed once used
        gram, method = None, ""
        if len(by_chunk) == len(spans):
            gram, method = builder.combine([by_chunk[k] for k in range(len(spans))], spans)
        if gram is None:
            fallback.append(name)
            if by_chunk:  # hooked in some chunk, then failed the check or missed a chunk
                missed.append(name)
            continue
        result.grams[name], result.methods[name] = gram, method
        if method == "sketch":
            result.sketch_dims[name] = builder.sketch_dims[name]
    if missed:
        warnings.warn(
            f"per-rollout gradient hooks missed a use of {missed}; "
            "falling back to one backward per rollout",
            stacklevel=4,
        )
    return result, fallback


def _rerun_for_fallbacks(model, chunks, params, fallbacks, samples) -> None:
    """Per-rollout gradients of fallback parameters for the chunks whose graph is gone;
    `chunks`: each chunk's (input_ids, attention_mask, coeffs)."""
    for k, (chunk_ids, chunk_mask, chunk_coeffs) in enumerate(chunks):
        wanted = [
            {name: params[name] for name in fallback if k not in samples[s][name]}
            for s, fallback in enumerate(fallbacks)
        ]
        if not any(wanted):
            continue
        got = _per_sample_chunk(model, chunk_ids, chunk_mask, chunk_coeffs, wanted)
        for s, per_name in enumerate(got):
            for name, rows in per_name.items():
                samples[s][name][k] = rows
