"""One probe step, configuration by configuration, interleaved on the same batch: where fusing
the probes into the training pass moves time (docs/speed.md, "Probes against a faster step").

    python scripts/bench_probe_step.py [--repeats 8]

All configurations live in one process (the CPU preset's model, R = 8) and take turns step by
step, so a change of the machine's load hits them alike. Each repetition runs `trainer.step(0)`
(the same rollouts every time; the weights move on) and, on probe configurations, the probes'
`record`. Prints the median forward, backward, probes-phase, rollout and total seconds.
"""

from __future__ import annotations

import argparse
import os
import statistics

CONFIGS = {  # name -> (overrides, probed)
    "shared prompts, no probe": (["train.shared_prompt_forward=true"], False),
    "shared prompts, separate pass": (["train.shared_prompt_forward=true", "probes.fused_gram=never"], True),
    "shared prompts, fused (always)": (["train.shared_prompt_forward=true", "probes.fused_gram=always"], True),
    "plain, no probe": (["train.shared_prompt_forward=false"], False),
    "plain, separate pass": (["train.shared_prompt_forward=false", "probes.fused_gram=never"], True),
    "plain, fused (auto)": (["train.shared_prompt_forward=false", "probes.fused_gram=auto"], True),
}
PHASES = ("forward", "backward", "probes", "rollout", "total")


def main() -> None:
    from grpo_cli.bench.builder import build_setup
    from grpo_cli.config.compose import compose_config

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=8)
    args, overrides = parser.parse_known_args()
    base = ["experiment=cpu_rank_collapse", "progress=false", "eval.every=0",
            "rollout.group_size=8", "threads=1", "probes.every=1", *overrides]
    setups = {name: build_setup(compose_config(base + extra), log=lambda *a: None)
              for name, (extra, _) in CONFIGS.items()}
    times = {name: {phase: [] for phase in PHASES} for name in CONFIGS}
    for _ in range(args.repeats):
        for name, (_, probed) in CONFIGS.items():
            setup = setups[name]
            timer = setup.trainer.timer
            timer.clear()
            capture = setup.probes.step_capture(0, setup.model, timer) if probed else None
            output = setup.trainer.step(0, capture=capture)
            if probed:
                with timer.phase("probes"):
                    setup.probes.record(0, output, setup.model)
            seconds = timer.take()
            seconds["total"] = sum(seconds.values())
            for phase in PHASES:
                times[name][phase].append(seconds.get(phase, 0.0))
    print(f"load average {os.getloadavg()[0]:.1f}; medians of {args.repeats} repetitions, seconds")
    for name, by_phase in times.items():
        cells = " ".join(f"{phase} {statistics.median(values):.3f}" for phase, values in by_phase.items())
        print(f"  {name:32s} {cells}")


if __name__ == "__main__":
    main()
