"""Gradient spectra of a TRL GRPOTrainer run, then `grpo analyze` (`make trl-example`).

Trains TRL's GRPOTrainer on the CPU preset's model and task (experiment=cpu_rank_collapse: the
warm-started char Llama on two-step arithmetic, B = 8 prompts, 32 new tokens) once per group
size, with grpo-cli's SpectraCallback recording spectra, ranks and metrics into
results/trl_example/R<R>-grpo-s<seed>/, then analyses the sweep as `grpo analyze` does and
prints the probe overhead read from the runs' timings.csv. A few minutes on 2 CPU cores (the
first run warm-starts the model once, cached in .cache/).

    python scripts/trl_spectra_example.py --group-sizes 2 4 --steps 40 --every 5

Under DDP, the same global batch split over the processes (the main process writes and prints;
run it once in one process first so that the warm-started model is cached):

    OMP_NUM_THREADS=1 torchrun --standalone --nproc_per_node 2 scripts/trl_spectra_example.py --group-sizes 4
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import warnings
from pathlib import Path

import pandas as pd
import torch


def train_one(cfg, task, source_path: str, run_dir: Path, args) -> None:
    from trl import GRPOConfig, GRPOTrainer

    from grpo_cli.integrations.trl_setup import (
        grpo_config_kwargs,
        load_trl_policy,
        task_dataset,
        task_reward,
    )
    from grpo_cli.integrations.trl_spectra import SpectraCallback

    model, tokenizer = load_trl_policy(source_path, "cpu")
    with tempfile.TemporaryDirectory(prefix="trl-example-") as scratch:
        kwargs = grpo_config_kwargs(cfg, steps=args.steps, output_dir=scratch, device_type="cpu",
                                    loss_type=args.loss_type)
        processes = int(os.environ.get("WORLD_SIZE", "1"))  # torchrun: the global batch split over them
        if kwargs["per_device_train_batch_size"] % processes:
            raise SystemExit(f"{kwargs['per_device_train_batch_size']} rollouts a step do not split over {processes} processes")
        kwargs["per_device_train_batch_size"] //= processes
        trainer = GRPOTrainer(
            model=model, reward_funcs=task_reward(task), args=GRPOConfig(**kwargs),
            train_dataset=task_dataset(task), processing_class=tokenizer,
        )
        # the one line a TRL script adds:
        SpectraCallback(run_dir, every=args.every, task=cfg.task.name).attach(trainer)
        trainer.train()


def probe_overhead(run_dir: Path) -> str:
    timings = pd.read_csv(run_dir / "timings.csv").iloc[1:]  # step 0 warms up
    # a probe step is one that wrote spectra; plain steps still record a tiny time_probes
    # (the grad_sum observer), so time_probes > 0 cannot tell them apart
    probe_steps = set(pd.read_csv(run_dir / "ranks.csv", usecols=["step"])["step"])
    is_probe = timings.step.isin(probe_steps)
    probed, plain = timings[is_probe], timings[~is_probe]
    if probed.empty or plain.empty:
        return f"{run_dir.name}: too few steps to compare probe and plain steps"
    probe_step, plain_step = statistics.median(probed.time_step), statistics.median(plain.time_step)
    return (
        f"{run_dir.name}: median step {plain_step:.3f} s without probes, {probe_step:.3f} s on probe "
        f"steps (probes {statistics.median(probed.time_probes):.3f} s, "
        f"+{100 * (probe_step / plain_step - 1):.0f}%; {len(probed)} probe / {len(plain)} plain steps)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--group-sizes", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--every", type=int, default=5, help="probe every N steps")
    parser.add_argument("--loss-type", default="dapo", help="TRL loss_type (its default: dapo)")
    parser.add_argument("--out", type=Path, default=Path("results/trl_example"))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("overrides", nargs="*", help="grpo-cli config overrides (e.g. cache_dir=...)")
    args = parser.parse_args()
    # transformers 5 renamed gradient_checkpointing, which TRL's GRPOConfig still sets
    warnings.filterwarnings("ignore", category=FutureWarning, message=".*gradient_checkpointing.*")

    from grpo_cli.analysis import analyze
    from grpo_cli.config.compose import compose_config
    from grpo_cli.models.policy import load_policy
    from grpo_cli.tasks import build_task

    cfg = compose_config(["experiment=cpu_rank_collapse", f"seed={args.seed}", *args.overrides])
    torch.set_num_threads(cfg.threads or torch.get_num_threads())
    task = build_task(cfg.task)
    loaded = load_policy(cfg, task, torch.device("cpu"))  # warm-started once, then cached
    task.tokenizer = loaded.tokenizer
    run_dirs = []
    for group_size in args.group_sizes:
        cfg.rollout.group_size = group_size
        run_dirs.append(args.out / f"R{group_size}-grpo-s{args.seed}")
        print(f"TRL GRPOTrainer, R={group_size}: {args.steps} steps -> {run_dirs[-1]}")
        train_one(cfg, task, loaded.source_path, run_dirs[-1], args)
    if os.environ.get("RANK", "0") != "0":  # the main process wrote the runs
        return
    result = analyze([args.out])
    print(f"analysis: {result.out_dir} (summary.md, report.html)")
    for run_dir in run_dirs:
        print(probe_overhead(run_dir))


if __name__ == "__main__":
    main()
