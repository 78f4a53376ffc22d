"""`grpo bench --vs-trl`: TRL's GRPOTrainer on the same work, steps alternated with grpo-cli's.

Same work means: the same starting weights (TRL loads the HF directory grpo-cli loaded), the same
prompts in the same order (TRL's dataset is grpo-cli's per-step draws, unshuffled), the task's
reward, R = num_generations, one TRL optimizer step = B prompts x R completions
(per_device_train_batch_size = B*R, no accumulation), max_completion_length = max_new_tokens,
vanilla GRPO (loss_type "grpo", scale_rewards "group", beta 0, one iteration), plain
`generate` (no vLLM), temperature 1, top-p 1, top-k off, fp32 unless --trl-bf16, gradient
checkpointing off unless --trl-gradient-checkpointing (TRL's default is on; grpo-cli never
recomputes activations). grpo-cli is switched to TRL's loss and advantage conventions
(TRL_MATCHING_OVERRIDES), which changes no cost. TRL keeps its default optimizer (fused AdamW).

A TRL step is timed from `on_step_begin` to `on_step_end` (generation, reward, loss, backward,
clipping, optimizer, zero_grad); the grpo-cli step of the same pair runs inside the callback,
before TRL's step on odd pairs and after it on even ones, so neither side always goes first.
"""

from __future__ import annotations

import statistics
import tempfile
import time

import torch

from grpo_cli.bench.clock import PhaseClock
from grpo_cli.train.memory import peak_memory_mb
from grpo_cli.train.setup import freeze_long_lived_objects

# grpo-cli settings that mirror TRL's loss_type="grpo", scale_rewards="group" advantages.
TRL_MATCHING_OVERRIDES = [
    "algorithm.loss_agg=seq_mean_token_mean",  # TRL "grpo": per-sequence token mean, then mean
    "algorithm.std=sample",  # TRL nanstd: ddof=1
    "algorithm.std_epsilon=1e-4",  # TRL: (r - mean) / (std + 1e-4)
]


def trl_dataset(setup, steps: int):
    """One row per prompt, in grpo-cli's draw order for steps 0..steps."""
    from datasets import Dataset

    trainer, task = setup.trainer, setup.task
    indices = [index for step in range(steps + 1) for index in trainer.sample_problems(step, 0)]
    return Dataset.from_dict(
        {"prompt": [task.prompt(task.train[i]) for i in indices], "problem_index": indices}
    )


def make_reward(task):
    def task_reward(prompts, completions, problem_index, **kwargs) -> list[float]:
        return [task.reward(text, task.train[i]) for text, i in zip(completions, problem_index, strict=True)]

    return task_reward


def build_trl_trainer(setup, steps: int, options, output_dir: str, callbacks):
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    cfg = setup.cfg
    tokenizer = AutoTokenizer.from_pretrained(setup.source_path)
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    tokenizer.padding_side = "left"
    model = AutoModelForCausalLM.from_pretrained(setup.source_path, dtype=torch.float32)
    model.to(setup.device)
    group_size, prompts = cfg.rollout.group_size, cfg.rollout.prompts_per_step
    args = GRPOConfig(
        output_dir=output_dir,
        max_steps=steps + 1,
        per_device_train_batch_size=prompts * group_size,
        gradient_accumulation_steps=1,
        num_generations=group_size,
        max_completion_length=cfg.rollout.max_new_tokens,
        learning_rate=cfg.algorithm.lr,
        lr_scheduler_type="constant",
        warmup_steps=0,
        adam_beta1=cfg.algorithm.betas[0],
        adam_beta2=cfg.algorithm.betas[1],
        weight_decay=cfg.algorithm.weight_decay,
        max_grad_norm=cfg.algorithm.max_grad_norm,
        epsilon=cfg.algorithm.epsilon,
        epsilon_high=cfg.algorithm.epsilon_high,
        loss_type="grpo",
        scale_rewards="group",
        beta=0.0,
        num_iterations=1,
        temperature=cfg.rollout.temperature,
        top_p=cfg.rollout.top_p,
        top_k=0,
        use_vllm=False,
        bf16=options.trl_bf16,
        fp16=False,
        use_cpu=setup.device.type == "cpu",
        gradient_checkpointing=options.trl_gradient_checkpointing,
        shuffle_dataset=False,
        seed=cfg.seed,
        report_to="none",
        logging_steps=10**6,
        save_strategy="no",
        disable_tqdm=True,
        dataloader_num_workers=0,
        dataloader_pin_memory=False,
        log_completions=False,
    )
    trl = GRPOTrainer(
        model=model,
        reward_funcs=make_reward(setup.task),
        args=args,
        train_dataset=trl_dataset(setup, steps),
        processing_class=tokenizer,
        callbacks=callbacks,
    )
    return trl, model


class AlternatingCallback:
    """Times TRL steps and runs the paired grpo-cli step outside TRL's step window."""

    def __init__(self, stepper, console):
        self.stepper = stepper
        self.console = console
        self.clock = PhaseClock(synchronize=stepper.setup.device.type == "cuda")
        self.trl = None  # set after the TRL trainer exists
        self.trl_model = None
        self.pairs: list[tuple[dict, dict]] = []
        self._grpo_row: dict | None = None
        self._tokens = 0
        self._start = 0.0

    def _instrument(self) -> None:
        trl, clock = self.trl, self.clock
        generate = trl._generate_single_turn

        def counted_generate(*args, **kwargs):
            with clock.phase("rollout"):
                completion_ids, logprobs = generate(*args, **kwargs)
            self._tokens += sum(len(ids) for ids in completion_ids)
            return completion_ids, logprobs

        trl._generate_single_turn = counted_generate
        clock._undo.append(lambda: delattr(trl, "_generate_single_turn"))
        clock.wrap(trl, "_calculate_rewards", "reward")
        clock.wrap(trl, "_clip_grad_norm", "optimizer")
        clock.wrap(trl.optimizer, "step", "optimizer")
        clock.hook_forward(self.trl_model, "forward")
        clock.patch_backward("backward")

    def on_step_begin(self, args, state, control, **kwargs):
        pair = state.global_step
        if pair % 2 == 1:
            self._grpo_row = self.stepper.step(pair)
        self._tokens = 0
        self._instrument()
        self._cpu_start = time.process_time()
        self._start = self.clock._now()

    def on_step_end(self, args, state, control, **kwargs):
        total = self.clock._now() - self._start
        cpu = time.process_time() - self._cpu_start
        self.clock.detach()
        pair = state.global_step - 1
        phases = self.clock.reset()
        row = {
            "side": "trl",
            "step": pair,
            "step_s": total,
            "cpu_s": cpu,
            "rollout": phases.get("rollout", 0.0),
            "reward": phases.get("reward", 0.0),
            "forward": phases.get("forward", 0.0),
            "backward": phases.get("backward", 0.0),
            "optimizer": phases.get("optimizer", 0.0),
            "probes": 0.0,
            "tokens": self._tokens,
            "threads": torch.get_num_threads(),
        }
        row["train"] = total - row["rollout"] - row["reward"]
        row["train_other"] = row["train"] - row["forward"] - row["backward"] - row["optimizer"]
        row["tokens_per_s"] = row["tokens"] / total
        row["peak_mb"] = peak_memory_mb(self.stepper.setup.device)
        if pair % 2 == 0:
            self._grpo_row = self.stepper.step(pair)
        grpo = self._grpo_row
        self.pairs.append((grpo, row))
        from grpo_cli.bench.step_bench import load_average

        self.console.print(
            f"pair {pair}{' (warm-up)' if pair == 0 else ''}: grpo-cli {grpo['step_s']:.3f}s "
            f"({grpo['tokens_per_s']:.0f} tok/s), TRL {row['step_s']:.3f}s "
            f"({row['tokens_per_s']:.0f} tok/s), ratio {grpo['step_s'] / row['step_s']:.3f} "
            f"(load {load_average()})"
        )


def run_vs_trl(setup, stepper, steps: int, options, console) -> list[dict]:
    """One warm-up pair, then `steps` timed pairs; print per-pair and median ratios."""
    from transformers import TrainerCallback

    from grpo_cli.bench.step_bench import print_phase_table

    callback = AlternatingCallback(stepper, console)
    # transformers wants a TrainerCallback instance; give it one that forwards to ours
    bridge = type("Bridge", (TrainerCallback,), {
        "on_step_begin": lambda self, *a, **k: callback.on_step_begin(*a, **k),
        "on_step_end": lambda self, *a, **k: callback.on_step_end(*a, **k),
    })()
    with tempfile.TemporaryDirectory(prefix="grpo-bench-trl-") as output_dir:
        trl, trl_model = build_trl_trainer(setup, steps, options, output_dir, [bridge])
        callback.trl, callback.trl_model = trl, trl_model
        freeze_long_lived_objects()  # both sides' models and data, as `grpo run` does
        torch.set_num_threads(stepper.setup.cfg.threads or torch.get_num_threads())
        started = time.perf_counter()
        trl.train()
        console.print(f"[dim]{len(callback.pairs)} pairs in {time.perf_counter() - started:.1f}s[/dim]")
    timed = callback.pairs[1:]
    grpo_rows = [grpo for grpo, _ in timed]
    trl_rows = [trl_row for _, trl_row in timed]
    ratios = [grpo["step_s"] / trl_row["step_s"] for grpo, trl_row in timed]
    cpu_ratios = [grpo["cpu_s"] / trl_row["cpu_s"] for grpo, trl_row in timed]
    print_phase_table(console, grpo_rows, "grpo-cli step")
    print_phase_table(console, trl_rows, "TRL GRPOTrainer step")
    summarize_pairs(console, grpo_rows, trl_rows, ratios, cpu_ratios)
    for grpo, trl_row, ratio, cpu_ratio in zip(grpo_rows, trl_rows, ratios, cpu_ratios, strict=True):
        grpo["ratio"] = trl_row["ratio"] = ratio
        grpo["cpu_ratio"] = trl_row["cpu_ratio"] = cpu_ratio
    return grpo_rows + trl_rows


def summarize_pairs(console, grpo_rows, trl_rows, ratios, cpu_ratios) -> None:
    from rich.table import Table

    table = Table(title="grpo-cli vs TRL (same work, alternating steps)")
    for column in ("", "median step s", "median CPU s", "tokens/s", "completion tokens/step"):
        table.add_column(column, justify="right")
    for name, rows in (("grpo-cli", grpo_rows), ("TRL", trl_rows)):
        table.add_row(
            name,
            f"{statistics.median(r['step_s'] for r in rows):.4f}",
            f"{statistics.median(r['cpu_s'] for r in rows):.4f}",
            f"{statistics.median(r['tokens_per_s'] for r in rows):.0f}",
            f"{statistics.median(r['tokens'] for r in rows):.0f}",
        )
    console.print(table)
    console.print("per-pair ratio grpo-cli/TRL: " + ", ".join(f"{ratio:.3f}" for ratio in ratios))
    token_ratio = statistics.median(r["tokens_per_s"] for r in trl_rows) / statistics.median(
        r["tokens_per_s"] for r in grpo_rows
    )
    console.print(
        f"[bold]median step-time ratio {statistics.median(ratios):.3f}[/bold] "
        f"(target <= 0.5), CPU-time ratio {statistics.median(cpu_ratios):.3f}; "
        f"TRL/grpo-cli tokens/s ratio {token_ratio:.3f}"
    )
