"""Log-probs and entropies in chunks of positions: the same values and gradients as one pass,
and no [N, L, V] tensor at any point of forward or backward."""

from __future__ import annotations

import pytest
import torch
from step_parity import assert_same_update, setup_for, step_loss_and_grads
from torch.utils._python_dispatch import TorchDispatchMode

from grpo_cli.algorithm.logprobs import (
    log_softmax_terms,
    logits_head,
    logprob_and_sum_pi_squared,
    logprobs_from_hidden,
    positions_per_chunk,
    token_logprobs_and_entropy,
)
from grpo_cli.train.policy_forward import plain_forward, shared_prefix_forward, token_probabilities


def chunk_mb_for(positions: int, rows: int, vocab: int) -> float:
    """The chunk_mb that gives `positions` positions per chunk."""
    return positions * rows * vocab * 4 / 2**20


class LargestVocabTensor(TorchDispatchMode):
    """Records the most elements of any op output whose last dimension is the vocabulary."""

    def __init__(self, vocab: int):
        super().__init__()
        self.vocab, self.largest = vocab, 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for tensor in out if isinstance(out, tuple | list) else [out]:
            if isinstance(tensor, torch.Tensor) and tensor.dim() >= 2 and tensor.shape[-1] == self.vocab:
                self.largest = max(self.largest, tensor.numel())
        return out


def head_and_inputs(rows=2, width=23, hidden_size=8, vocab=50, seed=0):
    torch.manual_seed(seed)
    head = torch.nn.Linear(hidden_size, vocab, bias=False)
    hidden = torch.randn(rows, width, hidden_size, requires_grad=True)  # [N, T, H]
    targets = torch.randint(0, vocab, (rows, width))  # [N, T]
    return head, hidden, targets


def test_positions_per_chunk():
    assert positions_per_chunk(2, 256_000, 256) == 131  # 2 x 131 x 256000 x 4 B <= 256 MiB
    assert positions_per_chunk(2, 256_000, 0) > 10**9  # 0: one pass
    assert positions_per_chunk(64, 256_000, 1) == 1  # never below one position


@pytest.mark.parametrize("block_rows", [1, 5, 46])
def test_blocks_of_positions_give_the_one_block_values_and_gradients(block_rows):
    """log_softmax_terms in blocks of positions (CPU's default, for the allocator) equals one
    block exactly, and both equal the closed form; also on a strided slice of the logits."""
    torch.manual_seed(3)
    logits = (3 * torch.randn(2, 24, 50)).requires_grad_(True)  # [N, T + 1, V]
    targets = torch.randint(0, 50, (2, 23))
    weights = torch.linspace(-1, 1, targets.numel()).view(2, 23)
    results = {}
    for rows in (None, block_rows, 10**6):  # the default on a CPU, the blocks, one block
        logits.grad = None
        picked, entropy = log_softmax_terms(logits[:, :-1], targets, block_rows=rows)
        (picked * weights).sum().backward()
        results[rows] = (picked.detach(), entropy, logits.grad.clone())
    for got, want in zip(results[block_rows], results[10**6], strict=True):
        assert torch.equal(got, want)
    assert all(torch.equal(a, b) for a, b in zip(results[None], results[10**6], strict=True))
    log_p = torch.log_softmax(logits.detach()[:, :-1].double(), dim=-1)
    closed = {"rtol": 1e-5, "atol": 1e-6}  # float32 against float64
    torch.testing.assert_close(results[block_rows][0].double(), log_p.gather(-1, targets[..., None])[..., 0], **closed)
    torch.testing.assert_close(results[block_rows][1].double(), -(log_p.exp() * log_p).sum(-1), **closed)
    # d sum(w * log p(target)) / d logits = w * (onehot(target) - p); the last column gets none
    onehot = torch.nn.functional.one_hot(targets, 50).double()
    grad = weights.double()[..., None] * (onehot - log_p.exp())
    torch.testing.assert_close(results[block_rows][2][:, :-1].double(), grad, **closed)
    assert not results[block_rows][2][:, -1].any() and not results[block_rows][1].requires_grad


@pytest.mark.parametrize("positions", [1, 4, 7, 22])
def test_chunked_values_and_gradients_match_one_pass(positions):
    head, hidden, targets = head_and_inputs()
    logprobs, entropy = log_softmax_terms(head(hidden), targets)  # [N, T] one pass
    (logprobs * torch.linspace(-1, 1, targets.numel()).view_as(logprobs)).sum().backward()
    grad_hidden, grad_head = hidden.grad.clone(), head.weight.grad.clone()
    hidden.grad, head.weight.grad = None, None

    chunk_mb = chunk_mb_for(positions, *targets.shape[:1], head.out_features)
    chunked, chunked_entropy = logprobs_from_hidden(head, hidden, targets, chunk_mb)
    (chunked * torch.linspace(-1, 1, targets.numel()).view_as(chunked)).sum().backward()
    torch.testing.assert_close(chunked, logprobs, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(chunked_entropy, entropy, rtol=1e-6, atol=1e-6)
    assert not chunked_entropy.requires_grad  # a metric, never optimised
    torch.testing.assert_close(hidden.grad, grad_hidden, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(head.weight.grad, grad_head, rtol=1e-5, atol=1e-6)


def test_one_chunk_is_todays_path_bit_for_bit():
    head, hidden, targets = head_and_inputs()
    logits = head(hidden)  # [N, T, V]
    ids = torch.cat([targets[:, :1], targets], dim=1)  # column t of logits predicts ids[:, t+1]
    padded_logits = torch.cat([logits, logits[:, :1]], dim=1)
    reference = token_logprobs_and_entropy(padded_logits, ids)
    logprobs, entropy = logprobs_from_hidden(head, hidden, targets, chunk_mb=0)
    assert torch.equal(logprobs, reference[0][:, 1:]) and torch.equal(entropy, reference[1][:, 1:])


def test_no_full_length_vocab_tensor_in_forward_or_backward():
    """One pass makes [N, T, V] tensors; chunks of c positions never exceed [N, c, V]."""
    head, hidden, targets = head_and_inputs(width=40, vocab=97)
    rows, width = targets.shape
    with LargestVocabTensor(head.out_features) as full:
        log_softmax_terms(head(hidden), targets)[0].sum().backward()
    assert full.largest == rows * width * head.out_features

    positions = 5
    chunk_mb = chunk_mb_for(positions, rows, head.out_features)
    with LargestVocabTensor(head.out_features) as chunked:
        logprobs_from_hidden(head, hidden, targets, chunk_mb)[0].sum().backward()
    assert 0 < chunked.largest <= rows * positions * head.out_features


@pytest.fixture
def tiny_setup(tmp_path):
    return setup_for(tmp_path)


def test_policy_forward_chunked_matches_one_pass(tiny_setup):
    model = tiny_setup.model
    assert logits_head(model) is model.get_output_embeddings()  # llama: hidden-state route
    batch = tiny_setup.trainer.rollout(0, draw=0)
    vocab = model.config.vocab_size
    chunk_mb = chunk_mb_for(3, batch.num_rollouts, vocab)
    for forward in (plain_forward, shared_prefix_forward):
        one_pass = forward(model, batch)
        chunked = forward(model, batch, chunk_mb=chunk_mb)
        torch.testing.assert_close(chunked[0], one_pass[0], rtol=1e-6, atol=1e-6)
        torch.testing.assert_close(chunked[1], one_pass[1], rtol=1e-6, atol=1e-6)
    with LargestVocabTensor(vocab) as largest:
        plain_forward(model, batch, chunk_mb=chunk_mb)[0].sum().backward()
    assert 0 < largest.largest <= batch.num_rollouts * 3 * vocab
    assert batch.input_ids.shape[1] - batch.prompt_length > 3  # really more than one chunk


def test_sum_pi_squared_is_the_collision_probability():
    logits = torch.tensor([[[0.0, 0.0, 0.0, 0.0], [2.0, 0.0, -1.0, 30.0]]])  # [1, 2, 4]
    logprobs, sum_sq = logprob_and_sum_pi_squared(logits, torch.tensor([[1, 3]]))
    probs = torch.softmax(logits.double(), -1)
    torch.testing.assert_close(sum_sq.double(), (probs**2).sum(-1), rtol=1e-6, atol=0)
    assert sum_sq[0, 0] == pytest.approx(0.25)  # uniform over 4: 4 x (1/4)^2
    assert sum_sq[0, 1] == pytest.approx(1.0, abs=1e-9)  # near one-hot
    torch.testing.assert_close(logprobs.double(), probs[0, [0, 1], [1, 3]].log()[None], rtol=1e-6, atol=1e-6)


def test_token_probabilities_agree_with_the_training_forward(tiny_setup):
    """otb's forward: the training forward's log-probs, and sum pi^2 of the same logits, in
    chunks or not."""
    model = tiny_setup.model
    batch = tiny_setup.trainer.rollout(0, draw=0)
    logprobs, _, _ = plain_forward(model, batch)
    logits = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask,
                   position_ids=(batch.attention_mask.cumsum(-1) - 1).clamp(min=0)).logits
    expected = (torch.softmax(logits[:, :-1].double(), -1) ** 2).sum(-1)  # [N, L-1] predicts t+1
    chunk_mb = chunk_mb_for(3, batch.num_rollouts, model.config.vocab_size)
    for chunk in (0.0, chunk_mb):
        picked, sum_sq = token_probabilities(model, batch, chunk)
        on = batch.completion_mask > 0  # [N, L]
        torch.testing.assert_close(picked[on], logprobs.detach()[on], rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(sum_sq[:, 1:][on[:, 1:]].double(), expected[on[:, 1:]],
                                   rtol=1e-5, atol=1e-6)
        assert (sum_sq[:, : batch.prompt_length] == 0).all() and batch.prompt_length > 0


@pytest.mark.parametrize("shared", ["true", "false"])
def test_training_step_in_chunks_keeps_the_update(tmp_path, shared):
    """A whole GRPO step with the log-prob pass in 2-position chunks: same loss and gradients."""
    overrides = [f"train.shared_prompt_forward={shared}", "train.micro_batch_size=5"]
    reference_setup = setup_for(tmp_path, *overrides, "train.logits_chunk_mb=0")
    reference = step_loss_and_grads(reference_setup)
    two_positions = chunk_mb_for(2, 5, reference_setup.model.config.vocab_size)
    candidate = setup_for(tmp_path, *overrides, f"train.logits_chunk_mb={two_positions}")
    assert_same_update(reference, step_loss_and_grads(candidate))


def test_probe_forward_in_chunks_gives_the_same_per_rollout_gradients(tiny_setup):
    """The probes' log-probs (no entropy) with the log-softmax in 3-position chunks: same values,
    and the same per-rollout gradients through one backward per rollout (retain_graph, so every
    checkpointed chunk is recomputed once per rollout)."""
    from grpo_cli.probes.per_sample import (
        _logprobs_without_entropy,
        per_sample_grads,
        select_params,
    )

    model = tiny_setup.model
    batch = tiny_setup.trainer.rollout(0, draw=0)
    rows, vocab = batch.num_rollouts, model.config.vocab_size
    args = (model, batch.input_ids, batch.attention_mask, batch.prompt_length)
    one_pass = _logprobs_without_entropy(*args, chunk_mb=0)  # [N, L]
    chunked = _logprobs_without_entropy(*args, chunk_mb=chunk_mb_for(3, rows, vocab))
    torch.testing.assert_close(chunked, one_pass, rtol=1e-6, atol=1e-6)
    coeff = batch.completion_mask * torch.linspace(-1, 1, batch.input_ids.shape[1])  # [N, L]
    params = select_params(model, r"lm_head|layers\.1\.mlp")
    expected = per_sample_grads((coeff * one_pass).sum(-1), params)
    actual = per_sample_grads((coeff * chunked).sum(-1), params)
    for name, grad in expected.items():
        assert grad.abs().sum() > 0, name
        torch.testing.assert_close(actual[name], grad, rtol=1e-5, atol=1e-7)
