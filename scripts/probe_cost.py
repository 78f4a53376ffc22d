"""What the probe steps of finished runs cost, from their timings.csv (issue 23's measure).

    python scripts/probe_cost.py results/cpu_smollm2_learn [more run directories or roots ...]

A probe step is a step that wrote ranks.csv rows; its cost is defined by
`grpo_cli.gpu_report.collect.probe_step_costs` (the time outside the rollout and the held-out
evaluation beyond the run's median probe-free step, over that step). Counting only the `probes`
phase understates fused probe steps. Both are printed, with the share of probe steps within 60%.
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

import pandas as pd

from grpo_cli.gpu_report.collect import probe_step_costs, probe_steps, run_directories


def describe(costs: list[float]) -> str:
    ordered = sorted(costs)
    p90 = ordered[min(len(ordered) - 1, round(0.9 * (len(ordered) - 1)))]
    within = sum(cost <= 0.6 for cost in costs) / len(costs)
    return (f"median {100 * statistics.median(costs):.0f}%, mean {100 * statistics.fmean(costs):.0f}%, "
            f"{100 * within:.0f}% within 60%, p90 {100 * p90:.0f}%, worst {100 * max(costs):.0f}%")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("paths", nargs="+", type=Path, help="run directories or roots holding them")
    args = parser.parse_args()
    whole, phase = [], []
    for run_dir in [run for path in args.paths for run in run_directories(path)]:
        timings = pd.read_csv(run_dir / "timings.csv")
        run_whole, run_phase = probe_step_costs(timings, timings["step"].isin(probe_steps(run_dir)))
        if run_whole:
            print(f"{run_dir}: {len(run_whole)} probe steps, whole step {describe(run_whole)}")
        whole += run_whole
        phase += run_phase
    if not whole:
        raise SystemExit("no run with both probe and probe-free steps under " + ", ".join(map(str, args.paths)))
    print(f"all {len(whole)} probe steps: whole step {describe(whole)}")
    print(f"  probes phase alone: {describe(phase)}")


if __name__ == "__main__":
    main()
