"""TRL's GRPO batch and loss in grpo-cli's terms: the rows, token weights and advantages whose
per-rollout gradients the probes decompose (grpo_cli/probes/runner.py). Plain torch; TRL is
not imported here.

TRL (trl/trainer/grpo_trainer.py, `_compute_loss`) minimises agg(-min(r A, clip(r) A) m) over
the tokens of the optimizer step's N rollouts, r = exp(logp - logp_old) the token ratio and m
the loss mask. With one pass per generation and generation aligned with the optimizer step,
logp_old = logp.detach() (TRL computes none, or, under vLLM's correction, computes it at the same
weights): r = 1, the clip is inactive, and the gradient of rollout i's share of the loss is

    g_i = -A_i sum_t w_it grad log pi(y_it | prefix),

with w the aggregation weights of TRL's `loss_type` (checked against TRL 1.16):

| loss_type | w_it | why |
| --- | --- | --- |
| `grpo` | m_it / (N max(sum_t m_it, 1)) | per-sequence token mean, mean over rows (/ accumulation) |
| `bnpo` | m_it / max(sum m, 1) | token mean over the micro-batch: one micro-batch per step |
| `dr_grpo` | m_it / (N max_completion_length) | sum over tokens / (rows x max length) |
| `dapo` | m_it / max(num_items_in_batch, 1) | sum over tokens / the step's loss tokens |

Under DDP (P processes, trl_distributed.py) each process's loss is the above over its own N/P
rows (dapo: num_items_in_batch counts every process's tokens, and TRL divides it by P) and DDP
averages the gradients, so a row's weight is its process's w_it / P: for grpo, dr_grpo and dapo
that is the single-process weight over all N rows; for bnpo it is a token mean per process.

With vLLM generation and `vllm_importance_sampling_correction=True` (TRL's default), TRL computes
logp_old with the training model before the step (so r = 1 still) and multiplies each token's
loss by rho_it = exp(logp_old - logp_vllm), truncated or masked by `vllm_importance_sampling_mode`
(a constant, no gradient); the row is then -A_i sum_t w_it rho_it grad log pi, and w_it above is
replaced by w_it rho_it: the probes record the corrected gradient, the one TRL's loss
differentiates.

That is grpo-cli's per-rollout row "advantage x loss token weights" (docs/results.md), so the
probes need only the batch, w and A. Settings that change the gradient otherwise (a KL term, a
PPO ratio that is not 1, masks on entropy or off-policy tokens, an entropy bonus, other loss types)
are refused by `unsupported_settings`, each with the setting's name; so are the ways of sharding
the model the probes cannot follow (`sharding_problems`: FSDP1, DeepSpeed, and under FSDP2 the
`update` and `grad_sum` matrices). Under FSDP2 each process's loss is TRL's over its own rows and
FSDP2 averages the gradients over the processes, as DDP does: the weights below hold unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from grpo_cli.rollout.batch import RolloutBatch, assemble_batch

SUPPORTED_LOSS_TYPES = ("grpo", "bnpo", "dr_grpo", "dapo")


def unsupported_settings(args, trainer=None, matrices=()) -> list[str]:
    """Why the probes cannot reproduce this TRL run's gradient (empty list: they can).

    `args` is TRL's GRPOConfig; `trainer` (optional) its GRPOTrainer, for how its processes
    share the model (DDP, or FSDP2 for some `matrices`: docs/trl.md "Sharded runs") and the MoE
    auxiliary loss. Attributes absent from an older TRL read as their neutral value.
    """
    problems = []
    loss_type = getattr(args, "loss_type", None)
    if loss_type not in SUPPORTED_LOSS_TYPES:
        problems.append(
            f"loss_type={loss_type!r} is not supported (supported: {', '.join(SUPPORTED_LOSS_TYPES)}): "
            "its per-token weights are not the advantage times a fixed aggregation weight"
        )
    if getattr(args, "beta", 0.0) != 0.0:
        problems.append(f"beta={args.beta}: the KL term adds a per-token gradient the probes do not model; set beta=0.0")
    if getattr(args, "num_iterations", 1) != 1:
        problems.append(f"num_iterations={args.num_iterations}: the ratio is not 1 after the first pass; set num_iterations=1")
    accumulation = getattr(args, "gradient_accumulation_steps", 1)
    per_generation = getattr(args, "steps_per_generation", None) or accumulation
    if per_generation != accumulation:
        problems.append(
            f"steps_per_generation={per_generation} != gradient_accumulation_steps={accumulation}: "
            "one generation must be exactly one optimizer step's batch"
        )
    if getattr(args, "importance_sampling_level", "token") != "token":
        problems.append(f"importance_sampling_level={args.importance_sampling_level!r}: only 'token' is verified")
    if getattr(args, "top_entropy_quantile", 1.0) < 1.0:
        problems.append(f"top_entropy_quantile={args.top_entropy_quantile}: the entropy mask drops tokens; set 1.0")
    if getattr(args, "off_policy_mask_threshold", None) is not None:
        problems.append("off_policy_mask_threshold is set: the off-policy mask drops sequences; set None")
    if getattr(args, "entropy_coef", 0.0) != 0.0 or getattr(args, "use_adaptive_entropy", False):
        problems.append("entropy_coef / use_adaptive_entropy: the entropy bonus adds a gradient; set entropy_coef=0.0")
    delta = getattr(args, "delta", None)
    if delta is not None and delta <= 1.0:
        problems.append(f"delta={delta}: the two-sided clip is active at ratio 1; use None or a value > 1")
    if loss_type == "bnpo" and accumulation != 1:
        problems.append("loss_type='bnpo' with gradient_accumulation_steps > 1: its weights depend on the shuffled micro-batches")
    if trainer is not None:
        problems += sharding_problems(getattr(trainer, "accelerator", None), matrices)
        if getattr(trainer, "aux_loss_enabled", False):
            problems.append("router_aux_loss_coef != 0: the MoE auxiliary loss adds a gradient")
    return problems


# matrices that read the parameters or keep running sums of `.grad` on one process: under FSDP2
# each process holds a DTensor shard of them (the per-rollout matrices and `layer` read the
# gradients whole through collectives every process joins: ProbeSuite.capture_layer_grads)
SHARDED_REFUSED_MATRICES = ("update", "grad_sum")


def sharding_problems(accelerator, matrices=()) -> list[str]:
    """How the accelerator's processes share the model, where the probes cannot follow: DDP
    (MULTI_*) and FSDP2 are supported (docs/trl.md "Sharded runs"), FSDP1 and DeepSpeed are not,
    nor, under FSDP2, the matrices of SHARDED_REFUSED_MATRICES."""
    kind = getattr(getattr(accelerator, "distributed_type", None), "name", "NO")
    if kind == "NO" or kind.startswith("MULTI_"):  # MULTI_CPU, MULTI_GPU, ...: DDP
        return []
    if kind == "DEEPSPEED":
        return ["distributed_type=DEEPSPEED: ZeRO's partitioned parameters are not supported (DeepSpeed "
                "was not installed here and never tried); use FSDP2 (fsdp_version=2) or DDP"]
    if kind != "FSDP":
        return [f"distributed_type={kind}: not supported; use DDP or FSDP2 (fsdp_version=2)"]
    version = getattr(getattr(getattr(accelerator, "state", None), "fsdp_plugin", None), "fsdp_version", 1)
    if version != 2:
        return [f"distributed_type=FSDP with fsdp_version={version}: FSDP1's flat parameters are not "
                "supported (the probes hook each layer's own weights); use fsdp_version=2"]
    refused = [m for m in SHARDED_REFUSED_MATRICES if m in matrices]
    if refused:
        return [f"matrices {', '.join(refused)} under FSDP2: each process holds a shard of the weights "
                "and of their running gradient sum, and these are not gathered; leave them out of matrices"]
    return []


@dataclass
class TrlStep:
    """One optimizer step's TRL batch in grpo-cli's terms (rows of a group contiguous)."""

    batch: RolloutBatch
    advantages: torch.Tensor  # [N, L] A_i on rollout i's loss tokens, 0 elsewhere
    loss_weights: torch.Tensor  # [N, L] w_it of TRL's loss_type (module docstring)


# TrlRows' columns: name -> (padding value, pad on the left), for padding across processes
ROW_FIELDS = {
    "prompt_ids": (None, True),  # [N, Lp] long, left-padded (None: the pad token)
    "prompt_mask": (0, True),  # [N, Lp]
    "completion_ids": (None, False),  # [N, Lc] long, right-padded
    "completion_mask": (0, False),  # [N, Lc] real completion tokens (attention)
    "loss_mask": (0, False),  # [N, Lc] float, tokens the loss counts (tool tokens masked)
    "sampler_logprobs": (0, False),  # [N, Lc] float, vLLM's / generate's log-probs (0: none)
    "advantages": (0, False),  # [N, Lc] A_i on every completion column
    "weights": (0, False),  # [N, Lc] w_it: share of the optimizer step's (all-process) gradient,
    # times vLLM's importance-sampling ratio where TRL applies one
}


def trl_rows(
    output: dict,  # TRL's `_generate_and_score_completions` output, before its shuffle
    loss_type: str,
    max_completion_length: int,
    processes: int = 1,  # data-parallel processes whose gradients DDP averages
) -> dict[str, torch.Tensor]:  # ROW_FIELDS, this process's rows
    """This process's rows of the step, with the weights of its rows in the averaged gradient.

    Under DDP each process's loss is TRL's loss over its own rows (dapo divides by the global
    token count / processes) and the gradient is the mean over processes, so w_it is the
    single-process weight of the local batch divided by `processes`.
    """
    if any(key in output for key in ("pixel_values", "image_grid_thw", "num_images")):
        raise ValueError("multimodal TRL batches are not supported by the spectra probes")
    completion_ids, completion_mask = output["completion_ids"], output["completion_mask"]  # [N, Lc]
    loss_mask = completion_mask.float()  # [N, Lc]
    if output.get("tool_mask") is not None:
        loss_mask = loss_mask * output["tool_mask"].float()
    sampler = output.get("sampling_per_token_logps")  # [N, Lc] or None
    sampler = torch.zeros_like(loss_mask) if sampler is None else sampler.float().nan_to_num(0.0)
    advantages = output["advantages"].float()  # [N] (or [N, Lc] from a TRL subclass)
    if advantages.dim() == 1:
        advantages = advantages.unsqueeze(1).expand(-1, completion_ids.shape[1])
    weights = loss_weights(loss_type, loss_mask, max_completion_length, output.get("num_items_in_batch"),
                           processes) / processes
    ratio = output.get("importance_sampling_ratio")  # [N, Lc] or [N, 1]: vLLM's correction, or None
    if ratio is not None:  # TRL multiplies each token's loss by it (a constant: no gradient)
        weights = weights * ratio.float()
    return {
        "prompt_ids": output["prompt_ids"], "prompt_mask": output["prompt_mask"],
        "completion_ids": completion_ids, "completion_mask": completion_mask,
        "loss_mask": loss_mask, "sampler_logprobs": sampler,
        "advantages": advantages * (loss_mask > 0), "weights": weights,
    }


def trl_step(rows: dict[str, torch.Tensor], group_size: int) -> TrlStep:
    """Join the prompt and completion columns of `trl_rows` (one process's or every process's
    rows) into one [N, L] batch."""
    count, prompt_length = rows["prompt_ids"].shape
    if count % group_size:
        raise ValueError(f"TRL batch of {count} rows is not a whole number of groups of {group_size}")
    batch = assemble_batch(
        rows["prompt_ids"], rows["prompt_mask"], rows["completion_ids"], rows["loss_mask"],
        rows["sampler_logprobs"], group_size, completion_attention=rows["completion_mask"],
    )
    prompt_zeros = rows["loss_mask"].new_zeros(count, prompt_length)  # [N, Lp]
    advantages = torch.cat([prompt_zeros, rows["advantages"]], dim=1)  # [N, L]
    weights = torch.cat([prompt_zeros, rows["weights"]], dim=1)  # [N, L]
    return TrlStep(batch, advantages, weights)


def loss_weights(
    loss_type: str,
    mask: torch.Tensor,  # [N, L] loss mask (0 on prompt, padding and masked tokens)
    max_completion_length: int,
    num_items_in_batch: torch.Tensor | float | None = None,  # dapo: the step's loss tokens
    processes: int = 1,  # dapo: TRL divides num_items_in_batch (all processes' tokens) by them
) -> torch.Tensor:  # [N, L]
    """w_it of TRL's loss aggregation on one process's batch (table in the module docstring)."""
    rows = mask.shape[0]
    if loss_type == "grpo":
        return mask / (rows * mask.sum(dim=1, keepdim=True).clamp(min=1.0))
    if loss_type == "bnpo":
        return mask / mask.sum().clamp(min=1.0)
    if loss_type == "dr_grpo":
        return mask / (rows * max_completion_length)
    if loss_type == "dapo":
        items = mask.sum() if num_items_in_batch is None else torch.as_tensor(num_items_in_batch)
        return mask / (items.to(mask).clamp(min=1.0) / processes)
    raise ValueError(f"loss_type={loss_type!r} is not supported (supported: {', '.join(SUPPORTED_LOSS_TYPES)})")
