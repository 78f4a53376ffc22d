"""Policy, KL and value losses on per-token tensors.

Conventions: every tensor is [N, L] aligned with the rollout batch's columns, `completion_mask` is
1 on the completion tokens that count, and a loss is what the optimizer minimises, so
loss = -sum(w * objective) with w from `aggregation_weights`.
"""

from __future__ import annotations

import torch

AGGREGATIONS = ("token_mean", "seq_mean_token_mean", "constant")
IMPORTANCE_SAMPLING_LEVELS = ("token", "sequence")


def aggregation_weights(
    completion_mask: torch.Tensor,  # [N, L]
    agg: str,
    constant: int | None = None,
    *,
    batch_tokens: float | None = None,
    batch_sequences: int | None = None,
) -> torch.Tensor:  # [N, L] float32, 0 off the mask
    """Per-token weights w with loss = -sum_{n,t} w_{n,t} objective_{n,t}.

    - "token_mean": w = 1 / T, T = completion tokens of the batch (DAPO, Yu et al. 2025).
    - "seq_mean_token_mean": w = 1 / (N |y_n|), the mean over sequences of per-sequence token
      means (GRPO, Shao et al. 2024); empty sequences count in N and contribute 0.
    - "constant": w = 1 / (N * constant) (Dr. GRPO, Liu et al. 2025).

    With gradient accumulation over micro-batches, pass the whole batch's `batch_tokens` (T) and
    `batch_sequences` (N) so that the micro-batch weights sum to the full-batch loss; by default
    they are counted from `completion_mask`.
    """
    mask = (completion_mask > 0).float()  # [N, L]
    sequences = float(batch_sequences if batch_sequences is not None else mask.shape[0])
    if agg == "token_mean":
        tokens = batch_tokens if batch_tokens is not None else mask.sum()
        return mask / torch.as_tensor(tokens, dtype=mask.dtype).clamp(min=1.0)
    if agg == "seq_mean_token_mean":
        lengths = mask.sum(dim=1, keepdim=True).clamp(min=1.0)  # [N, 1]
        return mask / lengths / max(sequences, 1.0)
    if agg == "constant":
        if constant is None or constant <= 0:
            raise ValueError(f"loss_agg='constant' needs a positive constant, got {constant!r}")
        return mask / (max(sequences, 1.0) * constant)
    raise ValueError(f"unknown loss aggregation {agg!r}; known: {', '.join(AGGREGATIONS)}")


def importance_ratio(
    logprobs: torch.Tensor,  # [N, L] current policy, with grad
    old_logprobs: torch.Tensor,  # [N, L] policy that produced the advantages
    completion_mask: torch.Tensor,  # [N, L]
    level: str = "token",
) -> torch.Tensor:  # [N, L], 1 off the mask
    """pi/pi_old per token, or GSPO's sequence ratio in its token form (Zheng et al. 2025).

    "sequence": s_n = exp(mean_t (logp - old_logp)) over n's completion tokens, and each token
    carries s_{n,t} = sg[s_n] * exp(logp_t - sg[logp_t]) (GSPO-token): its value is s_n and its
    gradient s_n * grad logp_t, so with per-sequence advantages and "seq_mean_token_mean" the
    gradient is GSPO's.
    """
    in_completion = completion_mask > 0  # [N, L]
    log_ratio = torch.where(in_completion, logprobs - old_logprobs.detach(), 0.0)  # [N, L]
    if level == "token":
        return log_ratio.exp()
    if level == "sequence":
        lengths = in_completion.sum(dim=1, keepdim=True).clamp(min=1)  # [N, 1]
        sequence_log_ratio = log_ratio.sum(dim=1, keepdim=True) / lengths  # [N, 1]
        own_token = torch.where(in_completion, logprobs - logprobs.detach(), 0.0)  # [N, L] value 0
        return torch.where(in_completion, (sequence_log_ratio.detach() + own_token).exp(), 1.0)
    raise ValueError(
        f"unknown importance_sampling_level {level!r}; known: {', '.join(IMPORTANCE_SAMPLING_LEVELS)}"
    )


def policy_loss(
    logprobs: torch.Tensor,  # [N, L]
    old_logprobs: torch.Tensor,  # [N, L]
    advantages: torch.Tensor,  # [N, L]
    completion_mask: torch.Tensor,  # [N, L]
    epsilon: float = 0.2,
    epsilon_high: float | None = None,
    agg: str = "token_mean",
    constant: int | None = None,
    importance_sampling_level: str = "token",
    *,
    batch_tokens: float | None = None,
    batch_sequences: int | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """PPO-clip loss -sum w * min(rho A, clip(rho, 1 - epsilon, 1 + epsilon_high) A).

    rho is `importance_ratio` at `importance_sampling_level`; w is `aggregation_weights`.
    epsilon_high=None means epsilon (symmetric clip); epsilon_high > epsilon is DAPO's clip-higher.
    Stats (detached 0-d tensors, plain means over completion tokens): "clip_frac" (tokens where
    the clipped term is the active one), "clip_frac_low", "clip_frac_high", "ratio_mean".
    """
    epsilon_high = epsilon if epsilon_high is None else epsilon_high
    in_completion = completion_mask > 0  # [N, L]
    ratio = importance_ratio(logprobs, old_logprobs, completion_mask, importance_sampling_level)
    clipped_ratio = ratio.clamp(1.0 - epsilon, 1.0 + epsilon_high)  # [N, L]
    objective = torch.minimum(ratio * advantages, clipped_ratio * advantages)  # [N, L]
    objective = torch.where(in_completion, objective, 0.0)
    weights = aggregation_weights(
        completion_mask, agg, constant, batch_tokens=batch_tokens, batch_sequences=batch_sequences
    )  # [N, L]
    loss = -(weights * objective).sum()

    with torch.no_grad():
        tokens = in_completion.sum().clamp(min=1)
        clipped_low = (ratio < 1.0 - epsilon) & (advantages < 0) & in_completion  # [N, L]
        clipped_high = (ratio > 1.0 + epsilon_high) & (advantages > 0) & in_completion  # [N, L]
        stats = {
            "clip_frac": (clipped_low | clipped_high).sum() / tokens,
            "clip_frac_low": clipped_low.sum() / tokens,
            "clip_frac_high": clipped_high.sum() / tokens,
            "ratio_mean": (ratio * in_completion).sum() / tokens,
        }
    return loss, stats


def kl_k3(
    logprobs: torch.Tensor,  # [N, L]
    ref_logprobs: torch.Tensor,  # [N, L]
    completion_mask: torch.Tensor,  # [N, L]
) -> torch.Tensor:  # [N, L], 0 off the mask
    """k3 estimator of KL(pi || pi_ref) per token: exp(d) - d - 1 with d = ref_logp - logp.

    Non-negative, unbiased under samples from pi (Schulman 2020, "Approximating KL divergence").
    """
    log_ratio = torch.where(completion_mask > 0, ref_logprobs - logprobs, 0.0)  # [N, L]
    return log_ratio.exp() - log_ratio - 1.0


def value_loss(
    values: torch.Tensor,  # [N, L]
    returns: torch.Tensor,  # [N, L]
    completion_mask: torch.Tensor,  # [N, L]
) -> torch.Tensor:  # scalar
    """0.5 * mean over completion tokens of (V - return)^2; returns are treated as constants."""
    in_completion = completion_mask > 0  # [N, L]
    squared = torch.where(in_completion, (values - returns.detach()) ** 2, 0.0)  # [N, L]
    return 0.5 * squared.sum() / in_completion.sum().clamp(min=1)


def actor_loss(
    logprobs: torch.Tensor,  # [N, L] current policy, with grad
    old_logprobs: torch.Tensor,  # [N, L]
    advantages: torch.Tensor,  # [N, L] (times any truncated importance weight)
    completion_mask: torch.Tensor,  # [N, L]
    *,
    ref_logprobs: torch.Tensor | None = None,  # [N, L] the reference's; None: no KL term
    kl_coef: float = 0.0,
    kl_weights: torch.Tensor | None = None,  # [N, L] aggregation weights of the KL term
    **policy_kwargs,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, dict[str, torch.Tensor]]:
    """The part of the loss that depends on the policy's log-probs: `policy_loss` plus
    kl_coef * sum(w * k3). Returns (loss, pg_loss, kl_tokens [N, L] or None, stats)."""
    pg_loss, stats = policy_loss(logprobs, old_logprobs, advantages, completion_mask, **policy_kwargs)
    if ref_logprobs is None:
        return pg_loss, pg_loss, None, stats
    kl_tokens = kl_k3(logprobs, ref_logprobs, completion_mask)  # [N, L]
    return pg_loss + kl_coef * (kl_weights * kl_tokens).sum(), pg_loss, kl_tokens, stats


def token_loss_weights(
    logprobs: torch.Tensor,  # [N, L] the training forward's log-probs (detached here)
    old_logprobs: torch.Tensor,  # [N, L]
    advantages: torch.Tensor,  # [N, L]
    completion_mask: torch.Tensor,  # [N, L]
    **loss_kwargs,  # what `actor_loss` takes besides
) -> torch.Tensor:  # [N, L], 0 off the mask
    """The loss gradient's effective weight on each token, d loss / d log pi(y_t), by autograd of
    `actor_loss` at these log-probs: the loss gradient is sum_t (this) * grad log pi(y_t), after
    clipping, importance ratios, the KL term and token aggregation.

    On policy (ratio 1) with one advantage per rollout and no KL it is -w_t A_i, uniform within a
    rollout under every aggregation; clipped tokens get 0, token ratios scale it by rho_t, and
    the KL term adds kl_coef w_t (1 - exp(ref_logp_t - logp_t)).
    """
    with torch.enable_grad():
        leaf = logprobs.detach().clone().requires_grad_(True)
        loss = actor_loss(leaf, old_logprobs.detach(), advantages.detach(), completion_mask, **loss_kwargs)[0]
        (grad,) = torch.autograd.grad(loss, leaf)
    return torch.where(completion_mask > 0, grad, 0.0)


def uniform_weight_rollouts(
    weights: torch.Tensor,  # [N, L] token_loss_weights
    advantages: torch.Tensor,  # [N, L]
    completion_mask: torch.Tensor,  # [N, L]
    rtol: float = 1e-6,
) -> torch.Tensor:  # [3]: (uniform informative rollouts, informative rollouts, spread sum), float64
    """Sums for metrics.csv `token_weight_uniform_frac` and `token_weight_spread`: among rollouts
    with a non-zero advantage on some completion token (informative), those whose token weights
    are uniform, max_t |w_t - w_mean| <= rtol * max_t |w_t| over their completion tokens, and the
    sum over informative rollouts of that relative spread max_t |w_t - w_mean| / max_t |w_t|.
    No host read."""
    in_completion = completion_mask > 0  # [N, L]
    informative = ((advantages != 0) & in_completion).any(dim=-1)  # [N]
    tokens = in_completion.sum(dim=-1).clamp(min=1)  # [N]
    masked = torch.where(in_completion, weights, 0.0).double()  # [N, L]
    mean = masked.sum(dim=-1) / tokens  # [N]
    spread = torch.where(in_completion, (masked - mean[:, None]).abs(), 0.0).amax(dim=-1)  # [N]
    scale = masked.abs().amax(dim=-1)  # [N]
    uniform = informative & (spread <= rtol * scale)
    relative = torch.where(informative & (scale > 0), spread / scale.clamp(min=1e-300), 0.0)  # [N]
    return torch.stack([uniform.sum().double(), informative.sum().double(), relative.sum()])


def token_weight_readings(counts: torch.Tensor) -> torch.Tensor:  # [2] float64
    """metrics.csv (`token_weight_uniform_frac`, `token_weight_spread`) from the sums of
    `uniform_weight_rollouts` (added over passes): the uniform share and the mean relative spread
    over informative rollouts; NaN (0/0) when none was informative. No host read."""
    return counts[[0, 2]] / counts[1]
