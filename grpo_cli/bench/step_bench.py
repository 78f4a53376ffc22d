"""`grpo bench`: time GRPO steps on a fixed model and batch, split by phase, optionally vs TRL.

Defaults: `experiment=cpu_rank_collapse analysis=off` (the CPU preset's model and batch, no
probes) plus the user's Hydra overrides. Bench flags mixed into the overrides:

  --model-size tiny|5m|25m   char Llama size (see grpo_cli/bench/builder.py); 25m is random
  --autocast bf16            = model.autocast=bf16 (bf16 matmuls, fp32 master weights and lm_head,
                             so log-probs come from fp32 logits; grpo_cli/train/autocast.py)
  --shared-prefix            = algorithm.shared_prompt_forward=true (each distinct prompt computed
                             once in the training forward; grpo_cli/train/policy_forward.py);
                             without it the bench sets it false, so flags mean what they say
  --sorted-micro-batches N   length-sorted micro-batches of N rows, trimmed of all-pad columns
                             (a prototype the bench patches in; grpo_cli/bench/speedups.py)
  --compile-decode           = rollout.compile_decode=true (with rollout.backend=hf_static)
  --out PATH                 also write one CSV row per timed step (re-runnable comparisons)
  --trl-bf16                 with --vs-trl: TRL with bf16=True (default: fp32, like grpo-cli)
  --trl-gradient-checkpointing  with --vs-trl: TRL's own default (default here: off, like grpo-cli)

One warm-up step, then `steps` timed steps; the table shows medians. Step time is wall time of
`GRPOTrainer.step` (+ probes when analysis is on); tokens/s counts completion tokens (through
EOS), so shorter completions cannot pass for speed. Each row also records the process CPU time
of the step (`cpu_s`), a steadier number than wall time on a machine shared with other jobs.
"""

from __future__ import annotations

import os
import platform
import statistics
import time
from dataclasses import dataclass, field

import torch

from grpo_cli.bench.clock import PhaseClock
from grpo_cli.train.memory import peak_memory_mb, reset_step_peak

# analysis.every=0: the experiment preset sets analysis.every after the analysis group's own value.
DEFAULT_OVERRIDES = ["experiment=cpu_rank_collapse", "analysis=off", "analysis.every=0", "progress=false"]
PHASES = ("rollout", "reward", "forward", "backward", "optimizer", "train_other", "probes")


@dataclass
class BenchOptions:
    model_size: str = "tiny"
    autocast: str | None = None  # "bf16" or None
    sorted_micro_batches: int = 0  # rows per length-sorted, trimmed micro-batch (0 = off)
    shared_prefix: bool = False  # training forward with each distinct prompt computed once
    compile_decode: bool = False  # hf_static: torch.compile the decode step
    out: str | None = None
    trl_bf16: bool = False
    trl_gradient_checkpointing: bool = False
    overrides: list[str] = field(default_factory=list)


def parse_bench_args(args: list[str]) -> BenchOptions:
    """Split `--flag value` bench options from Hydra overrides."""
    options = BenchOptions()
    valued = {"--model-size": "model_size", "--autocast": "autocast", "--out": "out",
              "--sorted-micro-batches": "sorted_micro_batches"}
    switches = {
        "--trl-bf16": "trl_bf16",
        "--trl-gradient-checkpointing": "trl_gradient_checkpointing",
        "--shared-prefix": "shared_prefix",
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
            kind = type(getattr(BenchOptions(), valued[name]))
            setattr(options, valued[name], int(value) if kind is int else value)
        elif name in switches:
            setattr(options, switches[name], True)
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
        f"algorithm.shared_prompt_forward={str(options.shared_prefix).lower()}",
        f"model.autocast={options.autocast or 'none'}",
        f"rollout.compile_decode={str(options.compile_decode).lower()}",
    ]


def compose_bench_config(options: BenchOptions, extra: list[str] | None = None):
    from grpo_cli.bench.builder import size_overrides
    from grpo_cli.config.compose import compose_config

    overrides = DEFAULT_OVERRIDES + size_overrides(options.model_size) + list(extra or [])
    return compose_config(overrides + flag_overrides(options) + options.overrides)


class GrpoStepper:
    """Runs and times grpo-cli steps of one BenchSetup."""

    def __init__(self, setup, options: BenchOptions):
        from grpo_cli.bench.speedups import apply_sorted_micro_batches

        self.setup = setup
        self.options = options
        self.clock = PhaseClock(synchronize=setup.device.type == "cuda")
        if options.sorted_micro_batches > 0:
            apply_sorted_micro_batches(setup.trainer, options.sorted_micro_batches)

    def _instrument(self) -> None:
        trainer, clock = self.setup.trainer, self.clock
        clock.wrap(trainer.backend, "generate", "rollout")
        clock.wrap(trainer, "score", "reward")
        clock.wrap(trainer.optimizer, "step", "optimizer")
        clock.wrap(torch.nn.utils, "clip_grad_norm_", "optimizer")
        clock.hook_forward(self.setup.model, "forward")
        clock.patch_backward("backward")

    def step(self, step: int) -> dict:
        setup, trainer, probes = self.setup, self.setup.trainer, self.setup.probes
        reset_step_peak(setup.device)
        if setup.device.type == "cuda":
            torch.cuda.synchronize()
        self._instrument()
        start, cpu_start = time.perf_counter(), time.process_time()
        try:
            output = trainer.step(step, capture_layers=probes.capture_layer_grads if probes else None)
            if probes is not None:
                with self.clock.phase("probes", own_passes=True):
                    probes.record(step, output, setup.model)
            if setup.device.type == "cuda":
                torch.cuda.synchronize()
            total = time.perf_counter() - start
            cpu = time.process_time() - cpu_start
        finally:
            self.clock.detach()
        phases = self.clock.reset()
        train = output.timings["time_train"]
        row = {
            "side": "grpo-cli",
            "step": step,
            "step_s": total,
            "cpu_s": cpu,
            "rollout": phases.get("rollout", 0.0),
            "reward": phases.get("reward", 0.0) + output.timings["time_reward"],
            "forward": phases.get("forward", 0.0),
            "backward": phases.get("backward", 0.0),
            "optimizer": phases.get("optimizer", 0.0),
            "train": train,
            "probes": phases.get("probes", 0.0),
            "tokens": int(output.metrics["tokens"]),
            "rows": output.batch.num_rollouts,
            "threads": torch.get_num_threads(),
        }
        row["train_other"] = train - row["forward"] - row["backward"] - row["optimizer"]
        row["tokens_per_s"] = row["tokens"] / total
        row["peak_mb"] = peak_memory_mb(setup.device)
        return row


def median(rows: list[dict], key: str) -> float:
    values = [row[key] for row in rows if key in row]
    return statistics.median(values) if values else float("nan")


def load_average() -> str:
    try:
        return " ".join(f"{value:.2f}" for value in os.getloadavg())
    except OSError:  # pragma: no cover
        return "n/a"


def describe(setup) -> str:
    cfg = setup.cfg
    params = sum(p.numel() for p in setup.model.parameters())
    return (
        f"model {cfg.model.name} ({params / 1e6:.2f}M params), backend {cfg.rollout.backend}, "
        f"B={cfg.rollout.prompts_per_step} x R={cfg.rollout.group_size}, "
        f"max_new_tokens={cfg.rollout.max_new_tokens}, micro_batch={cfg.algorithm.micro_batch_size}, "
        f"device {setup.device}, threads {torch.get_num_threads()}, torch {torch.__version__}, "
        f"{platform.processor() or platform.machine()}"
    )


def print_phase_table(console, rows: list[dict], title: str) -> None:
    from rich.table import Table

    table = Table(title=title)
    table.add_column("phase")
    table.add_column("median s", justify="right")
    table.add_column("share", justify="right")
    total = median(rows, "step_s")
    for phase in PHASES:
        value = median(rows, phase)
        if phase == "probes" and not value:
            continue
        table.add_row(phase, f"{value:.4f}", f"{value / total:.0%}" if total else "")
    table.add_row("step", f"{total:.4f}", "100%", style="bold")
    table.add_row("step CPU time", f"{median(rows, 'cpu_s'):.4f}", "")
    table.add_row("tokens/s", f"{median(rows, 'tokens_per_s'):.0f}", "")
    table.add_row("completion tokens/step", f"{median(rows, 'tokens'):.0f}", "")
    table.add_row("peak memory MB", f"{max(row['peak_mb'] for row in rows):.0f}", "")
    console.print(table)


def write_rows(path: str, rows: list[dict], meta: dict) -> None:
    import pandas as pd

    frame = pd.DataFrame(rows)
    for key, value in meta.items():
        frame[key] = value
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    header = not os.path.exists(path)
    frame.to_csv(path, mode="a", header=header, index=False)


def run_bench(overrides: list[str], steps: int = 5, vs_trl: bool = False) -> list[dict]:
    """Time `steps` GRPO steps after one warm-up; print the phase split; return the rows."""
    from rich.console import Console

    from grpo_cli.bench.builder import build_setup

    console = Console()
    options = parse_bench_args(overrides)
    extra = []
    if vs_trl:
        from grpo_cli.bench.trl_bench import TRL_MATCHING_OVERRIDES

        extra = TRL_MATCHING_OVERRIDES
    cfg = compose_bench_config(options, extra)
    setup = build_setup(cfg, log=lambda message: console.print(f"[dim]{message}[/dim]"))
    console.print(describe(setup))
    label = (
        f"{cfg.model.name} {cfg.rollout.backend}"
        + (f" autocast={options.autocast}" if options.autocast else "")
        + (f" sorted_mb={options.sorted_micro_batches}" if options.sorted_micro_batches else "")
        + (" shared_prefix" if options.shared_prefix else "")
        + (" compiled" if options.compile_decode else "")
    )
    stepper = GrpoStepper(setup, options)
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
        print_phase_table(console, rows, f"grpo-cli step: {label}")
    meta["load_end"] = load_average()
    console.print(f"load average at start {meta['load_start']}, at end {meta['load_end']}")
    if options.out:
        write_rows(options.out, rows, meta)
        console.print(f"wrote {options.out}")
    return rows
