"""Per-rollout gradients: which parameters span P, the per-rollout objectives, and the forward
hooks that expose each layer's per-rollout gradient in factored form (used by `gram.py`).

Rollout i's scalar is f_i = sum_t token_coeff[i, t] * log p(input_ids[i, t] | prefix), row i of
G [N, P] is grad f_i. Rollouts in a batch do not interact (causal LM, attention mask, no batch
norm), so one forward of the batch and one backward of sum_i f_i give every rollout's
activations X_i [T, d_in] and output-gradients D_i [T, d_out] at a layer, and its per-rollout
weight gradient is G_i = sum_t D_i,t X_i,t^T (Goodfellow 2015, "Efficient per-example gradient
computations"). Supported layers and the factors they yield:

| layer | parameter | per-rollout gradient |
| --- | --- | --- |
| `nn.Linear` | weight [out, in] | sum_t D_t X_t^T: matrix term (D, X) |
| `nn.Linear` | bias [out] | sum_t D_t: vector |
| `nn.Embedding` | weight [V, d] | sum_t onehot(id_t) D_t^T: matrix term (ids, D), D = 0 at padding_idx |
| `*RMSNorm` (y = w * z) | weight [d] | sum_t D_t * z_t: vector (z recomputed and checked in the hook) |

A weight tied across layers (lm_head = embed_tokens) yields one term per use. Anything else
(a parameter of another layer type, or one used outside its module's forward) is left to
`per_sample_grads`: one backward per rollout through the same forward graph. The last section
turns the factors into the Gram of the per-rollout gradients, exactly or sketched (`gram.py`).
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
from torch import nn

from grpo_cli.algorithm.logprobs import accepts_logits_to_keep, logprobs_from_logits

CHUNK_ELEMS = 2**24  # float64 elements per intermediate block (128 MiB)
LOGITS_CHUNK_MB = 128.0  # float32 log-softmax copy per chunk of positions in the probe's forward

MATRIX_KINDS = {("linear", "weight"), ("embedding", "weight")}
VECTOR_KINDS = {("linear", "bias"), ("rmsnorm", "weight")}


def select_params(model: nn.Module, param_regex: str = ".*") -> dict[str, nn.Parameter]:
    """Trainable parameters whose name matches `param_regex` (re.search); a tied weight once."""
    pattern = re.compile(param_regex)
    return {
        name: p for name, p in model.named_parameters() if p.requires_grad and pattern.search(name)
    }


def rollout_objectives(
    model: nn.Module,
    input_ids: torch.Tensor,  # [N, L]
    attention_mask: torch.Tensor,  # [N, L]
    token_coeffs: Sequence[torch.Tensor],  # each [N, L], zero on prompt and padding
) -> list[torch.Tensor]:  # each [N]: f_i for one coefficient set, one shared forward
    """Per-rollout scalars f_i = sum_t coeff[i, t] log p(token t), with a graph to differentiate."""
    used = torch.stack([c != 0 for c in token_coeffs]).any(0).any(0)  # [L] columns with a coefficient
    first = int(used.nonzero()[0]) if bool(used.any()) else input_ids.shape[1] - 1
    with torch.enable_grad():
        logp = _logprobs_without_entropy(model, input_ids, attention_mask, max(first, 1))  # [N, L]
    return [(c.to(logp.device) * logp).sum(-1) for c in token_coeffs]


def _logprobs_without_entropy(
    model: nn.Module,
    input_ids: torch.Tensor,  # [N, L]
    attention_mask: torch.Tensor,  # [N, L]
    first: int = 1,  # first column whose log-prob is wanted (>= 1)
    chunk_mb: float = LOGITS_CHUNK_MB,  # float32 log-softmax per chunk of positions (0: one pass)
) -> torch.Tensor:  # [N, L] float32, zero before `first`
    """`algorithm.logprobs.token_logprobs`, same float32 ops and values, minus the entropy (three
    more [N, L, V] float32 tensors at the peak: 4.4 GiB for 2 x 760 tokens at 256k) and minus the
    logits of columns before `first - 1` (the prompt: their log-probs have zero coefficients, so
    leaving them out changes no gradient, and lm_head's hooked factors shrink to the kept columns).
    The logits are computed once (lm_head's hooks see one use); their float32 log-softmax runs in
    chunks of positions under checkpoint (`logprobs_from_logits`), so neither the float32 copy
    (1.45 GiB for 2 x 760 tokens at 256k) is kept for backward nor its float32 gradients (~4.4 GiB)
    exist at once."""
    width = input_ids.shape[1]
    position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)
    inputs = {"input_ids": input_ids, "attention_mask": attention_mask, "position_ids": position_ids}
    if accepts_logits_to_keep(model):
        inputs["logits_to_keep"] = width - first + 1  # columns first-1..L-1 predict first..L
    logits = model(**inputs).logits
    if logits.shape[1] != width - first + 1:  # a model without (or ignoring) logits_to_keep
        logits = logits[:, first - 1 :]
    picked = logprobs_from_logits(logits[:, :-1], input_ids[:, first:], chunk_mb)  # [N, L - first]
    return torch.cat([picked.new_zeros(picked.shape[0], first), picked], dim=1)


def per_sample_grads(
    rows: torch.Tensor,  # [N] per-rollout scalars sharing one graph
    params: dict[str, nn.Parameter],
    dtype: torch.dtype = torch.float64,
) -> dict[str, torch.Tensor]:  # name -> [N, numel]
    """Row i: grad of rows[i] w.r.t. each parameter, flattened; one backward per rollout.

    Uses torch.autograd.grad, so no parameter's .grad is touched. The graph is retained.
    """
    names, tensors = list(params), list(params.values())
    out = {
        name: rows.new_zeros(rows.shape[0], p.numel(), dtype=dtype) for name, p in params.items()
    }
    for i in range(rows.shape[0] if tensors else 0):
        grads = torch.autograd.grad(rows[i], tensors, retain_graph=True, allow_unused=True)
        for name, g in zip(names, grads, strict=True):
            if g is not None:
                out[name][i] = g.reshape(-1).to(dtype)
    return out


def _rmsnorm_eps(module: nn.Module) -> float | None:
    for attr in ("variance_epsilon", "eps"):
        eps = getattr(module, attr, None)
        if isinstance(eps, float):
            return eps
    return None


def layer_kind(module: nn.Module, role: str) -> str | None:
    """Which factored form a module's parameter has ("linear", "embedding", "rmsnorm"), or None."""
    if isinstance(module, nn.Linear) and role in ("weight", "bias"):
        return "linear"
    if isinstance(module, nn.Embedding) and role == "weight":
        plain = module.max_norm is None and not module.scale_grad_by_freq and not module.sparse
        return "embedding" if plain else None
    if (
        type(module).__name__.endswith("RMSNorm")
        and role == "weight"
        and module.weight.dim() == 1
        and len(list(module.parameters(recurse=False))) == 1
        and _rmsnorm_eps(module) is not None
    ):
        return "rmsnorm"
    return None


@dataclass
class LayerUse:
    """One call of a hooked module during the forward."""

    saved: torch.Tensor  # [N, ..., d] detached input (linear), ids (embedding) or z (rmsnorm)
    output: torch.Tensor  # [N, ..., d_out] the module's output, still in the graph


@dataclass
class ParamTerms:
    """One parameter's per-rollout gradient in factored form, float64."""

    matrix: list[tuple[torch.Tensor, torch.Tensor]] = field(default_factory=list)  # (A, B) pairs
    # A: [N, T, a] dense or [N, T] long ids (one-hot rows); B: [N, T, b]; G_i = sum_t A_i,t B_i,t^T
    vector: torch.Tensor | None = None  # [N, numel] per-rollout gradients, formed directly
    rows: int = 0  # a (the parameter's first dim) for matrix terms
    cols: int = 0  # b


class LayerCapture:
    """Context manager: forward hooks on the layers owning `params`; removed on exit.

    After the forward, `targets()` lists the module outputs to differentiate, and
    `terms(name, grads)` turns their gradients into that parameter's `ParamTerms`.
    `covered` names the parameters whose every use was captured; the rest need a fallback.
    """

    def __init__(
        self, model: nn.Module, params: dict[str, nn.Parameter], batch_size: int,
        keep_grads: bool = False,
    ):
        self.batch_size = batch_size  # N: every captured tensor must have it as first dim
        # keep_grads: record each captured output's gradient when a backward reaches it (the
        # training step's own backward, grpo_cli/probes/fused.py), in `grads` by id(output)
        self.keep_grads = keep_grads
        self.grads: dict[int, torch.Tensor] = {}
        by_id = {id(p): name for name, p in params.items()}
        self.owners: dict[str, list[tuple[str, nn.Module, str, str | None]]] = {
            n: [] for n in params
        }
        for module_name, module in model.named_modules():
            for role, p in module.named_parameters(recurse=False):
                if id(p) in by_id:
                    kind = layer_kind(module, role)
                    self.owners[by_id[id(p)]].append((module_name, module, role, kind))
        self.eligible = {name for name, owners in self.owners.items() if self._factorable(owners)}
        self.modules = {m: mod for n in self.eligible for m, mod, _, _ in self.owners[n]}
        self.uses: dict[str, list[LayerUse]] = {m: [] for m in self.modules}
        self.failed: set[str] = set()  # modules whose call could not be captured
        self._handles: list[torch.utils.hooks.RemovableHandle] = []
        self._recording = False

    @staticmethod
    def _factorable(owners: list[tuple[str, nn.Module, str, str | None]]) -> bool:
        kinds = {(kind, role) for _, _, role, kind in owners}
        return bool(owners) and (kinds <= MATRIX_KINDS or kinds <= VECTOR_KINDS)

    def __enter__(self) -> LayerCapture:
        for module_name, module in self.modules.items():
            hook = self._make_hook(module_name)
            self._handles.append(module.register_forward_hook(hook, with_kwargs=True))
        self._recording = True
        return self

    def __exit__(self, *exc) -> None:
        self.stop()
        for handle in self._handles:
            handle.remove()
        self._handles.clear()

    def stop(self) -> None:
        """Stop recording (call after the forward, so recomputation in backward is ignored)."""
        self._recording = False

    def _make_hook(self, module_name: str):
        def hook(module, args, kwargs, output):
            if not self._recording:
                return
            x = args[0] if args else next(iter(kwargs.values()))
            n = self.batch_size
            ok = (
                isinstance(output, torch.Tensor)
                and output.requires_grad
                and output.shape[0] == n
                and x.shape[0] == n
            )
            if ok and isinstance(module, (nn.Linear, nn.Embedding)):
                saved = x.detach()
            elif ok:  # rmsnorm: y = w * z; recompute z and check the identity holds
                xf = x.detach().float()
                z = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + _rmsnorm_eps(module))
                saved = z.to(x.dtype)
                ok = torch.allclose(  # the norm's form is structural: one row shows it
                    output.detach()[:1], module.weight.detach() * saved[:1], rtol=1e-4, atol=1e-6
                )
            if ok:
                self.uses[module_name].append(LayerUse(saved, output))
                if self.keep_grads:
                    output.register_hook(self._grad_store(id(output)))
            else:
                self.failed.add(module_name)

        return hook

    def _grad_store(self, key: int):
        grads = self.grads  # not self: output -> hook -> self -> output would be a cycle

        def store(grad: torch.Tensor) -> None:
            grads[key] = grad

        return store

    @property
    def covered(self) -> list[str]:
        return [
            n
            for n in self.owners
            if n in self.eligible and not any(m in self.failed for m, _, _, _ in self.owners[n])
        ]

    def targets(self) -> list[torch.Tensor]:
        return [use.output for m in self.modules for use in self.uses[m]]

    def terms(self, name: str, grads: dict[int, torch.Tensor | None]) -> ParamTerms:
        """Factored per-rollout gradient of parameter `name`; grads: id(output) -> its gradient."""
        out = ParamTerms()
        for module_name, module, role, kind in self.owners[name]:
            for use in self.uses[module_name]:
                d = grads.get(id(use.output))
                if d is None:  # output does not reach the objective
                    continue
                n, d_out = d.shape[0], d.shape[-1]
                d = d.reshape(n, -1, d_out)  # [N, T, d_out], the model's precision
                if kind == "linear" and role == "weight":
                    x = use.saved.reshape(n, -1, use.saved.shape[-1])
                    out.matrix.append((d, x))
                elif kind == "embedding":
                    ids = use.saved.reshape(n, -1)  # [N, T]
                    if module.padding_idx is not None:
                        d = d * (ids != module.padding_idx).unsqueeze(-1)
                    out.matrix.append((ids, d))
                else:  # vectors: linear bias sum_t D_t, rmsnorm weight sum_t D_t * z_t
                    z = use.saved.reshape(n, -1, d_out).to(torch.float64) if role != "bias" else 1
                    vec = (d.to(torch.float64) * z).sum(1)  # [N, numel]
                    out.vector = vec if out.vector is None else out.vector + vec
            if out.matrix:
                out.rows, out.cols = module.weight.shape
        return out


# ---- Grams of factored per-rollout gradients (float64) ---------------------------------------


def _token_inner(a1: torch.Tensor, a2: torch.Tensor) -> torch.Tensor:  # [n1*T1, n2*T2]
    """Inner products of row factors at every token pair; long tensors are one-hot ids."""
    if a1.dtype == torch.long and a2.dtype == torch.long:
        return (a1.reshape(-1, 1) == a2.reshape(1, -1)).to(torch.float64)
    if a2.dtype == torch.long:
        return a1.reshape(-1, a1.shape[-1])[:, a2.reshape(-1)].to(torch.float64)
    if a1.dtype == torch.long:
        return a2.reshape(-1, a2.shape[-1])[:, a1.reshape(-1)].T.to(torch.float64)
    inner = a1.reshape(-1, a1.shape[-1]) @ a2.reshape(-1, a2.shape[-1]).T  # factors' precision
    return inner.to(torch.float64)


def ghost_gram_terms(
    terms: list[tuple[torch.Tensor, torch.Tensor]], chunk_elems: int = CHUNK_ELEMS
) -> torch.Tensor:  # [N, N]
    """K_ij = sum_{p,q} sum_{t,s} (A^p_i,t . A^q_j,s)(B^p_i,t . B^q_j,s), in sample blocks."""
    n = terms[0][1].shape[0]
    t_max = max(b.shape[1] for _, b in terms)
    block = max(1, math.isqrt(chunk_elems // max(t_max * t_max, 1)))
    gram = torch.zeros(n, n, dtype=torch.float64, device=terms[0][1].device)
    for i0 in range(0, n, block):
        for j0 in range(i0, n, block):
            rows, cols = slice(i0, i0 + block), slice(j0, j0 + block)
            acc = 0.0
            for a_p, b_p in terms:
                for a_q, b_q in terms:
                    shape = (b_p[rows].shape[0], b_p.shape[1], b_q[cols].shape[0], b_q.shape[1])
                    prod = _token_inner(a_p[rows], a_q[cols]) * _token_inner(b_p[rows], b_q[cols])
                    acc = acc + prod.reshape(shape).sum(dim=(1, 3))  # [n_i, n_j]
            gram[rows, cols] = acc
            gram[cols, rows] = acc.T
    return gram


def _row_factor(a: torch.Tensor, r0: int, r1: int, dtype=torch.float64) -> torch.Tensor:
    """[N, T, r1 - r0]: rows r0..r1 of a factor (one-hot for token ids, in `dtype`)."""
    if a.dtype == torch.long:
        return (a.unsqueeze(-1) == torch.arange(r0, r1, device=a.device)).to(dtype)
    return a[..., r0:r1]


def materialized_gram(parts, rows: int, cols: int, chunk_elems: int = CHUNK_ELEMS) -> torch.Tensor:
    """Gram of the per-rollout gradients sum_t A_t B_t^T, formed a chunk of rows at a time.

    `parts`: the factor pairs of consecutive blocks of rollouts, each block over its own tokens
    (blocks of short rollouts are not padded to the longest). Each chunk's gradient rows and
    their Gram product stay in the factors' precision (as autograd's per-sample gradients would;
    a float64 copy of every chunk cost more than the product on SmolLM2, docs/speed_log.md); the
    chunks' products are summed in float64."""
    n = sum(terms[0][1].shape[0] for terms in parts)
    step = max(1, chunk_elems // max(n * cols, 1))
    first = parts[0][0][1]
    gram = torch.zeros(n, n, dtype=torch.float64, device=first.device)
    for r0 in range(0, rows, step):
        r1 = min(rows, r0 + step)
        g = torch.empty(n, r1 - r0, cols, dtype=first.dtype, device=first.device)  # gradient rows
        start = 0
        for terms in parts:  # per-rollout gradient rows in the factors' precision (as autograd's)
            block = g[start:start + terms[0][1].shape[0]]  # [c, r1 - r0, cols], contiguous
            start += block.shape[0]
            for use, (a, b) in enumerate(terms):
                a_rows = _row_factor(a, r0, r1, b.dtype).transpose(1, 2)  # [c, r1 - r0, T]
                if use == 0:
                    torch.bmm(a_rows, b, out=block)
                else:
                    block.baddbmm_(a_rows, b)
        flat = g.reshape(n, -1)  # [N, (r1 - r0) * cols]
        gram += (flat @ flat.T).to(torch.float64)
    return gram


def vocab_rows_gram(
    terms, rows: int, cols: int, dense_gram: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor]:  # (K [N, N] float64, the rows kept [V'])
    """K of an embedding-like parameter [rows, cols] (V rows, token ids in some factors) from the
    rows that the batch's ids select, V' of the V.

    An id factor's per-rollout gradient S_i = sum_t onehot(id_t) B_t^T is zero outside the ids
    the rollout holds, so S_i is a scatter of B by id into [V', cols] (no V-sized tensor), and
    <S_i, S_j> = sum_{t, s} [id_t = id_s] <B_t, B_s>. With dense factors on the same weight (a
    tied lm_head: G_i = D_i + S_i), K = K_D + S S^T + D' S^T + S D'^T, where D' is D restricted to
    the V' rows and K_D [N, N] (`dense_gram`, the dense factors' own Gram) is taken by a route of
    their own. Cost ~ N T cols (scatter) + N T_D V' cols (D') + N^2 V' cols, no cancellation."""
    ids_terms = [(a, b) for a, b in terms if a.dtype == torch.long]
    dense = [(a, b) for a, b in terms if a.dtype != torch.long]
    kept = torch.unique(torch.cat([a.reshape(-1) for a, _ in ids_terms]))  # [V'] sorted
    b0 = ids_terms[0][1]
    n = b0.shape[0]
    scattered = b0.new_zeros(n, kept.numel(), cols)  # [N, V', cols] S, the factors' precision
    for ids, b in ids_terms:
        where = torch.searchsorted(kept, ids.reshape(n, -1).contiguous())  # [N, T] position of each id in kept
        scattered.scatter_add_(1, where.unsqueeze(-1).expand(-1, -1, cols), b.reshape(n, -1, cols))
    s = scattered.reshape(n, -1)  # [N, V' cols]
    gram = (s @ s.T).to(torch.float64)
    if dense:
        restricted = sum(
            torch.einsum("ntv,ntc->nvc", a[..., kept].to(b.dtype), b) for a, b in dense
        ).reshape(n, -1)  # [N, V' cols] D'
        cross = (restricted @ s.T).to(torch.float64)  # [N, N] <D'_i, S_j>
        gram += cross + cross.T + dense_gram
    return gram, kept


def sketched_rows(terms, u: torch.Tensor | None, v: torch.Tensor | None, rows: int) -> torch.Tensor:
    """Z_i = U^T G_i V flattened [N, k1*k2], from the factors (G_i never formed)."""
    z = 0.0
    for a, b in terms:
        if u is None:
            pa = _row_factor(a, 0, rows).to(torch.float64)
        else:
            pa = u[a] if a.dtype == torch.long else a.to(torch.float64) @ u  # [N, T, k1]
        b = b.to(torch.float64)
        pb = b if v is None else b @ v  # [N, T, k2]
        z = z + torch.einsum("ntk,ntl->nkl", pa, pb)
    return z.reshape(z.shape[0], -1)
