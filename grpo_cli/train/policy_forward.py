"""The policy's training forward: per-token log-probs and entropies, optionally with each
distinct prompt computed once (`train.shared_prompt_forward`).

A causal decoder's later tokens see earlier ones only through each layer's keys and values, so
the plain forward equals: one forward over the U distinct prompts (U = B when a micro-batch holds
whole groups) that keeps their KV cache, the cache rows gathered to the n completion rows, and one
forward over the completion columns on top of it. Gradients flow back through the gather (summed
over a group's R rows) into the single prompt forward. The prompt tokens are then computed U times
instead of n = U*R times; the result is the same up to float summation order (tests/
test_policy_forward.py checks loss and gradients to 1e-5 relative). Outputs match the plain
forward on completion columns and on column P (the first completion token, predicted from the
prompt's last logits); prompt columns are 0, and nothing reads them (the completion mask is 0
there).

Both paths stop at the decoder's final hidden states when the model allows it (`logits_head`)
and take log-probs from them in chunks of positions (`train.logits_chunk_mb`,
grpo_cli/algorithm/logprobs.py), so the [N, L, V] logits never exist at once.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence

import torch
from transformers.cache_utils import DynamicCache

from grpo_cli.algorithm.logprobs import (
    accepts_logits_to_keep,
    log_softmax_terms,
    logits_head,
    logprobs_from_hidden,
    sum_pi_squared_terms,
)
from grpo_cli.rollout.batch import RolloutBatch, replace_tensors
from grpo_cli.rollout.decode_cache import full_attention_only
from grpo_cli.runtime.transformers_api import cache_argument


def distinct_prompts(batch: RolloutBatch, prompt_keys: Sequence[Hashable] | None = None
                     ) -> tuple[list[int], list[int]]:
    """(first row of each distinct prompt [U], row -> distinct prompt index [n]), on the host.

    Distinct prompts are numbered in order of first appearance, so a batch of contiguous groups
    gets inverse = [0]*R + [1]*R + ... (see `expand_rows`). `prompt_keys` [n] (one hashable per
    row, equal exactly where the rows' prompt columns are equal; the trainer's come from the
    problem each row answers) spares the one read of the prompt columns back to the host.
    """
    if prompt_keys is None:
        prompt = batch.input_ids[:, : batch.prompt_length]  # [n, P]
        keyed = torch.where(batch.attention_mask[:, : batch.prompt_length] > 0, prompt, -1)  # [n, P]
        prompt_keys = [tuple(row) for row in keyed.tolist()]  # one read (a device sync on CUDA)
    if len(prompt_keys) != batch.num_rollouts:
        raise ValueError(f"{len(prompt_keys)} prompt keys for {batch.num_rollouts} rows")
    number: dict[Hashable, int] = {}
    first, inverse = [], []
    for row, key in enumerate(prompt_keys):
        if key not in number:
            number[key] = len(first)
            first.append(row)
        inverse.append(number[key])
    return first, inverse


def take_rows(tensor: torch.Tensor, rows: list[int]) -> torch.Tensor:
    """tensor[rows] along dim 0 for host row indices: a strided slice when they are evenly
    spaced (no index copied to the device), else an index copied without a device sync; a
    contiguous result either way, as advanced indexing gives."""
    if not rows:
        return tensor[:0].contiguous()
    step = rows[1] - rows[0] if len(rows) > 1 else 1
    if step > 0 and rows == list(range(rows[0], rows[-1] + 1, step)):
        return tensor[rows[0] : rows[-1] + 1 : step].contiguous()
    index = torch.tensor(rows, dtype=torch.long).to(tensor.device, non_blocking=True)  # [len(rows)]
    return tensor[index]


def expand_rows(tensor: torch.Tensor, inverse: list[int]) -> torch.Tensor:
    """tensor[inverse] along dim 0; a repeat (whose backward is a sum, not a scatter) when the
    rows come in equal contiguous groups."""
    count = tensor.shape[0]
    if count and len(inverse) % count == 0:
        repeats = len(inverse) // count
        if inverse == [row // repeats for row in range(len(inverse))]:
            return tensor.repeat_interleave(repeats, dim=0)
    return take_rows(tensor, inverse)


def in_row_order(parts: Sequence[torch.Tensor], groups: Sequence[Sequence[int]]) -> torch.Tensor:
    """parts[g] [len(groups[g]), ...] holds rows groups[g] of a batch (the groups together hold
    each row once): the rows in batch order, differentiably (a gather)."""
    place = {row: index for index, row in enumerate(row for rows in groups for row in rows)}
    return take_rows(torch.cat(list(parts)), [place[row] for row in range(len(place))])


def checkpointing(model) -> bool:
    flag = getattr(model, "is_activation_checkpointing", None)  # transformers >= 5.x name
    if flag is None:
        flag = getattr(model, "is_gradient_checkpointing", False)
    return bool(flag)


def can_share(model, batch: RolloutBatch, want_hidden: bool) -> bool:
    width = batch.input_ids.shape[1]
    return (
        not want_hidden  # the ppo value head reads every column's hidden state
        and 0 < batch.prompt_length < width
        and not checkpointing(model)  # checkpointed layers keep no KV cache
        and full_attention_only(model.config)  # sliding-window caches drop old prompt keys
    )


def final_columns(model, keep: int, output_hidden_states: bool = False, **inputs):
    """(scores [N, keep, *], output, head) of the last `keep` columns: the decoder's final hidden
    states [N, keep, H] and the head that maps them to logits when `logits_head(model)` exists,
    else the model's logits [N, keep, V] and head None."""
    head = logits_head(model)
    if head is not None:
        output = model.get_decoder()(**inputs, output_hidden_states=output_hidden_states)
        return output.last_hidden_state[:, -keep:], output, head
    if accepts_logits_to_keep(model):
        inputs["logits_to_keep"] = keep
    output = model(**inputs, output_hidden_states=output_hidden_states)
    return output.logits[:, -keep:], output, None


def predicted_logprobs(
    scores: torch.Tensor,  # [N, T, H] hidden states (head given) or [N, T, V] logits (head None)
    head: torch.nn.Module | None,
    targets: torch.Tensor,  # [N, T] scores[:, t] predicts targets[:, t]
    chunk_mb: float,
) -> tuple[torch.Tensor, torch.Tensor]:  # (logprobs [N, T], entropy [N, T])
    if head is None:
        return log_softmax_terms(scores, targets)
    return logprobs_from_hidden(head, scores, targets, chunk_mb)


def length_buckets(widths: Sequence[int], buckets: int) -> list[list[int]]:
    """Rows grouped for the completion forward: at most `buckets` groups of rows of similar
    completion width (`widths` [n], columns up to the last real token), chosen to minimise the
    positions computed, sum over groups of rows x the group's widest row, plus a charge of
    BUCKET_CHARGE of the unsplit area per extra group (a smaller matmul runs less efficiently).
    Rows keep their order within a group; one group of every row when `buckets` <= 1."""
    rows = len(widths)
    if buckets <= 1 or rows <= 1:
        return [list(range(rows))]
    order = sorted(range(rows), key=lambda row: -widths[row])  # widest first
    sorted_widths = [widths[row] for row in order]
    charge = BUCKET_CHARGE * rows * max(sorted_widths[0], 1)
    # best[k][j]: least cost of the first j sorted rows in k groups; cut[k][j] where the last starts
    inf = float("inf")
    best = [[inf] * (rows + 1) for _ in range(buckets + 1)]
    cut = [[0] * (rows + 1) for _ in range(buckets + 1)]
    best[0][0] = 0.0
    for k in range(1, buckets + 1):
        for j in range(1, rows + 1):
            for i in range(k - 1, j):  # the k-th group is sorted rows i .. j-1, widest i
                cost = best[k - 1][i] + (j - i) * sorted_widths[i] + charge
                if cost < best[k][j]:
                    best[k][j], cut[k][j] = cost, i
    k = min(range(1, buckets + 1), key=lambda count: best[count][rows])
    groups, end = [], rows
    while k > 0:
        start = cut[k][end]
        groups.append(sorted(order[start:end]))
        end, k = start, k - 1
    return groups[::-1]


BUCKET_CHARGE = 0.04  # an extra completion forward costs as much as 4% more positions


def shared_prefix_forward(
    model, batch: RolloutBatch, chunk_mb: float = 0.0, prompt_keys: Sequence[Hashable] | None = None,
    buckets: int = 1, widths: Sequence[int] | None = None,
) -> tuple[torch.Tensor, torch.Tensor] | None:
    """(logprobs [n, L], entropy [n, L]) like `forward_policy`, or None when no prompt is shared
    (or the model keeps no KV cache); the caller then runs the plain forward.

    `buckets` > 1 runs the completion columns in up to that many forwards over rows of similar
    length (`length_buckets`), each cut after its widest row's last real token, all on the one
    prompt forward's cache: the padding after a short completion is then not computed. Each
    row's outputs are those of the single completion forward (a row attends only to its prompt
    and its own earlier tokens), their log-probs taken by one head pass over every row's
    positions through its last token (`_one_head_pass`); `widths` [n] are the rows' completion widths if the caller
    has them on the host (else they are read back, a device sync on CUDA).
    """
    if not can_share(model, batch, want_hidden=False):
        return None
    first, inverse = distinct_prompts(batch, prompt_keys)
    if len(first) == batch.num_rollouts:
        return None
    prompt_length = batch.prompt_length
    positions = (batch.attention_mask.cumsum(-1) - 1).clamp(min=0)  # [n, L]
    # One embedding lookup for every forward below: each lookup's backward zeroes and fills a
    # dense [V, H] gradient (113 MB for SmolLM2), once per forward call otherwise.
    embeds = model.get_input_embeddings()(batch.input_ids)  # [n, L, H]
    prompt_cache, prompt_scores, head = _prompt_forward(model, batch, embeds, positions, first)
    completion_length = batch.input_ids.shape[1] - prompt_length
    if buckets > 1 and widths is None:
        widths = batch.completion_widths().tolist()  # one read
    groups = [list(range(batch.num_rollouts))] if buckets <= 1 else length_buckets(widths, buckets)
    one_head_pass = head is not None and len(groups) > 1 and sum(widths) > 0
    logprobs, entropy, hidden, targets, places = [], [], [], [], []
    for rows in groups:
        width = completion_length if len(groups) == 1 else max(1, max(widths[row] for row in rows))
        prompt_rows = [inverse[row] for row in rows]
        scores = _bucket_scores(model, batch, (embeds, positions), (prompt_cache, prompt_scores),
                                rows, prompt_rows, width)  # [n_g, width, H or V]
        group_targets = take_rows(batch.input_ids[:, prompt_length:prompt_length + width], rows)  # [n_g, width]
        if one_head_pass:  # each row's positions through its last token, for one head pass below
            kept = [(index, row, column) for index, row in enumerate(rows) for column in range(widths[row])]
            flat = [index * width + column for index, _, column in kept]
            hidden.append(take_rows(scores.reshape(-1, scores.shape[-1]), flat))  # [m_g, H]
            targets.append(take_rows(group_targets.reshape(-1), flat))  # [m_g]
            places.extend((row, prompt_length + column) for _, row, column in kept)
            continue
        part = predicted_logprobs(scores, head, group_targets, chunk_mb)
        pad = (prompt_length, completion_length - width)
        logprobs.append(torch.nn.functional.pad(part[0], pad))  # [n_g, L]
        entropy.append(torch.nn.functional.pad(part[1], pad))
    if one_head_pass:
        return _one_head_pass(batch.input_ids.shape, places, head, hidden, targets, chunk_mb)
    if len(groups) == 1:
        return logprobs[0], entropy[0]
    return in_row_order(logprobs, groups), in_row_order(entropy, groups)


def _prompt_forward(model, batch: RolloutBatch, embeds: torch.Tensor, positions: torch.Tensor,
                    first: list[int]):
    """One forward over the distinct prompts `first` (embeds [n, L, H], positions [n, L]):
    their cache ([U, H, P, D] keys and values per layer), the last prompt column's scores
    [U, 1, H or V] and the head final_columns leaves to the caller (None: scores are logits)."""
    prompt_length = batch.prompt_length
    cache = DynamicCache(config=model.config)
    prompt_scores, _, head = final_columns(
        model, 1,
        inputs_embeds=take_rows(embeds[:, :prompt_length], first),
        attention_mask=take_rows(batch.attention_mask[:, :prompt_length], first),
        position_ids=take_rows(positions[:, :prompt_length], first), use_cache=True,
        **cache_argument(cache),
    )  # [U, 1, H or V]
    return [(layer.keys, layer.values) for layer in cache.layers], prompt_scores, head


def _bucket_scores(model, batch: RolloutBatch, inputs, prompt, rows: list[int],
                   prompt_rows: list[int], width: int) -> torch.Tensor:
    """The scores [n_g, width, H or V] that predict the first `width` completion tokens of
    `rows`: the last prompt column's (`prompt` = (its cache [U, H, P, D] per layer, its scores
    [U, 1, H or V]), taken for each row's prompt `prompt_rows`), then the completion forward's
    own columns but the last, on that cache; `inputs` = (embeds [n, L, H], positions [n, L])."""
    (embeds, positions), (prompt_cache, prompt_scores) = inputs, prompt
    prompt_length = batch.prompt_length
    columns = slice(prompt_length, prompt_length + width)
    group_cache = DynamicCache(config=model.config)
    for index, (keys, values) in enumerate(prompt_cache):  # [U, ...] -> [n_g, ...], differentiable
        group_cache.update(expand_rows(keys, prompt_rows), expand_rows(values, prompt_rows), index)
    completion_scores, _, _ = final_columns(
        model, width,
        inputs_embeds=take_rows(embeds[:, columns], rows),
        attention_mask=take_rows(batch.attention_mask[:, : prompt_length + width], rows),
        position_ids=take_rows(positions[:, columns], rows), use_cache=True,
        **cache_argument(group_cache),
    )  # [n_g, width, H or V]
    return torch.cat([expand_rows(prompt_scores, prompt_rows), completion_scores[:, :-1]], dim=1)


def _one_head_pass(shape: torch.Size, places: list[tuple[int, int]], head, hidden: list[torch.Tensor],
                   targets: list[torch.Tensor], chunk_mb: float):
    """(logprobs [n, L], entropy [n, L]) of `shape` from the buckets' final hidden states at each
    row's positions through its last token (`hidden[g]` [m_g, H], `targets[g]` [m_g]; `places`:
    their (row, column) in order), taken by one head pass over all of them: the head's weight
    gradient is then one product over the batch's tokens instead of one [V, H] product (and a
    sum) per bucket, and positions after a row's last token are not computed (they are 0, as the
    columns past a bucket's width are; the completion mask is 0 there)."""
    picked, entropy = predicted_logprobs(torch.cat(hidden)[None], head, torch.cat(targets)[None], chunk_mb)
    index = torch.tensor(places, dtype=torch.long).to(picked.device, non_blocking=True).T  # [2, M]
    return tuple(values.new_zeros(shape).index_put((index[0], index[1]), values)  # [n, L]
                 for values in (picked[0], entropy[0]))


def plain_forward(model, batch: RolloutBatch, want_hidden: bool = False,
                  chunk_mb: float = 0.0, widths: Sequence[int] | None = None):
    """One forward over every column: log-probs and entropies [N, L] (and final hidden states).

    Log-probs are computed from the last prompt column on, as in the shared path: prompt columns
    of the outputs are 0 (the completion mask is 0 there), and the [N, L, V] float32 log-softmax
    terms shrink by the prompt's share of the columns. `widths` [N] (each row's completion columns
    through its last token): the forward stops at the widest row's last column; the columns after
    it are padding in every row (a causal model's earlier columns never see them), their outputs 0.
    """
    full = batch.input_ids.shape[1]
    if widths is not None and len(widths) > 0 and batch.prompt_length + max(widths) < full:
        keep = batch.prompt_length + max(max(widths), 1)
        outputs = plain_forward(model, replace_tensors(batch, lambda tensor: tensor[:, :keep]),
                                want_hidden, chunk_mb)
        pad = full - keep
        return tuple(None if out is None else torch.nn.functional.pad(out, [0, 0] * (out.dim() - 2) + [0, pad])
                     for out in outputs)
    width, prompt_length = batch.input_ids.shape[1], batch.prompt_length
    first = prompt_length if 0 < prompt_length < width else 1  # first column with a log-prob
    position_ids = (batch.attention_mask.cumsum(-1) - 1).clamp(min=0)
    scores, output, head = final_columns(
        model, width - first + 1, output_hidden_states=want_hidden,
        input_ids=batch.input_ids, attention_mask=batch.attention_mask, position_ids=position_ids,
    )  # [N, L - first + 1, H or V]
    logprobs, entropy = predicted_logprobs(
        scores[:, :-1], head, batch.input_ids[:, first:], chunk_mb
    )  # [N, L - first]
    pad = (first, 0)
    hidden = output.hidden_states[-1] if want_hidden else None
    return torch.nn.functional.pad(logprobs, pad), torch.nn.functional.pad(entropy, pad), hidden


def token_probabilities(model, batch: RolloutBatch, chunk_mb: float = 0.0
                        ) -> tuple[torch.Tensor, torch.Tensor]:  # [N, L] each, float32
    """(log-prob of each sampled token, sum over the vocabulary of its squared probabilities),
    from one plain forward with no gradient; prompt columns are 0 as in `plain_forward`."""
    width, prompt_length = batch.input_ids.shape[1], batch.prompt_length
    first = prompt_length if 0 < prompt_length < width else 1  # first column with a log-prob
    position_ids = (batch.attention_mask.cumsum(-1) - 1).clamp(min=0)
    with torch.no_grad():
        scores, _, head = final_columns(
            model, width - first + 1,
            input_ids=batch.input_ids, attention_mask=batch.attention_mask, position_ids=position_ids,
        )  # [N, L - first + 1, H or V]
        logprobs, sum_pi_squared = sum_pi_squared_terms(
            scores[:, :-1], head, batch.input_ids[:, first:], chunk_mb
        )  # [N, L - first]
    pad = (first, 0)
    return torch.nn.functional.pad(logprobs, pad), torch.nn.functional.pad(sum_pi_squared, pad)


def forward_policy(model, batch: RolloutBatch, want_hidden: bool = False, shared_prompt_forward: bool = False,
                   chunk_mb: float = 0.0, prompt_keys: Sequence[Hashable] | None = None,
                   buckets: int = 1, widths: Sequence[int] | None = None):
    """(logprobs [N, L], entropy [N, L], hidden [N, L, H] or None) for a batch of rollouts.

    `shared_prompt_forward` runs each distinct prompt once where that is exact (`can_share`); the value
    head (`want_hidden`) and activation checkpointing always take the plain forward.
    `prompt_keys`: see `distinct_prompts`; `buckets`, `widths`: see `shared_prefix_forward`.
    """
    if shared_prompt_forward and not want_hidden:
        shared = shared_prefix_forward(model, batch, chunk_mb, prompt_keys, buckets, widths)
        if shared is not None:
            return (*shared, None)
    return plain_forward(model, batch, want_hidden, chunk_mb, widths)
