"""Probe overhead: the same GRPO steps (same seed) with the probe suite on and off.

    python scripts/bench_probes.py [--steps 20] [--group-size 8] [OVERRIDES...]

Each mode runs in its own process (so peak RSS is per mode) on the CPU preset's model and
schedule (`experiment=cpu_rank_collapse`, probes every `probes.every` steps), through the
training loop `grpo run` uses; times are its `time_step` and `time_probes` (the probes' gradient
snapshot inside the step included). Reports the median step time without probes, the probe time
per probed step, the overhead of the default schedule (total probe time / total step time
without probes) and the peak memory of each mode.
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys


def run_mode(probes_on: bool, steps: int, overrides: list[str]) -> dict:
    from grpo_cli.bench.builder import build_setup
    from grpo_cli.config.compose import compose_config
    from grpo_cli.train.loop import TrainingLoop

    every = [] if probes_on else ["probes.every=0"]
    cfg = compose_config(["experiment=cpu_rank_collapse", "progress=false", "eval.every=0",
                          *overrides, *every])
    loop = TrainingLoop(cfg, build_setup(cfg, log=lambda *args: None))
    step_times, probe_times = [], []
    for step in range(steps):
        timings = loop.run_step(step).timings  # the phases of timings.csv
        step_times.append(timings["time_step"] - timings["time_probes"])
        if timings["time_probes"] > 0:
            probe_times.append(timings["time_probes"])
    return {
        "step_times": step_times,
        "probe_times": probe_times,
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--mode", choices=["on", "off"], help=argparse.SUPPRESS)
    args, overrides = parser.parse_known_args()
    overrides = [f"rollout.group_size={args.group_size}", "threads=1", *overrides]
    if args.mode:
        print(json.dumps(run_mode(args.mode == "on", args.steps, overrides)))
        return
    results = {}
    for mode in ("off", "on"):
        command = [sys.executable, __file__, "--mode", mode, "--steps", str(args.steps),
                   "--group-size", str(args.group_size), *overrides[1:]]
        output = subprocess.run(command, check=True, capture_output=True, text=True).stdout
        results[mode] = json.loads(output.strip().splitlines()[-1])
    off, on = results["off"], results["on"]
    base = statistics.median(off["step_times"][1:])  # first step warms caches
    total_off = sum(off["step_times"][1:])
    probe_total = sum(on["probe_times"][1:]) if len(on["probe_times"]) > 1 else sum(on["probe_times"])
    probed_steps = max(len(on["probe_times"]) - 1, 1)
    print(f"R={args.group_size}, {args.steps} steps, probes at the preset's schedule")
    print(f"  step without probes (median)  {base:.3f} s")
    print(f"  probe time per probed step    {probe_total / probed_steps:.3f} s "
          f"({len(on['probe_times'])} probed steps)")
    print(f"  overhead of the schedule      {100 * probe_total / total_off:.1f} % "
          f"(total probe time / total step time without probes)")
    print(f"  peak RSS: probes off {off['peak_rss_mb']:.0f} MB, on {on['peak_rss_mb']:.0f} MB")


if __name__ == "__main__":
    main()
