"""Run the step-time benchmark matrix (grpo-cli variants, each alternated with TRL) and tabulate it.

Every configuration is one `grpo bench --vs-trl` (or plain `grpo bench`) subprocess appending its
per-step rows to one CSV; the summary reads the CSV only, so re-running on an idle machine and
re-tabulating are separate steps:

    python scripts/bench_step.py --out results/bench/steps.csv            # run + table
    python scripts/bench_step.py --out results/bench/steps.csv --table    # table only
    python scripts/bench_step.py --sizes 25m --variants fast --steps 8    # a subset

Variants (grpo-cli side; TRL is always its vanilla fp32 GRPOTrainer unless the name says bf16):
baseline (hf generate, plain forward), static (rollout.backend=hf_static), compiled (+ compiled
decode step), shared (training forward with shared prompts), fast (static + shared), fast_bf16
(fast under bf16 autocast), fast_compiled (fast + compiled decode step), ..._vs_trl_bf16 (both
sides bf16).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys

VARIANTS: dict[str, list[str]] = {
    "baseline": [],
    "static": ["rollout.backend=hf_static"],
    "compiled": ["rollout.backend=hf_static", "--compile-decode"],
    "shared": ["--shared-prompt-forward"],
    "fast": ["rollout.backend=hf_static", "--shared-prompt-forward"],
    "fast_compiled": ["rollout.backend=hf_static", "--compile-decode", "--shared-prompt-forward"],
    "fast_bf16": ["rollout.backend=hf_static", "--shared-prompt-forward", "--autocast", "bf16"],
    "fast_bf16_vs_trl_bf16": [
        "rollout.backend=hf_static", "--shared-prompt-forward", "--autocast", "bf16", "--trl-bf16",
    ],
    "fast_compiled_bf16": [
        "rollout.backend=hf_static", "--compile-decode", "--shared-prompt-forward", "--autocast", "bf16",
    ],
    "fast_compiled_bf16_vs_trl_bf16": [
        "rollout.backend=hf_static", "--compile-decode", "--shared-prompt-forward", "--autocast", "bf16",
        "--trl-bf16",
    ],
}
DEFAULT_VARIANTS = ["baseline", "fast", "fast_compiled", "fast_compiled_bf16"]


def run_variant(size: str, variant: str, steps: int, out: str, vs_trl: bool, extra: list[str]) -> int:
    command = [sys.executable, "-m", "grpo_cli.cli", "bench", "--steps", str(steps)]
    command += ["--vs-trl"] if vs_trl else []
    command += ["--model-size", size, "--out", out, *VARIANTS[variant], *extra]
    print("$", " ".join(command[1:]), flush=True)
    return subprocess.call(command)


def table(path: str) -> str:
    import pandas as pd

    frame = pd.read_csv(path)
    frame["trl"] = frame["trl"].fillna("-") if "trl" in frame else "-"
    rows = []
    for (size, label, trl_setting), part in frame.groupby(["model_size", "label", "trl"], sort=False):
        grpo, trl = part[part["side"] == "grpo-cli"], part[part["side"] == "trl"]
        row = {
            "model": size,
            "grpo-cli config": label,
            "TRL": trl_setting,
            "grpo-cli step s": grpo["step_s"].median(),
            "grpo-cli tok/s": grpo["tokens_per_s"].median(),
        }
        if len(trl):
            row.update({
                "TRL step s": trl["step_s"].median(),
                "TRL tok/s": trl["tokens_per_s"].median(),
                "ratio (median of pairs)": grpo["ratio"].median(),
                "CPU-time ratio": grpo["cpu_ratio"].median(),
            })
        row["load"] = part["load_start"].iloc[0]
        rows.append(row)
    summary = pd.DataFrame(rows)
    try:
        return summary.to_markdown(index=False, floatfmt=".3f")
    except ImportError:  # tabulate not installed
        return summary.to_string(index=False, float_format=lambda value: f"{value:.3f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--out", default="results/bench/steps.csv")
    parser.add_argument("--sizes", nargs="+", default=["tiny", "25m"])
    parser.add_argument("--variants", nargs="+", default=DEFAULT_VARIANTS, choices=sorted(VARIANTS))
    parser.add_argument("--steps", type=int, default=6, help="timed pairs per configuration")
    parser.add_argument("--no-trl", action="store_true", help="grpo-cli only (no TRL pairs)")
    parser.add_argument("--table", action="store_true", help="only tabulate an existing CSV")
    parser.add_argument("extra", nargs="*", help="Hydra overrides passed to every run")
    args = parser.parse_args()
    if not args.table:
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        for size in args.sizes:
            for variant in args.variants:
                code = run_variant(size, variant, args.steps, args.out, not args.no_trl, args.extra)
                if code != 0:
                    print(f"{size} {variant}: exit code {code}", file=sys.stderr)
    print(table(args.out))


if __name__ == "__main__":
    main()
