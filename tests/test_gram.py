"""Per-rollout Gram matrices: ghost / materialize / sketch routes against the naive reference."""

from __future__ import annotations

import types

import pytest
import torch
import torch.nn.functional as F
from conftest import tiny_llama
from torch import nn
from transformers import LlamaForCausalLM

from grpo_cli.probes.chunked_gram import row_spans, stack_chunk_terms
from grpo_cli.probes.gram import (
    distinct_rollouts,
    ghost_gram,
    gram_for_method,
    group_blocks,
    group_sum_gram,
    naive_gram,
    per_rollout_grams,
    sketch_gram,
)
from grpo_cli.probes.per_sample import (
    materialized_gram,
    per_sample_grads,
    rollout_objectives,
    select_params,
)
from grpo_cli.probes.rank_measures import singular_values_from_gram
from grpo_cli.probes.sketch import sketch_mse_bound

VOCAB, PAD = 32, 0


def gram_llama(dtype=torch.float64, tie=False, bias=True, seed=0) -> LlamaForCausalLM:
    model = tiny_llama(
        seed=seed, vocab_size=VOCAB, hidden_size=16, intermediate_size=32, num_attention_heads=2,
        max_position_embeddings=64, tie_word_embeddings=tie, pad_token_id=PAD,
        attention_bias=bias, mlp_bias=bias,
    ).to(dtype).eval()
    with torch.no_grad():  # non-trivial norm weights and biases, so their gradients are generic
        for name, p in model.named_parameters():
            if "norm" in name or "bias" in name:
                p.add_(0.1 * torch.randn_like(p))
    return model


def padded_batch(prompt_lens, completion_lens, seed=0):
    """Left-padded prompts, right-padded completions; coefficients random on completion tokens."""
    gen = torch.Generator().manual_seed(seed)
    n, p, c = len(prompt_lens), max(prompt_lens), max(completion_lens)
    input_ids = torch.full((n, p + c), PAD, dtype=torch.long)  # [N, L]
    attention_mask = torch.zeros_like(input_ids)
    completion_mask = torch.zeros(n, p + c)
    for i, (pl, cl) in enumerate(zip(prompt_lens, completion_lens, strict=True)):
        input_ids[i, p - pl : p + cl] = torch.randint(1, VOCAB, (pl + cl,), generator=gen)
        attention_mask[i, p - pl : p + cl] = 1
        completion_mask[i, p : p + cl] = 1
    coeff = torch.randn(n, p + c, generator=gen) * completion_mask  # per-token advantages
    return input_ids, attention_mask, completion_mask, coeff


PROMPTS, COMPLETIONS = [3, 5, 4, 2, 5, 3], [2, 6, 4, 3, 1, 5]


@pytest.fixture(scope="module")
def batch():
    return padded_batch(PROMPTS, COMPLETIONS)


@pytest.fixture(scope="module")
def model64():
    return gram_llama(torch.float64)


@pytest.fixture(scope="module")
def reference64(model64, batch):
    ids, mask, _, coeff = batch
    return naive_gram(model64, ids, mask, coeff, per_param=True)


def independent_gram(model, batch, shift: int = 0) -> torch.Tensor:  # [N, N] float64
    """K from each rollout's gradient alone: its real tokens only (no padding), one float64
    forward and plain autograd per rollout, nothing shared with grpo_cli's Gram code.

    f_i = sum_t coeff[i, t] log p(x_t | x_<t) over rollout i's tokens; `shift=1` pairs each
    coefficient with the next token's log-prob instead (a deliberately misaligned reference).
    """
    ids, mask, _, coeff = batch
    params = [p for p in model.parameters() if p.requires_grad]
    rows = []
    for i in range(ids.shape[0]):
        real = mask[i].bool()  # [L]
        tokens, c = ids[i][real], coeff[i][real].double()  # [n], [n]
        logits = model(tokens[None]).logits[0].double()  # [n, V], positions 0..n-1
        logp = torch.log_softmax(logits[:-1], dim=-1).gather(1, tokens[1:, None])[:, 0]  # [n-1]
        weights = c[1:]  # coefficient of token t pairs with log p(x_t | x_<t), t = 1..n-1
        if shift:
            weights = torch.cat([weights[shift:], weights.new_zeros(shift)])
        grads = torch.autograd.grad((weights * logp).sum(), params, allow_unused=True)
        rows.append(torch.cat([
            (g if g is not None else torch.zeros_like(p)).reshape(-1).double()
            for g, p in zip(grads, params, strict=True)
        ]))
    per_rollout = torch.stack(rows)  # [N, P]
    return per_rollout @ per_rollout.T


@pytest.fixture(scope="module")
def independent64(model64, batch):
    return independent_gram(model64, batch)


ROUTES = [  # (method, row_chunk, sketch_dim): every route, one pass and in row chunks
    ("auto", 0, 0), ("ghost", 0, 0), ("materialize", 0, 0), ("per_sample", 0, 0),
    ("sketch", 0, VOCAB * 16), ("auto", 2, 0), ("materialize", 4, 0), ("per_sample", 4, 0),
]


@pytest.mark.parametrize(("method", "row_chunk", "sketch_dim"), ROUTES)
def test_every_route_matches_an_independent_unpadded_reference(
    model64, batch, independent64, method, row_chunk, sketch_dim
):
    ids, mask, _, coeff = batch
    if method == "materialize":
        gram = ghost_gram(model64, ids, mask, coeff, route=method, row_chunk=row_chunk).gram
    else:
        gram = gram_for_method(
            method, model64, ids, mask, coeff, sketch_dim=sketch_dim, row_chunk=row_chunk
        ).gram
    # the routes take log-softmax in float32, the reference in float64: hence 1e-6
    assert max_rel(gram, independent64) < 1e-6


def test_a_misaligned_reference_is_rejected(model64, batch, reference64, independent64):
    """The check above has teeth: pairing each coefficient with the next token is caught."""
    shifted = independent_gram(model64, batch, shift=1)
    assert max_rel(independent64, shifted) > 1e-2
    assert max_rel(reference64.gram, shifted) > 1e-2
    assert max_rel(reference64.gram, independent64) < 1e-6


def max_rel(x: torch.Tensor, ref: torch.Tensor) -> float:
    return float((x - ref).abs().max() / ref.abs().max())


def top_sv_rel(x: torch.Tensor, ref: torch.Tensor, k: int = 3) -> float:
    sx, sr = singular_values_from_gram(x)[:k], singular_values_from_gram(ref)[:k]
    return float(((sx - sr).abs() / sr).max())


@pytest.mark.parametrize("route", ["auto", "ghost", "materialize"])
def test_ghost_matches_naive_float64(model64, batch, reference64, route):
    ids, mask, _, coeff = batch
    result = ghost_gram(model64, ids, mask, coeff, route=route, per_param=True)
    assert result.gram.dtype == torch.float64 and result.gram.shape == (6, 6)
    assert max_rel(result.gram, reference64.gram) < 1e-6
    assert top_sv_rel(result.gram, reference64.gram) < 1e-6
    for name, ref in reference64.per_param.items():
        assert (
            float((result.per_param[name] - ref).abs().max())
            <= 1e-6 * float(ref.abs().max()) + 1e-300
        )
    assert "per_sample" not in result.methods.values()
    # auto: the embedding's ids select few of its rows (vocab_rows), the small blocks materialize
    expected = {"direct", "vocab_rows", "materialize"} if route == "auto" else {"direct", route}
    assert set(result.methods.values()) == expected
    assert result.methods["model.layers.0.input_layernorm.weight"] == "direct"


def test_float32_model_agreement(batch):
    """Measured: max entrywise deviation ~5e-8 of max|K| (float32 activations, float64 Gram)."""
    ids, mask, _, coeff = batch
    model = gram_llama(torch.float32)
    ref = naive_gram(model, ids, mask, coeff).gram
    result = ghost_gram(model, ids, mask, coeff).gram
    assert max_rel(result, ref) < 1e-5
    assert top_sv_rel(result, ref) < 1e-5


def test_tied_embeddings_and_padding_idx(batch):
    ids, mask, _, coeff = batch
    model = gram_llama(torch.float64, tie=True)
    assert model.lm_head.weight is model.model.embed_tokens.weight
    assert model.model.embed_tokens.padding_idx == PAD
    ref = naive_gram(model, ids, mask, coeff, per_param=True)
    for route in ("ghost", "materialize"):
        result = ghost_gram(model, ids, mask, coeff, route=route, per_param=True)
        assert "lm_head.weight" not in result.methods  # the tied weight counts once
        assert result.methods["model.embed_tokens.weight"] == route
        tied = "model.embed_tokens.weight"
        assert max_rel(result.per_param[tied], ref.per_param[tied]) < 1e-6
        assert max_rel(result.gram, ref.gram) < 1e-6


@pytest.mark.parametrize("row_chunk", [0, 4])
def test_whole_model_with_tied_embeddings_matches_an_independent_reference(batch, row_chunk):
    """Issue 23's exactness claim: every parameter selected (norms, biases, the tied
    lm_head = embed_tokens weight, whose per-rollout gradient is its lm_head part plus its
    embedding part, cross terms included) equals per-rollout autograd to 1e-6."""
    ids, mask, _, coeff = batch
    model = gram_llama(torch.float64, tie=True)
    assert model.lm_head.weight is model.model.embed_tokens.weight
    params = select_params(model, ".*")
    assert len(params) == sum(1 for _ in model.parameters())  # the whole model, the tie once
    independent = independent_gram(model, batch)
    result = per_rollout_grams(model, ids, mask, {"k": coeff}, ".*", row_chunk=row_chunk,
                               per_param=True)["k"]
    assert set(result.methods) == set(params)
    assert result.methods["model.embed_tokens.weight"] == "vocab_rows"
    assert "per_sample" not in result.methods.values()
    assert max_rel(result.gram, independent) < 1e-6
    reference = naive_gram(model, ids, mask, coeff, per_param=True)
    tied = reference.per_param["model.embed_tokens.weight"]
    assert max_rel(result.per_param["model.embed_tokens.weight"], tied) < 1e-6
    untied = gram_llama(torch.float64, tie=False)
    with torch.no_grad():  # the same weights, the head a separate copy: the cross terms differ
        untied.load_state_dict(model.state_dict())
    parts = naive_gram(untied, ids, mask, coeff, per_param=True).per_param
    separate = parts["model.embed_tokens.weight"] + parts["lm_head.weight"]  # no cross terms
    assert max_rel(tied, separate) > 1e-3


def test_vocab_rows_hand_computed():
    """One rollout per row, ids [[1, 1], [1, 2]], B rows e_1, e_2 / e_1, e_1 (V = 3, b = 2):
    S_0 = row 1 holds e_1 + e_2, S_1 = rows 1 and 2 hold e_1 each; K = [[2, 1], [1, 2]].
    With a dense factor beside it (a tied head) the cross terms come in."""
    from grpo_cli.probes.per_sample import vocab_rows_gram

    ids = torch.tensor([[1, 1], [1, 2]])
    b = torch.tensor([[[1.0, 0.0], [0.0, 1.0]], [[1.0, 0.0], [1.0, 0.0]]], dtype=torch.float64)
    gram, kept = vocab_rows_gram([(ids, b)], 3, 2, None)
    assert kept.tolist() == [1, 2]
    assert gram.tolist() == [[2.0, 1.0], [1.0, 2.0]]
    a = torch.randn(2, 2, 3, dtype=torch.float64)  # a dense term on the same [3, 2] weight
    x = torch.randn(2, 2, 2, dtype=torch.float64)
    terms = [(ids, b), (a, x)]
    dense = torch.einsum("nta,ntb->nab", a, x)  # [2, 3, 2]
    onehot = F.one_hot(ids, 3).double()
    full = (torch.einsum("nta,ntb->nab", onehot, b) + dense).reshape(2, -1)
    own = dense.reshape(2, -1) @ dense.reshape(2, -1).T
    assert torch.allclose(vocab_rows_gram(terms, 3, 2, own)[0], full @ full.T, atol=1e-12)


def test_route_costs_pick_per_parameter():
    """The cost model of `auto` in closed form: ghost ~ N^2 T^2 (a + b) / 2, materialize
    ~ N T a b + N^2 a b / 2; long sequences of a small layer materialize, short sequences of a
    wide one take the ghost products, an embedding with few distinct ids its vocab rows."""
    from grpo_cli.probes.chunked_gram import route_costs

    n, t = 4, 3
    wide = [(torch.zeros(n, t, 1000), torch.zeros(n, t, 1000))]
    assert route_costs([wide], 1000, 1000) == {"ghost": 16 * 9 * 2000 / 2,
                                             "materialize": 12 * 1e6 + 16 * 1e6 / 2}
    long = [(torch.zeros(n, 500, 8), torch.zeros(n, 500, 8))]
    costs = route_costs([long], 8, 8)
    assert costs["materialize"] < costs["ghost"]
    embedding = [(torch.tensor([[1, 2, 2]] * n), torch.zeros(n, t, 16))]
    costs = route_costs([embedding], 50000, 16)
    assert min(costs, key=costs.get) == "vocab_rows"
    assert costs["vocab_rows"] == n * t * 16 + 0 + n * n * 2 * 16
    # blocks of rollouts over 3 and 7 tokens: materialize runs each over its own, ghost stacked (7)
    blocks = [[(torch.zeros(2, 3, 8), torch.zeros(2, 3, 8))], [(torch.zeros(2, 7, 8), torch.zeros(2, 7, 8))]]
    costs = route_costs(blocks, 8, 8)
    assert costs == {"ghost": 16 * 49 * 16 / 2, "materialize": (2 * 3 + 2 * 7) * 64 + 16 * 64 / 2}


def test_zero_coefficient_rows_and_padding_columns_are_skipped_exactly(model64, batch):
    """Rows with no coefficient have G_i = 0: they are left out of the pass (with the columns
    only they and padding fill) and come back as zero rows of K; the rest equal the reference."""
    ids, mask, _, coeff = batch
    coeff = coeff.clone()
    coeff[[1, 4]] = 0  # the only rows with a 5-token prompt, and row 1 the only 6-token completion
    reference = naive_gram(model64, ids, mask, coeff, per_param=True)
    assert float(reference.gram[[1, 4]].abs().max()) == 0.0
    seen = []
    handle = model64.register_forward_pre_hook(
        lambda module, args, kwargs: seen.append(tuple(kwargs["input_ids"].shape)), with_kwargs=True
    )
    try:
        result = per_rollout_grams(model64, ids, mask, {"k": coeff}, per_param=True)["k"]
        empty = per_rollout_grams(model64, ids, mask, {"k": coeff * 0}, per_param=True)["k"]
    finally:
        handle.remove()
    assert seen == [(4, ids.shape[1] - 2)]  # 4 live rows, the first and last columns gone
    assert max_rel(result.gram, reference.gram) < 1e-9
    assert float(result.gram[[1, 4]].abs().max()) == 0.0
    for name, gram in reference.per_param.items():
        assert float((result.per_param[name] - gram).abs().max()) <= 1e-9 * float(gram.abs().max()) + 1e-300
    assert empty.methods == {} and float(empty.gram.abs().max()) == 0.0  # no pass at all
    assert set(empty.per_param) == set(reference.per_param)


def test_batch_rows_do_not_interact(model64, batch, reference64):
    """The premise of the one-forward routes: row i's gradient is the same computed alone."""
    ids, mask, _, coeff = batch
    params = select_params(model64)
    rows = []
    for i in range(ids.shape[0]):
        (f_i,) = rollout_objectives(model64, ids[i : i + 1], mask[i : i + 1], [coeff[i : i + 1]])
        grads = per_sample_grads(f_i, params)
        rows.append(torch.cat([g[0] for g in grads.values()]))
    stacked = torch.stack(rows)  # [N, P]
    assert max_rel(stacked @ stacked.T, reference64.gram) < 1e-9


def test_param_regex_restriction(model64, batch, reference64):
    ids, mask, _, coeff = batch
    regex = r"layers\.1\.(self_attn|mlp)"
    result = ghost_gram(model64, ids, mask, coeff, params=regex)
    assert result.methods and all("layers.1." in name for name in result.methods)
    assert len(result.methods) == 14  # 7 weights + 7 biases
    restricted_ref = naive_gram(model64, ids, mask, coeff, params=regex).gram
    assert max_rel(result.gram, restricted_ref) < 1e-6
    assert max_rel(reference64.restrict(regex), restricted_ref) < 1e-12
    assert max_rel(result.gram, reference64.gram) > 1e-3  # the restriction changes K


def test_grads_and_hooks_untouched(batch):
    ids, mask, _, coeff = batch
    model = gram_llama(torch.float64)
    params = list(model.parameters())
    for p in params[::2]:
        p.grad = torch.randn_like(p)
    before = [None if p.grad is None else p.grad.clone() for p in params]
    ghost_gram(model, ids, mask, coeff)
    sketch_gram(model, ids, mask, coeff, sketch_dim=16)
    for p, g in zip(params, before, strict=True):
        assert (p.grad is None) if g is None else torch.equal(p.grad, g)
    for module in model.modules():
        assert not module._forward_hooks and not module._forward_hooks_with_kwargs
        assert not module._backward_hooks and not module._forward_pre_hooks


class ScaleOnly(nn.Module):
    """An elementwise scale the hooks do not know: must go through the per-rollout fallback."""

    def __init__(self, dim: int):
        super().__init__()
        self.scale = nn.Parameter(1 + 0.1 * torch.randn(dim, dtype=torch.float64))

    def forward(self, x):
        return x * self.scale


def test_unsupported_layer_falls_back(batch):
    ids, mask, _, coeff = batch
    model = gram_llama(torch.float64)
    model.model.layers[0].post_attention_layernorm = ScaleOnly(16)
    result = ghost_gram(model, ids, mask, coeff, per_param=True)
    name = "model.layers.0.post_attention_layernorm.scale"
    assert result.methods[name] == "per_sample"
    ref = naive_gram(model, ids, mask, coeff, per_param=True)
    assert max_rel(result.per_param[name], ref.per_param[name]) < 1e-9
    assert max_rel(result.gram, ref.gram) < 1e-6


class ReusedHead(nn.Module):
    """Reads its head weight once through nn.Linear and once functionally (invisible to hooks)."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(1)
        self.embed = nn.Embedding(VOCAB, 8, dtype=torch.float64)
        self.head = nn.Linear(8, VOCAB, bias=False, dtype=torch.float64)

    def forward(self, input_ids, attention_mask, position_ids):
        h = torch.tanh(self.embed(input_ids)).cumsum(1)  # [N, L, 8] causal mixing
        logits = self.head(h) + 0.5 * F.linear(torch.sin(h), self.head.weight)
        return types.SimpleNamespace(logits=logits)


def test_missed_use_is_detected_and_falls_back(batch):
    ids, mask, _, coeff = batch
    model = ReusedHead()
    ref = naive_gram(model, ids, mask, coeff)
    with pytest.warns(UserWarning, match="missed a use"):
        result = ghost_gram(model, ids, mask, coeff)
    assert result.methods == {"embed.weight": "vocab_rows", "head.weight": "per_sample"}
    assert max_rel(result.gram, ref.gram) < 1e-9
    unchecked = ghost_gram(model, ids, mask, coeff, check=False)
    assert max_rel(unchecked.gram, ref.gram) > 1e-2  # what the check protects against


def test_sketch_error_within_documented_bound(model64, batch, reference64):
    ids, mask, _, coeff = batch
    sketch_dim, seeds = 64, 12
    results = [
        sketch_gram(model64, ids, mask, coeff, sketch_dim=sketch_dim, seed=s) for s in range(seeds)
    ]
    dims = results[0].sketch_dims
    assert dims["lm_head.weight"] == (VOCAB, 8, 16, 8)
    bound = (
        sum(
            sketch_mse_bound(float(reference64.per_param[name].trace()), *d)
            for name, d in dims.items()
        )
        ** 0.5
    )  # rms Frobenius error bound
    errors = [float((r.gram - reference64.gram).norm()) for r in results]
    assert errors[0] <= 3 * bound
    assert (sum(e * e for e in errors) / seeds) ** 0.5 <= 1.5 * bound
    mean = torch.stack([r.gram for r in results]).mean(0)  # unbiased: averaging shrinks the error
    assert float((mean - reference64.gram).norm()) < 0.5 * min(errors[0], bound)
    assert not torch.equal(results[0].gram, results[1].gram)
    again = sketch_gram(model64, ids, mask, coeff, sketch_dim=sketch_dim, seed=0)
    assert torch.equal(again.gram, results[0].gram)  # fixed seed, fixed sketch
    exact = sketch_gram(model64, ids, mask, coeff, sketch_dim=VOCAB * 16)  # every side fits
    assert max_rel(exact.gram, reference64.gram) < 1e-9


def test_sketch_bound_formula():
    assert sketch_mse_bound(2.0, 10, 10, 10, 10) == 0.0  # no side projected: exact
    assert sketch_mse_bound(2.0, 10, 5, 10, 10) == pytest.approx(4 * 2 / 5)
    assert sketch_mse_bound(2.0, 10, 5, 10, 4) == pytest.approx(4 * (2 / 4 + 2 / 5 * 1.5))


def test_group_helpers_hand_computed():
    gram = torch.arange(16, dtype=torch.float64).reshape(4, 4)
    blocks = group_blocks(gram, group_size=2)
    assert torch.equal(blocks, torch.tensor([[[0.0, 1], [4, 5]], [[10, 11], [14, 15]]]))
    assert torch.equal(group_sum_gram(gram, 2), torch.tensor([[10.0, 18], [42, 50]]))
    g = torch.tensor([[3.0, 0, 0], [0, 2, 0]])
    assert torch.allclose(
        singular_values_from_gram(g @ g.T), torch.tensor([3.0, 2.0], dtype=torch.float64)
    )


def test_group_helpers_match_explicit_gradients(model64, batch):
    ids, mask, _, coeff = batch
    group_size = 3
    params = select_params(model64)
    (rows,) = rollout_objectives(model64, ids, mask, [coeff])
    grads = torch.cat(list(per_sample_grads(rows, params).values()), dim=1)  # [N, P]
    gram = ghost_gram(model64, ids, mask, coeff).gram
    blocks = group_blocks(gram, group_size)  # [B, R, R]
    for b in range(2):
        g_b = grads[b * group_size : (b + 1) * group_size]
        assert max_rel(blocks[b], g_b @ g_b.T) < 1e-6
    summed = grads.reshape(2, group_size, -1).sum(1)  # [B, P]
    assert max_rel(group_sum_gram(gram, group_size), summed @ summed.T) < 1e-6


def test_outcome_advantages_group_structure(model64, batch):
    """R = 2, advantages (a, -a) per group and a zero-advantage group; K_adv = D_a K_score D_a."""
    ids, mask, completion_mask, _ = batch
    advantages = torch.tensor([0.7, -0.7, 1.3, -1.3, 0.0, 0.0])  # [N] outcome, per rollout
    grams = per_rollout_grams(
        model64,
        ids,
        mask,
        {"adv": advantages[:, None] * completion_mask, "score": completion_mask},
    )
    k_adv, k_score = grams["adv"].gram, grams["score"].gram
    # 1e-6, not 1e-12: token_logprobs backpropagates through float32 log-softmax
    assert max_rel(k_adv, advantages[:, None] * k_score * advantages[None, :]) < 1e-6
    blocks, score_blocks = group_blocks(k_adv, group_size=2), group_blocks(k_score, group_size=2)
    for b in range(2):
        # (a, -a) on two distinct rollouts: K_adv block = a^2 S K_score S, S = diag(1, -1), so
        # its spectrum is |a| times the score block's, and both have full rank 2
        sigma, sigma_score = (singular_values_from_gram(k[b]) for k in (blocks, score_blocks))
        a = float(advantages[2 * b].abs())
        assert torch.allclose(sigma, a * sigma_score, rtol=1e-6, atol=0)
        assert int((sigma > 1e-6 * sigma[0]).sum()) == 2
        off_diagonal_sign = torch.sign(blocks[b][0, 1]) * torch.sign(score_blocks[b][0, 1])
        assert off_diagonal_sign == -1  # opposite advantages flip the cross term
    assert torch.equal(blocks[2], torch.zeros(2, 2, dtype=torch.float64))
    assert torch.equal(k_adv[4:], torch.zeros(2, 6, dtype=torch.float64))


def test_gram_for_method_dispatch(model64, batch, reference64):
    ids, mask, _, coeff = batch
    for method in ("auto", "ghost", "per_sample"):
        result = gram_for_method(method, model64, ids, mask, coeff)
        assert max_rel(result.gram, reference64.gram) < 1e-6
    sketch = gram_for_method("sketch", model64, ids, mask, coeff, sketch_dim=VOCAB * 16)
    assert max_rel(sketch.gram, reference64.gram) < 1e-9
    with pytest.raises(ValueError, match="unknown gram method"):
        gram_for_method("svd", model64, ids, mask, coeff)
    with pytest.raises(ValueError, match="per_param=True"):
        gram_for_method("auto", model64, ids, mask, coeff).restrict(".*")


# ---- row chunks: several forward/backward passes of a few rollouts each -------------------


def gram_by_route(model, batch, route, row_chunk):
    ids, mask, _, coeff = batch
    if route == "materialize":
        return ghost_gram(model, ids, mask, coeff, route=route, per_param=True, row_chunk=row_chunk)
    return gram_for_method(
        route, model, ids, mask, coeff, sketch_dim=64, seed=3, per_param=True, row_chunk=row_chunk
    )


def test_row_spans():
    assert row_spans(6, 4) == [slice(0, 4), slice(4, 6)]
    assert row_spans(6, 0) == row_spans(6, 6) == row_spans(6, 100) == [slice(0, 6)]
    assert row_spans(3, 1) == [slice(0, 1), slice(1, 2), slice(2, 3)]


@pytest.mark.parametrize("route", ["auto", "ghost", "materialize", "per_sample", "sketch"])
def test_row_chunks_match_one_pass(model64, batch, reference64, route):
    """N = 6 padded rollouts of unequal length in chunks of 4 (+2) and of 1: the same K."""
    whole = gram_by_route(model64, batch, route, 0)
    for row_chunk in (4, 1):
        chunked = gram_by_route(model64, batch, route, row_chunk)
        assert chunked.methods == whole.methods
        assert chunked.sketch_dims == whole.sketch_dims
        assert max_rel(chunked.gram, whole.gram) < 1e-10  # measured: 0 (bitwise) in float64
        for name, ref in whole.per_param.items():
            deviation = float((chunked.per_param[name] - ref).abs().max())
            assert deviation <= 1e-10 * float(ref.abs().max())  # measured: <= 1e-15
    if route == "sketch":  # a real sketch, so equality needs the same projections in every chunk
        assert "sketch" in whole.methods.values()
        assert max_rel(whole.gram, reference64.gram) > 1e-3
    else:
        assert max_rel(whole.gram, reference64.gram) < 1e-6


def test_row_chunk_at_least_n_is_one_pass(model64, batch):
    for route in ("auto", "sketch"):
        whole = gram_by_route(model64, batch, route, 0)
        for row_chunk in (6, 100):
            assert torch.equal(gram_by_route(model64, batch, route, row_chunk).gram, whole.gram)


def test_row_chunks_with_two_coefficient_sets(model64, batch, reference64):
    ids, mask, completion_mask, coeff = batch
    coeffs = {"adv": coeff, "score": completion_mask.double()}
    for method in ("auto", "sketch"):
        whole = per_rollout_grams(model64, ids, mask, coeffs, method=method, sketch_dim=64)
        chunked = per_rollout_grams(
            model64, ids, mask, coeffs, method=method, sketch_dim=64, row_chunk=4
        )
        for key in coeffs:
            assert max_rel(chunked[key].gram, whole[key].gram) < 1e-10
        assert max_rel(chunked["adv"].gram, chunked["score"].gram) > 1e-2  # two distinct Grams
    assert max_rel(chunked["adv"].gram, reference64.gram) > 1e-3  # sketched (last method)
    exact = per_rollout_grams(model64, ids, mask, coeffs, row_chunk=4)
    assert max_rel(exact["adv"].gram, reference64.gram) < 1e-6


def test_stacked_chunk_factors_pad_tokens():
    """Chunks with different token counts: zero padding leaves every G_i unchanged."""
    gen = torch.Generator().manual_seed(0)
    rows, cols = 5, 3

    def chunk(n, t):  # one dense use and one embedding-like (ids) use of a [5, 3] weight
        dense = (torch.randn(n, t, rows, generator=gen, dtype=torch.float64),
                 torch.randn(n, t, cols, generator=gen, dtype=torch.float64))
        ids = (torch.randint(0, rows, (n, t), generator=gen),
               torch.randn(n, t, cols, generator=gen, dtype=torch.float64))
        return [dense, ids]

    chunks = [chunk(2, 3), chunk(3, 5)]
    stacked = stack_chunk_terms(chunks)
    assert stacked[0][0].shape == (5, 5, rows) and stacked[1][0].shape == (5, 5)

    def gradients(terms):  # [n, rows, cols]: sum_t A_t B_t^T
        dense, (ids, b) = terms
        onehot = F.one_hot(ids, rows).double()
        return torch.einsum("nta,ntb->nab", dense[0], dense[1]) + torch.einsum(
            "nta,ntb->nab", onehot, b
        )

    g = torch.cat([gradients(c) for c in chunks]).reshape(5, -1)
    gram = materialized_gram([stacked], rows, cols)
    assert torch.allclose(gram, g @ g.T, rtol=1e-12, atol=0)
    # the same from the chunks over their own tokens, unpadded, and in row chunks of the weight
    for chunk_elems in (10_000, 5 * cols):
        unpadded = materialized_gram(chunks, rows, cols, chunk_elems)
        assert torch.allclose(unpadded, g @ g.T, rtol=1e-12, atol=0)
    assert stack_chunk_terms([chunks[0], chunks[1][:1]]) is None  # a use missing in one chunk


class RowGatedReuse(ReusedHead):
    """ReusedHead whose hook-invisible read of the head weight acts on rollouts of total length
    6 only: row 4 of the test batch, so with chunks of 4 only the second chunk sees it."""

    def forward(self, input_ids, attention_mask, position_ids):
        h = torch.tanh(self.embed(input_ids)).cumsum(1)  # [N, L, 8]
        gate = (attention_mask.sum(-1) == 6).to(h.dtype)[:, None, None]  # [N, 1, 1]
        logits = self.head(h) + 0.5 * gate * F.linear(torch.sin(h), self.head.weight)
        return types.SimpleNamespace(logits=logits)


def test_missed_use_in_one_chunk_falls_back_for_every_row(batch):
    ids, mask, _, coeff = batch
    assert (mask.sum(-1) == 6).nonzero().flatten().tolist() == [4]
    model = RowGatedReuse()
    ref = naive_gram(model, ids, mask, coeff)
    first = ghost_gram(model, ids[:4], mask[:4], coeff[:4], route="ghost")  # passes alone
    assert first.methods["head.weight"] == "ghost"
    fits = VOCAB * 8  # every side fits: the sketch route is exact here
    for row_chunk in (4, 2):
        with pytest.warns(UserWarning, match="missed a use"):
            result = ghost_gram(model, ids, mask, coeff, route="ghost", row_chunk=row_chunk)
        assert result.methods == {"embed.weight": "ghost", "head.weight": "per_sample"}
        assert max_rel(result.gram, ref.gram) < 1e-9
        with pytest.warns(UserWarning, match="missed a use"):
            sketched = sketch_gram(model, ids, mask, coeff, sketch_dim=fits, row_chunk=row_chunk)
        assert sketched.methods == {"embed.weight": "sketch", "head.weight": "per_sample"}
        assert max_rel(sketched.gram, ref.gram) < 1e-9
    unchecked = ghost_gram(model, ids, mask, coeff, check=False, row_chunk=4)
    assert max_rel(unchecked.gram, ref.gram) > 1e-3  # what the per-chunk check protects against


def test_rollout_objectives_skip_prompt_logits_exactly(model64, batch):
    """The probe's forward keeps logits from the first column with a coefficient on: the
    objectives and their gradients equal those from every column's log-probs."""
    from grpo_cli.algorithm.logprobs import token_logprobs

    ids, mask, _, coeff = batch
    trimmed = rollout_objectives(model64, ids, mask, [coeff])[0]  # [N]
    params = list(model64.parameters())
    grads = torch.autograd.grad(trimmed.sum(), params)
    full = (coeff * token_logprobs(model64, ids, mask)).sum(-1)  # [N], float32 log-softmax
    reference = torch.autograd.grad(full.sum(), params)
    assert ids.shape[1] - int(coeff.ne(0).any(0).nonzero()[0]) < ids.shape[1] - 1  # columns skipped
    torch.testing.assert_close(trimmed, full, rtol=1e-6, atol=1e-7)
    for got, want in zip(grads, reference, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-9)


# ---- duplicate rollouts: one pass per distinct (tokens, mask, coefficients) ---------------------
def duplicated_batch(batch):
    """The 6-row batch with rows 0 and 2 repeated (twice and once) and row 1's tokens repeated
    with other coefficients (a distinct objective): 10 rows, 7 distinct."""
    ids, mask, completion_mask, coeff = batch
    order = torch.tensor([0, 1, 0, 2, 3, 2, 4, 0, 5, 1])
    ids, mask, completion_mask, coeff = ids[order], mask[order], completion_mask[order], coeff[order].clone()
    coeff[9] = 2.0 * coeff[9]
    return ids, mask, completion_mask, coeff


def test_distinct_rollouts_keeps_first_copies_in_order():
    ids = torch.tensor([[1, 2], [3, 4], [1, 2], [5, 6], [3, 4]])
    mask = torch.ones_like(ids)
    coeff = torch.tensor([[0.0, 1.0]] * 4 + [[0.0, 2.0]])
    kept, index = distinct_rollouts(ids, mask, [coeff])
    assert kept.tolist() == [0, 1, 3, 4] and index.tolist() == [0, 1, 0, 2, 3]  # row 4: other coeff
    assert distinct_rollouts(ids[:2], mask[:2], [coeff[:2]]) is None
    other_mask = mask.clone()
    other_mask[2, 0] = 0  # same tokens, another mask: another objective
    assert distinct_rollouts(ids, other_mask, [coeff[:, :1] * 0 + 1])[0].tolist() == [0, 1, 2, 3]


def batch_rows_seen(model):
    """Context: the batch sizes the model's forward is called with."""
    seen = []
    handle = model.register_forward_pre_hook(
        lambda module, args, kwargs: seen.append(kwargs["input_ids"].shape[0]), with_kwargs=True
    )
    return seen, handle


@pytest.mark.parametrize(("method", "row_chunk"), [("auto", 0), ("auto", 3), ("per_sample", 0)])
def test_duplicate_rollouts_run_once_and_expand_exactly(model64, batch, method, row_chunk):
    ids, mask, _, coeff = duplicated_batch(batch)
    reference = naive_gram(model64, ids, mask, coeff, per_param=True)  # every row, one at a time
    seen, handle = batch_rows_seen(model64)
    try:
        result = per_rollout_grams(model64, ids, mask, {"k": coeff}, method=method,
                                   per_param=True, row_chunk=row_chunk)["k"]
    finally:
        handle.remove()
    assert sum(seen) == 7  # the 7 distinct rows ran, the 3 copies did not
    assert result.gram.shape == (10, 10)
    assert max_rel(result.gram, reference.gram) < 1e-10
    for name, gram in reference.per_param.items():
        assert torch.allclose(result.per_param[name], gram, rtol=1e-9, atol=1e-12 * float(gram.abs().max()))
    assert torch.equal(result.gram[0], result.gram[2]) and torch.equal(result.gram[0], result.gram[7])
    assert max_rel(result.gram[9], result.gram[1]) > 0.1  # same tokens, other coefficients


def test_duplicate_rollouts_sketch_equals_unmerged(model64, batch):
    """A copy's sketch is its original's (projections depend on the parameter only)."""
    ids, mask, completion_mask, coeff = duplicated_batch(batch)
    coeffs = {"adv": coeff, "score": completion_mask.double()}
    merged = per_rollout_grams(model64, ids, mask, coeffs, method="sketch", sketch_dim=64, seed=3)
    every = per_rollout_grams(model64, ids, mask, coeffs, method="sketch", sketch_dim=64, seed=3,
                              merge_duplicates=False)
    for key in coeffs:
        assert max_rel(merged[key].gram, every[key].gram) < 1e-10


def test_row_chunks_run_widest_first_each_cut_after_its_last_used_column(model64, batch, independent64):
    """Completions of 2, 6, 4, 3, 1, 5 tokens after 5 prompt columns end at columns 7, 11, 9, 8,
    6, 10: chunks of 2 take rows (1, 5), (2, 3), (0, 4) over 11, 9 and 7 columns, and K comes
    back in the rows' order (against the independent reference)."""
    from grpo_cli.probes.chunked_gram import width_order

    ids, mask, _, coeff = batch
    order, widths = width_order(mask, [coeff], 2)
    assert order.tolist() == [1, 5, 2, 3, 0, 4] and widths == [11, 9, 7]
    assert width_order(mask, [coeff], 0) == (None, [11])
    seen = []
    handle = model64.register_forward_pre_hook(
        lambda module, args, kwargs: seen.append(tuple(kwargs["input_ids"].shape)), with_kwargs=True)
    try:
        gram = per_rollout_grams(model64, ids, mask, {"k": coeff}, method="auto", row_chunk=2)["k"].gram
    finally:
        handle.remove()
    assert seen == [(2, 11), (2, 9), (2, 7)]
    assert max_rel(gram, independent64) < 1e-6
