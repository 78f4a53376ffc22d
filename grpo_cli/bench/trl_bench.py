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
TRL's phases come from the same PhaseTimer as grpo-cli's, fed by instance-level wrappers of TRL's
own methods (generation, rewards, accelerator.backward, clipping, optimizer step) and forward hooks
on TRL's model; grpo-cli's side is timed by its own loop, unpatched.
"""

from __future__ import annotations

import functools
import statistics
import tempfile
import time

import torch

from grpo_cli.bench.table import load_average, print_phase_table
from grpo_cli.integrations.trl_setup import (
    grpo_config_kwargs,
    load_trl_policy,
    task_dataset,
    task_reward,
)
from grpo_cli.models.loading import transformers_progress_bars
from grpo_cli.results.rows import PHASES
from grpo_cli.runtime.memory import peak_memory_mb, reset_step_peak
from grpo_cli.runtime.timing import PhaseTimer
from grpo_cli.runtime.transformers_api import checkpointing_argument
from grpo_cli.train.setup import freeze_long_lived_objects

# TRL's step split into the phases its methods allow; the rest of its step is `other`.
TRL_PHASES = ("rollout", "reward", "forward", "backward", "optimizer", "other")

def build_trl_trainer(setup, steps: int, options, output_dir: str, callbacks):
    from trl import GRPOConfig, GRPOTrainer

    cfg = setup.cfg
    with transformers_progress_bars(cfg.progress):  # the bench runs with progress=false
        model, tokenizer = load_trl_policy(setup.source_path, setup.device)
    kwargs = grpo_config_kwargs(cfg, steps=steps + 1, output_dir=output_dir, device_type=setup.device.type)
    kwargs.update(
        bf16=options.trl_bf16,
        **checkpointing_argument(options.trl_gradient_checkpointing),
        shuffle_dataset=False,  # grpo-cli's draw order (task_dataset below)
    )
    indices = [index for step in range(steps + 1) for index in setup.trainer.sample_problems(step, 0)]
    trl = GRPOTrainer(
        model=model,
        reward_funcs=task_reward(setup.task),
        args=GRPOConfig(**kwargs),
        train_dataset=task_dataset(setup.task, indices),
        processing_class=tokenizer,
        callbacks=callbacks,
    )
    return trl, model


def time_calls(owner, attribute: str, timer: PhaseTimer, name: str) -> None:
    """Time every call of `owner.attribute` (a TRL or accelerate object) as phase `name`."""
    original = getattr(owner, attribute)

    @functools.wraps(original)
    def timed(*args, **kwargs):
        with timer.phase(name):
            return original(*args, **kwargs)

    setattr(owner, attribute, timed)  # an instance attribute: only this TRL trainer is affected


def time_grad_forwards(model: torch.nn.Module, timer: PhaseTimer) -> None:
    """Time grad-enabled forwards of TRL's model as `forward` (its no-grad ones are sampling
    and old log-probs)."""

    def before(module, args, kwargs):
        if torch.is_grad_enabled():
            timer.start("forward")

    def after(module, args, kwargs, output):
        if torch.is_grad_enabled():
            timer.stop("forward")

    model.register_forward_pre_hook(before, with_kwargs=True)
    model.register_forward_hook(after, with_kwargs=True)


class AlternatingCallback:
    """Times TRL steps and runs the paired grpo-cli step outside TRL's step window."""

    def __init__(self, stepper, console):
        self.stepper = stepper
        self.console = console
        self.timer = PhaseTimer(stepper.setup.device)
        self.pairs: list[tuple[dict, dict]] = []
        self.trl = None  # set after the TRL trainer exists
        self.trl_model = None
        self._grpo_row: dict | None = None
        self._tokens = 0

    def instrument(self) -> None:
        """Wrap TRL's own methods once (its optimizer exists from the first step on); the timer
        counts only inside TRL's step window."""
        timer, trl = self.timer, self.trl
        generate = trl._generate_single_turn

        def counted_generate(*args, **kwargs):
            with timer.phase("rollout"):
                completion_ids, logprobs = generate(*args, **kwargs)
            self._tokens += sum(len(ids) for ids in completion_ids)
            return completion_ids, logprobs

        trl._generate_single_turn = counted_generate
        time_calls(trl, "_calculate_rewards", timer, "reward")
        time_calls(trl, "_clip_grad_norm", timer, "optimizer")
        time_calls(trl.optimizer, "step", timer, "optimizer")
        time_calls(trl.accelerator, "backward", timer, "backward")
        time_grad_forwards(self.trl_model, timer)

    def on_step_begin(self, args, state, control, **kwargs):
        pair = state.global_step
        if pair == 0:
            self.instrument()
        if pair % 2 == 1:
            self._grpo_row = self.stepper.step(pair)
        self._tokens = 0
        reset_step_peak(self.stepper.setup.device)
        self.timer.clear()
        self._cpu_start = time.process_time()
        self.timer.start("other")

    def on_step_end(self, args, state, control, **kwargs):
        self.timer.stop("other")
        cpu = time.process_time() - self._cpu_start
        phases = self.timer.take()
        pair = state.global_step - 1
        row = {
            "side": "trl",
            "step": pair,
            "step_s": sum(phases.values()),
            "cpu_s": cpu,
            **{phase: phases.get(phase, 0.0) for phase in TRL_PHASES},
            "tokens": self._tokens,
            "threads": torch.get_num_threads(),
        }
        row["tokens_per_s"] = row["tokens"] / row["step_s"]
        row["peak_mb"] = peak_memory_mb(self.stepper.setup.device)
        if pair % 2 == 0:
            self._grpo_row = self.stepper.step(pair)
        grpo = self._grpo_row
        self.pairs.append((grpo, row))
        self.console.print(
            f"pair {pair}{' (warm-up)' if pair == 0 else ''}: grpo-cli {grpo['step_s']:.3f}s "
            f"({grpo['tokens_per_s']:.0f} tok/s), TRL {row['step_s']:.3f}s "
            f"({row['tokens_per_s']:.0f} tok/s), ratio {grpo['step_s'] / row['step_s']:.3f} "
            f"(load {load_average()})"
        )


def run_vs_trl(setup, stepper, steps: int, options, console) -> list[dict]:
    """One warm-up pair, then `steps` timed pairs; print per-pair and median ratios."""
    from transformers import TrainerCallback

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
    print_phase_table(console, grpo_rows, "grpo-cli step", PHASES)
    print_phase_table(console, trl_rows, "TRL GRPOTrainer step", TRL_PHASES)
    target = RATIO_TARGETS.get((setup.device.type, options.model_size.lower()))
    summarize_pairs(console, grpo_rows, trl_rows, ratios, cpu_ratios, target)
    for grpo, trl_row, ratio, cpu_ratio in zip(grpo_rows, trl_rows, ratios, cpu_ratios, strict=True):
        grpo["ratio"] = trl_row["ratio"] = ratio
        grpo["cpu_ratio"] = trl_row["cpu_ratio"] = cpu_ratio
    return grpo_rows + trl_rows


# Issue 45's step-time ratios (grpo-cli / TRL, both at their defaults), by (device, model size);
# other pairs have none
RATIO_TARGETS = {("cpu", "smollm2"): 0.30, ("cpu", "tiny"): 0.33, ("cuda", "25m"): 0.30}


def summarize_pairs(console, grpo_rows, trl_rows, ratios, cpu_ratios, target: float | None = None) -> None:
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
        + (f"(issue 45's target <= {target:g}), " if target is not None else "")
        + f"CPU-time ratio {statistics.median(cpu_ratios):.3f}; "
        f"TRL/grpo-cli tokens/s ratio {token_ratio:.3f}"
    )
