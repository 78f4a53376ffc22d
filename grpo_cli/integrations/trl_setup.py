"""TRL's GRPOTrainer on a grpo-cli config: its GRPOConfig, reward function and prompt data set.

One owner for "the same work in TRL": `grpo bench --vs-trl` (grpo_cli/bench/trl_bench.py),
the TRL spectra example (scripts/trl_spectra_example.py) and the callback's tests build TRL
from these. TRL and datasets are imported inside the functions, so grpo-cli runs without them.
"""

from __future__ import annotations

from grpo_cli.runtime.transformers_api import checkpointing_argument

# grpo-cli settings that mirror TRL's loss_type="grpo", scale_rewards="group" advantages.
TRL_MATCHING_OVERRIDES = [
    "algorithm.loss_agg=seq_mean_token_mean",  # TRL "grpo": per-sequence token mean, then mean
    "algorithm.std=sample",  # TRL nanstd: ddof=1
    "algorithm.std_epsilon=1e-4",  # TRL: (r - mean) / (std + 1e-4)
]


def grpo_config_kwargs(cfg, *, steps: int, output_dir: str, device_type: str, loss_type: str = "grpo") -> dict:
    """GRPOConfig arguments for the work of `cfg` (a composed grpo-cli config): one optimizer
    step = prompts_per_step prompts x group_size completions, no accumulation, one pass, no KL,
    plain `generate` (no vLLM), no autocast, grpo-cli's sampling, optimizer settings and seed;
    nothing logged or saved. Callers add or override keys (bf16, checkpointing_argument(...), shuffle_dataset)."""
    algorithm, optim, rollout = cfg.algorithm, cfg.optim, cfg.rollout
    return dict(
        output_dir=output_dir,
        max_steps=steps,
        per_device_train_batch_size=rollout.prompts_per_step * rollout.group_size,
        gradient_accumulation_steps=1,
        num_generations=rollout.group_size,
        max_completion_length=rollout.max_new_tokens,
        learning_rate=optim.lr,
        lr_scheduler_type="constant",
        warmup_steps=0,
        adam_beta1=optim.betas[0],
        adam_beta2=optim.betas[1],
        weight_decay=optim.weight_decay,
        max_grad_norm=optim.max_grad_norm,
        epsilon=algorithm.epsilon,
        epsilon_high=algorithm.epsilon_high,
        loss_type=loss_type,
        scale_rewards="group",
        beta=0.0,
        num_iterations=1,
        temperature=rollout.temperature,
        top_p=rollout.top_p,
        top_k=0,
        use_vllm=False,
        bf16=False,  # TRL's default is bf16 autocast wherever the CPU/GPU supports it
        fp16=False,
        use_cpu=device_type == "cpu",
        **checkpointing_argument(False),  # its name depends on the transformers release
        seed=cfg.seed,
        report_to="none",
        logging_steps=10**6,
        save_strategy="no",
        disable_tqdm=True,
        dataloader_num_workers=0,
        dataloader_pin_memory=False,
        log_completions=False,
    )


def task_reward(task):
    """TRL reward function scoring each completion with the task's reward (column problem_index)."""

    def reward(prompts, completions, problem_index, **kwargs) -> list[float]:
        return [task.reward(text, task.train[i]) for text, i in zip(completions, problem_index, strict=True)]

    reward.__name__ = "task_reward"
    return reward


def task_dataset(task, indices: list[int] | None = None):
    """One row per training problem (prompt text and problem_index), in `indices` order."""
    from datasets import Dataset

    indices = list(range(len(task.train))) if indices is None else list(indices)
    return Dataset.from_dict(
        {"prompt": [task.prompt(task.train[i]) for i in indices], "problem_index": indices}
    )


def load_trl_policy(source_path: str, device, dtype=None):
    """The HF model and tokenizer TRL trains, from grpo-cli's HF directory (left padding)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from grpo_cli.models.loading import NO_REMOTE_CODE

    tokenizer = AutoTokenizer.from_pretrained(source_path, **NO_REMOTE_CODE)
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    tokenizer.padding_side = "left"
    model = AutoModelForCausalLM.from_pretrained(source_path, dtype=dtype or torch.float32,
                                                 **NO_REMOTE_CODE)
    return model.to(device), tokenizer
