"""Per-rollout Gram factors from the training step's own forward and backward (probe steps).

The probes' advantage-weighted rows (grpo_cli/probes/runner.py) are

    G_adv,i = -sum_t w_it A_it grad log pi(y_it),

rollout i's share of the gradient of the step's loss whenever that loss is the PPO-clip surrogate
at ratio 1 with nothing added: one pass over the batch (num_iterations = 1, no value head, no
TIS) and no KL term. At ratio 1 the clip is inactive, for the token and the sequence ratio alike,
so d loss / d log pi(y_it) = -w_it A_it, and the training backward hands every hooked layer exactly
the output-gradients D_i,t that `chunked_gram` gets from its own backward of sum_i f_i with the
coefficients -(w A); the training forward hands it the activations X_i,t. On a probe step the
hooks (`per_sample.LayerCapture`) therefore ride on the training forward and backward, the
micro-batches playing the part of row chunks, and K_adv needs no second pass. The trainer decides
when this holds (`GRPOTrainer.fused_probe_pass`): the conditions above, plus no autocast (the
separate pass runs in the model's precision). Activation checkpointing (the paper preset's) is
non-reentrant: the backward runs the hooked forward's own graph, whose outputs carry the gradient
hooks; the layers it recomputes in backward call the forward hooks again, and those uses reach no
gradient, so `LayerCapture.terms` skips them (tests/test_fused_probes.py). Each row's prompt must
have its own forward, since a shared prompt forward sums the group's prompt gradients before any
hook sees them: where training shares prompts
(`train.shared_prompt_forward`), `probes.fused_gram=always` runs the plain forward on probe steps
(the same loss and gradients to 1e-5, tests/test_policy_forward.py) and `auto` keeps the shared
forward and takes the separate pass, except with `train.backward_live_rows`: there only the rows
with a gradient are hooked, each with its own prompt forward, and the rows of zero advantage run
shared and without autograd (their K_adv rows and columns are 0); the hooked forward then
replaces the separate pass over the same rows, so each live row is computed once, not twice. The trade: fusing saves the separate pass over N (P + C)
tokens but costs the unshared prompts, (N - U) P tokens, plus the rows of the groups below; on the
CPU preset (prompts longer than completions, R = 8) the two cancel (docs/speed_log.md).

The score rows G_score,i = grad sum_t w_it log pi(y_it) (score_group, and the |cos| of
rollout_group) carry no A, and only their within-group blocks are ever read. With one advantage
a_i per rollout (outcome estimators) G_adv,i = -a_i G_score,i, so for a group g whose a_i are all
non-zero

    K_score[g] = diag(1/a_g) K_adv[g] diag(1/a_g)

exactly (up to rounding, which is relative). A row with a_i = 0 has zero loss coefficients, so the
training backward carries nothing of its score gradient: the groups holding such rows (every
zero-variance group) get their score blocks from a separate pass over their own rows
(coefficients w) where a matrix reads them (`score_groups_to_recompute`): groups with some rows
of zero advantage and some not. All-zero groups are read by no matrix (score_group, like
rollout_group, covers the groups with a non-zero advantage). With per-token
advantages (process) there is no such identity and K_score takes the separate pass over all rows.

Check (while the hooks are unverified, as in `chunked_gram`): the rows add up to the batch
gradient, so 1^T K 1 = ||p.grad||^2 per parameter (sketch: of U^T p.grad V), read from .grad before
the optimizer. A parameter the hooks do not cover, or one that fails the check, sends the whole
probe to the separate pass (runner.py), which has its own per-parameter fallbacks.
"""

from __future__ import annotations

from collections import defaultdict
from contextlib import contextmanager

import torch
from torch import nn

from grpo_cli.algorithm.advantages import advantage_range
from grpo_cli.probes.chunked_gram import ChunkShare, ShareBuilder, _close, _squared_norm
from grpo_cli.probes.per_sample import LayerCapture
from grpo_cli.probes.sketch import project_gradient


class TrainingPassFactors:
    """The hooks' factors of one probe step's training forward and backward, forward by forward
    (a micro-batch's rows, or a width bucket of them), turned into K_adv [N, N] by `gram`."""

    def __init__(self, model: nn.Module, params: dict[str, nn.Parameter], builder: ShareBuilder):
        self.model, self.params, self.builder = model, params, builder
        self.spans: list[slice] = []  # rows of each micro-batch, numbered in order of hooking
        self.rows: list[int] = []  # the batch row of each hooked row (train.backward_live_rows
        # hooks only the rows with a gradient: the others' rows and columns of K_adv are 0)
        self.shares: dict[str, dict[int, ChunkShare]] = defaultdict(dict)  # name -> chunk -> share
        self.complete = True  # every parameter's hooks held in every micro-batch
        self._recording: LayerCapture | None = None  # the capture whose forward runs now
        self.diagonals: dict[str, torch.Tensor] = {}  # name -> its K_adv's diagonal [N] (after `gram`)

    @contextmanager
    def micro_batch(self, rows: list[int]):
        """Around the forward and backward of the batch rows `rows`, in order. Several may be
        open at once (a micro-batch's forwards over rows of similar width, then one backward):
        opening one ends the previous one's forward, whose gradients it still records."""
        num_rows = len(rows)
        self.rows.extend(rows)
        start = self.spans[-1].stop if self.spans else 0
        chunk = len(self.spans)
        self.spans.append(slice(start, start + num_rows))
        if self._recording is not None:
            self._recording.stop()
        with LayerCapture(self.model, self.params, num_rows, keep_grads=True) as capture:
            self._recording = capture
            yield
        self._recording = None
        covered = capture.covered
        self.complete &= len(covered) == len(self.params)
        for name in covered:  # the factors in the model's precision (exact) or sketched rows
            self.shares[name][chunk] = self.builder(name, capture.terms(name, capture.grads), None)

    def gram(self, check: bool, num_rows: int) -> tuple[torch.Tensor | None, dict[str, str]]:
        """(K_adv [N, N] float64 over the batch's `num_rows` rows, parameter -> route), or
        (None, {}) when the hooks missed a use. Rows never hooked have no gradient: 0 there."""
        if not self.complete or not self.spans:
            return None, {}
        n = self.spans[-1].stop
        total = torch.zeros(n, n, dtype=torch.float64, device=self.builder.device)
        methods = {}
        for name, param in self.params.items():
            by_chunk = self.shares.pop(name, {})  # popped: each parameter's factors freed once used
            if len(by_chunk) != len(self.spans):
                return None, {}
            gram, method = self.builder.combine([by_chunk[k] for k in range(len(self.spans))], self.spans)
            if gram is None or (check and not self._adds_up(name, gram, param.grad, method)):
                return None, {}
            total += gram
            methods[name] = method
            self.diagonals[name] = gram.diagonal()  # [n] in hooked-row order
        if self.rows == list(range(num_rows)):
            return total, methods
        full = total.new_zeros(num_rows, num_rows)
        index = torch.tensor(self.rows, device=total.device)
        full[index.unsqueeze(1), index.unsqueeze(0)] = total
        for name, diagonal in self.diagonals.items():
            self.diagonals[name] = diagonal.new_zeros(num_rows).index_copy(0, index, diagonal)
        return full, methods

    def _adds_up(self, name: str, gram: torch.Tensor, grad: torch.Tensor | None, method: str) -> bool:
        """1^T K 1 = ||sum_i G_i||^2 against the batch gradient the same backward left in .grad."""
        if grad is None:
            return float(gram.abs().sum()) == 0.0
        if method == "sketch":
            u, v, _, _ = self.builder.projections[name]
            grad = project_gradient(grad.reshape(grad.shape[0], -1), u, v, self.builder.chunk_elems)
        target = _squared_norm(grad, self.builder.chunk_elems).to(gram.device)
        scale = float(gram.diagonal().clamp(min=0).sqrt().sum()) ** 2
        return _close(gram.sum(), target, scale, self.builder.rtol)


def per_rollout_advantage(
    advantages: torch.Tensor, completion_mask: torch.Tensor  # [N, L] each
) -> torch.Tensor | None:  # [N]
    """Each rollout's advantage when all its completion tokens share one; None otherwise."""
    low, high, has_tokens = advantage_range(advantages, completion_mask)
    if bool(((high != low) & has_tokens).any()):
        return None
    return torch.where(has_tokens, high, 0.0)


def score_groups_to_recompute(
    per_rollout: torch.Tensor | None,  # [N] each rollout's advantage; None: per-token advantages
    num_groups: int,
) -> torch.Tensor:  # [B] bool
    """Groups whose score block K_adv cannot give (module docstring) and some matrix reads:
    score_group and rollout_group skip all-zero groups."""
    if per_rollout is None:
        return torch.ones(num_groups, dtype=torch.bool)
    zero = (per_rollout == 0).reshape(num_groups, -1).cpu()  # [B, R]
    return zero.any(1) & ~zero.all(1)


def score_blocks_from_advantage(
    advantage_blocks: torch.Tensor,  # [B, R, R] within-group blocks of K_adv
    per_rollout: torch.Tensor,  # [N] each rollout's advantage
) -> torch.Tensor:  # [B, R, R] float64; NaN where a group has a zero advantage
    """K_score[g] = diag(1/a_g) K_adv[g] diag(1/a_g)."""
    a = per_rollout.to(advantage_blocks.device, torch.float64).reshape(advantage_blocks.shape[:2])
    return advantage_blocks / (a.unsqueeze(2) * a.unsqueeze(1))
