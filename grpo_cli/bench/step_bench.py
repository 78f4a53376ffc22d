"""`grpo bench`: time GRPO steps on a fixed model and batch, split by phase, optionally vs TRL.

A thin command over the training loop `grpo run` uses (grpo_cli/train/loop.py): each timed step
is `TrainingLoop.run_step`, and its phase split is the same named timers that fill timings.csv
(rollout, reward, old_log_prob, advantage, forward, backward, optimizer, update, sync_weights,
probes, eval, other; docs/results.md). Nothing is patched or hooked on the grpo-cli side.

Defaults: `experiment=cpu_rank_collapse probes=off eval.every=0` (the CPU preset's
model and batch, no probes, no held-out evaluation) plus the user's Hydra overrides. Bench flags
mixed into the overrides:

  --model-size tiny|5m|25m|smollm2  the model (grpo_cli/bench/builder.py): char Llamas (5m, 25m
                             random) or SmolLM2-135M-Instruct
  --autocast bf16            = model.autocast=bf16 (bf16 matmuls, fp32 master weights and lm_head,
                             so log-probs come from fp32 logits; grpo_cli/train/autocast.py)
  --no-shared-prompt-forward = train.shared_prompt_forward=false (default: true, as in `grpo run`:
                             each distinct prompt computed once in the training forward;
                             grpo_cli/train/policy_forward.py); --shared-prompt-forward says the default
  --compile-decode           = rollout.compile_decode=true (with rollout.backend=hf_static)
  --out PATH                 also write one CSV row per timed step (re-runnable comparisons)
  --trl-bf16                 with --vs-trl: TRL with bf16=True (default: fp32, like grpo-cli)
  --trl-gradient-checkpointing  with --vs-trl: TRL's own default (default here: off, like grpo-cli)

One warm-up step, then `steps` timed steps; the table shows medians. Step time is the loop step's
wall time (`time_step`, the sum of its phases); tokens/s counts completion tokens (through EOS),
so shorter completions cannot pass for speed. Each row also records the process CPU time of the
step (`cpu_s`), a steadier number than wall time on a machine shared with other jobs.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from grpo_cli.bench.table import describe, load_average, print_phase_table, write_rows
from grpo_cli.results.rows import PHASES
from grpo_cli.train.loop import TrainingLoop

DEFAULT_OVERRIDES = [
    "experiment=cpu_rank_collapse", "probes=off", "eval.every=0",
    "progress=false",
]


RENAMED_FLAGS = {"--shared-prefix": "--shared-prompt-forward"}  # old flag -> its name now


@dataclass
class BenchOptions:
    model_size: str = "tiny"
    autocast: str | None = None  # "bf16" or None
    shared_prompt_forward: bool = True  # train.shared_prompt_forward (grpo run's default): each distinct prompt computed once
    compile_decode: bool = False  # hf_static: torch.compile the decode step
    out: str | None = None
    trl_bf16: bool = False
    trl_gradient_checkpointing: bool = False
    overrides: list[str] = field(default_factory=list)


def parse_bench_args(args: list[str]) -> BenchOptions:
    """Split `--flag value` bench options from Hydra overrides."""
    options = BenchOptions()
    valued = {"--model-size": "model_size", "--autocast": "autocast", "--out": "out"}
    switches = {
        "--trl-bf16": "trl_bf16",
        "--trl-gradient-checkpointing": "trl_gradient_checkpointing",
        "--shared-prompt-forward": "shared_prompt_forward",
        "--compile-decode": "compile_decode",
    }
    items = list(args)
    while items:
        item = items.pop(0)
        name, _, inline = item.partition("=")
        if name in valued:
            value = inline if inline else (items.pop(0) if items else None)
            if value is None:
                raise ValueError(f"{name} needs a value")
            setattr(options, valued[name], value)
        elif name in switches:
            setattr(options, switches[name], True)
        elif name == "--no-shared-prompt-forward":
            options.shared_prompt_forward = False
        elif name in RENAMED_FLAGS:
            raise ValueError(f"{name} was renamed {RENAMED_FLAGS[name]}")
        elif item.startswith("--"):
            raise ValueError(f"unknown bench option {item!r}")
        else:
            options.overrides.append(item)
    if options.autocast not in (None, "bf16", "none"):
        raise ValueError(f"--autocast {options.autocast!r}: only bf16 is supported")
    if options.autocast == "none":
        options.autocast = None
    return options


def flag_overrides(options: BenchOptions) -> list[str]:
    """Bench flags as config settings, explicit both ways: a run without a flag means 'off'."""
    return [
        f"train.shared_prompt_forward={str(options.shared_prompt_forward).lower()}",
        f"model.autocast={options.autocast or 'none'}",
        f"rollout.compile_decode={str(options.compile_decode).lower()}",
    ]


def compose_bench_config(options: BenchOptions, extra: list[str] | None = None):
    from grpo_cli.bench.builder import size_overrides
    from grpo_cli.config.compose import compose_config

    overrides = DEFAULT_OVERRIDES + size_overrides(options.model_size) + list(extra or [])
    return compose_config(overrides + flag_overrides(options) + options.overrides)


class GrpoStepper:
    """Runs and times grpo-cli steps of one BenchSetup with the training loop of `grpo run`."""

    def __init__(self, setup):
        self.setup = setup
        self.loop = TrainingLoop(setup.cfg, setup)

    def step(self, step: int) -> dict:
        if self.setup.device.type == "cuda":
            torch.cuda.synchronize()  # nothing queued before the step is charged to it
        cpu_start = time.process_time()
        done = self.loop.run_step(step)
        cpu = time.process_time() - cpu_start
        timings = done.timings
        row = {
            "side": "grpo-cli",
            "step": step,
            "step_s": timings["time_step"],
            "cpu_s": cpu,
            **{phase: timings[f"time_{phase}"] for phase in PHASES},
            "tokens": int(done.output.metrics["tokens"]),
            "rows": done.output.batch.num_rollouts,
            "threads": torch.get_num_threads(),
            "peak_mb": timings["peak_memory_mb"],
        }
        row["tokens_per_s"] = row["tokens"] / row["step_s"]
        return row


def prepare_bench(overrides: list[str], vs_trl: bool = False):
    """(BenchOptions, composed config) of a bench command line: ValueError for a bad bench flag
    or model size, Hydra's and OmegaConf's errors for a bad override (`grpo bench` words them in
    one line)."""
    options = parse_bench_args(overrides)
    extra = []
    if vs_trl:
        from grpo_cli.integrations.trl_setup import TRL_MATCHING_OVERRIDES

        extra = TRL_MATCHING_OVERRIDES
    return options, compose_bench_config(options, extra)


def run_bench(overrides: list[str], steps: int = 5, vs_trl: bool = False) -> list[dict]:
    """Time `steps` GRPO steps after one warm-up; print the phase split; return the rows."""
    return run_prepared(*prepare_bench(overrides, vs_trl), steps=steps, vs_trl=vs_trl)


def run_prepared(options: BenchOptions, cfg, steps: int = 5, vs_trl: bool = False) -> list[dict]:
    """`run_bench` from `prepare_bench`'s options and config."""
    from rich.console import Console

    from grpo_cli.bench.builder import build_setup

    if steps < 1:
        raise ValueError(f"--steps {steps}: at least one timed step")
    console = Console()
    setup = build_setup(cfg, log=lambda message: console.print(f"[dim]{message}[/dim]"))
    console.print(describe(setup))
    label = (
        f"{cfg.model.name} {cfg.rollout.backend}"
        + (f" autocast={options.autocast}" if options.autocast else "")
        + (" shared_prompt_forward" if options.shared_prompt_forward else "")
        + (" compiled" if options.compile_decode else "")
        + (" cuda_graphs" if getattr(setup.trainer.backend, "cuda_graphs", False) else "")  # resolved
    )
    stepper = GrpoStepper(setup)
    meta = {"label": label, "load_start": load_average(), "model_size": options.model_size}
    if vs_trl:
        meta["trl"] = ("bf16" if options.trl_bf16 else "fp32") + (
            " +grad-ckpt" if options.trl_gradient_checkpointing else ""
        )
    if vs_trl:
        from grpo_cli.bench.trl_bench import run_vs_trl

        rows = run_vs_trl(setup, stepper, steps, options, console)
    else:
        from grpo_cli.train.setup import freeze_long_lived_objects

        freeze_long_lived_objects()
        console.print(f"warm-up step (load average {load_average()})")
        stepper.step(0)
        rows = []
        for step in range(1, steps + 1):
            rows.append(stepper.step(step))
            console.print(
                f"step {step}: {rows[-1]['step_s']:.3f}s, {rows[-1]['tokens']} tokens "
                f"(load {load_average()})"
            )
        print_phase_table(console, rows, f"grpo-cli step: {label}", PHASES)
    meta["load_end"] = load_average()
    console.print(f"load average at start {meta['load_start']}, at end {meta['load_end']}")
    if options.out:
        write_rows(options.out, rows, meta)
        console.print(f"wrote {options.out}")
    return rows
