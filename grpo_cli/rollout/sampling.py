"""Next-token draws from raw logits: temperature, top-p, then a categorical draw (greedy at T = 0).

Three draws of the same distribution softmax(filter_top_p(logits / T)):

- `sample_tokens`: `torch.multinomial`, the hf_static loop's sampler;
- `race_tokens`: the exponential race (argmax_i p_i / E_i with E_i ~ Exp(1) i.i.d. is distributed
  as Categorical(p); the Gumbel-max trick in probability space). Elementwise ops and an argmax
  only, so it needs no host sync and can be captured in a CUDA graph with its generator
  (grpo_cli/rollout/graph_decode.py);
- `inverse_cdf_tokens`: one uniform per row against the cumulative probabilities (float64), the
  `rollout.draw=inverse_cdf` option of the hf_static loop. The same law, another random stream
  (so other tokens than `multinomial` for the same seed), for one random number per row instead
  of one per vocabulary entry: on CPU the race's `exponential_` over [32, 49152] costs ~44 ms a
  token (1.4 s of an 8 s SmolLM2 rollout), the cumulative sum and search ~3 ms.

torch's `multinomial` draws one sample by this same race (aten's multinomial fast path for
n_sample = 1: `exponential_`, divide, argmax), after validity checks on the probabilities that
some torch versions read back to the host. So for the same generator state both draw the same
tokens (tests/test_graph_decode.py checks it on CPU with torch 2.13), except where an Exp(1)
draw is exactly 0 (possible on CPU), which `race_tokens` floors.
"""

from __future__ import annotations

import torch


def filter_top_p(scores: torch.Tensor, top_p: float) -> torch.Tensor:
    """transformers' TopPLogitsWarper: drop the smallest tokens whose mass is <= 1 - top_p."""
    sorted_scores, sorted_indices = torch.sort(scores, descending=False)
    cumulative = sorted_scores.softmax(dim=-1).cumsum(dim=-1)
    remove_sorted = cumulative <= (1 - top_p)
    remove_sorted[..., -1:].fill_(False)  # keep at least one token (a kernel, no host scalar copy)
    remove = remove_sorted.scatter(1, sorted_indices, remove_sorted)
    return scores.masked_fill(remove, -float("inf"))


def sampling_probs(logits: torch.Tensor, temperature: float, top_p: float) -> torch.Tensor:
    """softmax(filter_top_p(logits / T)): [N, V] float32 from raw logits [N, V] (T > 0)."""
    scores = logits / temperature
    if top_p < 1.0:
        scores = filter_top_p(scores, top_p)
    return scores.softmax(dim=-1)


def sample_tokens(
    logits: torch.Tensor,  # [N, V] float32 raw logits
    temperature: float,
    top_p: float,
    generator: torch.Generator,
) -> torch.Tensor:  # [N] long
    if temperature <= 0:
        return logits.argmax(dim=-1)
    probs = sampling_probs(logits, temperature, top_p)
    return torch.multinomial(probs, 1, generator=generator).squeeze(1)


def inverse_cdf_tokens(
    logits: torch.Tensor,  # [n, V] float32 raw logits
    temperature: float,
    top_p: float,
    generator: torch.Generator,
    rows: tuple[int, torch.Tensor] | None = None,
) -> torch.Tensor:  # [n] long
    """The first token whose cumulative probability exceeds u * total, u ~ U[0, 1) (module
    docstring): token i is drawn with probability p_i / total, and a token of probability 0
    (filtered by top-p) never, since its cumulative probability equals its predecessor's.

    `rows` = (N, index [n]): these n rows are rows `index` of a batch of N; N uniforms are drawn
    and theirs kept, so a decode loop that stops computing finished rows draws what the full
    loop draws for the others."""
    if temperature <= 0:
        return logits.argmax(dim=-1)
    cumulative = sampling_probs(logits, temperature, top_p).double().cumsum(dim=-1)  # [n, V]
    count = logits.shape[0] if rows is None else rows[0]
    uniform = torch.rand(count, 1, dtype=torch.float64, device=logits.device,
                         generator=generator)  # [N, 1]
    if rows is not None:
        uniform = uniform[rows[1]]  # [n, 1]
    chosen = torch.searchsorted(cumulative, uniform * cumulative[:, -1:], right=True)  # [N, 1]
    return chosen.squeeze(1).clamp_(max=logits.shape[-1] - 1)


DRAWS = {"multinomial": sample_tokens, "inverse_cdf": inverse_cdf_tokens}  # rollout.draw (hf_static)


def resolve_draw(draw: str, cuda_graphs: bool) -> str:
    """`rollout.draw` as the hf_static loop runs it: `auto` is inverse_cdf (one uniform per row,
    and finished rows leave the batch), except inside CUDA graphs, whose step draws by the race
    (`race_tokens`, multinomial's own one-sample law and stream)."""
    if draw == "auto":
        return "multinomial" if cuda_graphs else "inverse_cdf"
    return draw


def race_tokens(
    logits: torch.Tensor,  # [N, V] float32 raw logits
    temperature: float,
    top_p: float,
    generator: torch.Generator,
) -> torch.Tensor:  # [N] long
    """`sample_tokens`' draw without a host sync (module docstring)."""
    if temperature <= 0:
        return logits.argmax(dim=-1)
    probs = sampling_probs(logits, temperature, top_p)  # [N, V]; 0 outside the top-p set
    race = torch.empty_like(probs).exponential_(generator=generator)  # [N, V] ~ Exp(1)
    # An Exp(1) draw of exactly 0 would make 0/0 = NaN for a filtered token; a floor of the
    # smallest normal float changes the law by less than that float.
    race.clamp_(min=torch.finfo(race.dtype).tiny)
    return (probs / race).argmax(dim=-1)
