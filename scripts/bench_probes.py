"""Probe overhead: the same GRPO steps (same seed) without probes, with fused probes, with a
separate probe pass.

    python scripts/bench_probes.py [--steps 20] [--group-size 8] [OVERRIDES...]
    python scripts/bench_probes.py --experiment cpu_smollm2_learn --steps 4 --group-size 4 \
        --modes off,separate rollout.prompts_per_step=8 probes.every=1   # SmolLM2, whole model

Each mode runs in its own process (so peak RSS is per mode) on an experiment's model and
schedule (`--experiment`, default the CPU preset `cpu_rank_collapse`; probes every
`probes.every` steps), through the training loop `grpo run` uses; `--modes` picks the modes. Modes: `off` (probes.every=0), `fused` (probes.fused_gram=always:
per-rollout factors from the training step's own forward and backward, grpo_cli/probes/fused.py,
each row's prompt run by the training forward on probe steps) and `separate`
(probes.fused_gram=never: a separate forward and backward over every rollout; what the preset's
`auto` does, since it shares prompts).

A fused probe step also changes the step outside the `probes` phase (hooks on the training
forward and backward, each row's own prompt forward), so the overhead is paired by step: the
extra `time_step` of each step over the same step without probes, summed, over the total step
time without probes (step 0 left out: it warms caches). Steps between probes count too: the
`grad_sum` matrix adds every step's gradient (a `probes` phase on every step). Less noisy on a
shared machine: the `probes` phase alone, and that plus the probed steps' extra forward and
backward time (what a fused probe adds to training's own phases). Per probed step it also prints
the probe step's overhead over the same step without probes (issue 23's measure: extra step
time / probe-free step time, median over the probed steps).
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys

MODES = {"off": ["probes.every=0"], "fused": ["probes.fused_gram=always"],
         "separate": ["probes.fused_gram=never"]}


def run_mode(mode: str, steps: int, experiment: str, overrides: list[str]) -> dict:
    from grpo_cli.bench.builder import build_setup
    from grpo_cli.config.compose import compose_config
    from grpo_cli.train.loop import TrainingLoop

    cfg = compose_config([f"experiment={experiment}", "progress=false", "eval.every=0",
                          *overrides, *MODES[mode]])
    loop = TrainingLoop(cfg, build_setup(cfg, log=lambda *args: None))
    step_times, probe_times, train_times, probed, zero_variance = [], [], [], [], []
    for step in range(steps):
        out = loop.run_step(step)
        step_times.append(out.timings["time_step"])  # the phases of timings.csv
        probe_times.append(out.timings["time_probes"])
        train_times.append(out.timings["time_forward"] + out.timings["time_backward"])
        probed.append(out.probe_rows is not None)
        zero_variance.append(out.output.metrics["zero_variance_frac"])
    return {
        "zero_variance": zero_variance,
        "step_times": step_times,
        "probe_times": probe_times,
        "train_times": train_times,
        "probed": probed,
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--experiment", default="cpu_rank_collapse", help="the preset to run")
    parser.add_argument("--modes", default=",".join(MODES), help="off is always run")
    parser.add_argument("--mode", choices=list(MODES), help=argparse.SUPPRESS)
    args, overrides = parser.parse_known_args()
    overrides = [f"rollout.group_size={args.group_size}", "threads=1", *overrides]
    if args.mode:
        print(json.dumps(run_mode(args.mode, args.steps, args.experiment, overrides)))
        return
    modes = ["off"] + [m for m in args.modes.split(",") if m in MODES and m != "off"]
    results = {}
    for mode in modes:
        command = [sys.executable, __file__, "--mode", mode, "--steps", str(args.steps),
                   "--group-size", str(args.group_size), "--experiment", args.experiment,
                   *overrides[1:]]
        output = subprocess.run(command, check=True, capture_output=True, text=True).stdout
        results[mode] = json.loads(output.strip().splitlines()[-1])
    off = results["off"]["step_times"][1:]  # step 0 warms caches
    total_off = sum(off)
    print(f"experiment={args.experiment} R={args.group_size}, {args.steps} steps, probes at the "
          f"preset's schedule; overrides {' '.join(overrides[1:])}")
    print(f"  step without probes (median)  {statistics.median(off):.3f} s")
    for mode in modes[1:]:
        on = results[mode]
        probed = [s for s in range(1, args.steps) if on["probed"][s]]
        extra = [on["step_times"][s] - results["off"]["step_times"][s] for s in range(1, args.steps)]
        ratio = [extra[s - 1] / results["off"]["step_times"][s] for s in probed]
        shares = ", ".join(f"{on['zero_variance'][s]:.2f}" for s in probed)
        print(f"  {mode}: probe step overhead over the same step without probes "
              f"{100 * statistics.median(ratio):.0f} % (median of {len(ratio)}; each "
              f"{', '.join(f'{100 * r:.0f}' for r in ratio)} %; zero-variance groups "
              f"{shares})")
        phase = [on["probe_times"][s] for s in range(1, args.steps)]
        print(f"  {mode}: {len(probed)} probed steps; per probed step: extra step time "
              f"{statistics.median(extra[s - 1] for s in probed):.3f} s (median), probes phase "
              f"{statistics.median(phase[s - 1] for s in probed):.3f} s; other steps' probes phase "
              f"{sum(phase) - sum(phase[s - 1] for s in probed):.3f} s in all")
        train = [on["train_times"][s] - results["off"]["train_times"][s] for s in probed]
        print(f"  {mode}: overhead of the schedule {100 * sum(extra) / total_off:.1f} % "
              f"(probes phase alone {100 * sum(phase) / total_off:.1f} %, probes phase + the "
              f"probed steps' extra forward and backward {100 * (sum(phase) + sum(train)) / total_off:.1f} %); "
              f"peak RSS {on['peak_rss_mb']:.0f} MB (off {results['off']['peak_rss_mb']:.0f} MB)")


if __name__ == "__main__":
    main()
