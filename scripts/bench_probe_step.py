"""One probe step, configuration by configuration, interleaved on the same batch: where fusing
the probes into the training pass moves time (docs/speed_log.md, "Probes against a faster step").

    python scripts/bench_probe_step.py [--repeats 8] [--after-steps 40] [--only "shared prompts"]
    python scripts/bench_probe_step.py --experiment cpu_smollm2_learn --group-size 4 --repeats 3 \
        --only "shared prompts|live rows" task.reward=random rollout.prompts_per_step=8

All configurations live in one process (the CPU preset's model, R = 8, unless `--experiment` and
`--group-size` say otherwise) and take turns step by
step, so a change of the machine's load hits them alike. Each repetition runs `trainer.step(S)`
(the same prompts and seed every time; the weights move on) and, on probe configurations, the
probes' `record`; S = 0 unless `--after-steps S` first trains every configuration S steps without
probes (a later, more collapsed policy: more repeated completions). Prints the median forward,
backward, probes-phase, rollout and total seconds, and for each probed configuration its
schedule overhead: what a probe adds (the probes phase plus its forward and backward over the
same training forward's probe-free ones; the rollout is left out, its time moves with the load)
over `--every` (the preset's 5) probe-free steps.
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
    # train.backward_live_rows: idle rows without backward; `auto` fuses over the live rows
    "live rows, no probe": (["train.shared_prompt_forward=true", "train.backward_live_rows=true"], False),
    "live rows, fused (auto)": (["train.shared_prompt_forward=true", "train.backward_live_rows=true",
                                 "probes.fused_gram=auto"], True),
}
PHASES = ("forward", "backward", "probes", "rollout", "total")


def main() -> None:
    from grpo_cli.bench.builder import build_setup
    from grpo_cli.config.compose import compose_config
    from grpo_cli.probes.capture import step_capture

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=8)
    parser.add_argument("--after-steps", type=int, default=0, help="train this many steps first")
    parser.add_argument("--only", default="", help="configurations whose name contains one of these ('|'-separated)")
    parser.add_argument("--experiment", default="cpu_rank_collapse")
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--every", type=int, default=5, help="probe schedule for the overhead")
    args, overrides = parser.parse_known_args()
    wanted = args.only.split("|")
    configs = {name: spec for name, spec in CONFIGS.items() if any(part in name for part in wanted)}
    base = [f"experiment={args.experiment}", "progress=false", "eval.every=0",
            f"rollout.group_size={args.group_size}", "threads=1", "probes.every=1", *overrides]
    setups = {name: build_setup(compose_config(base + extra), log=lambda *a: None)
              for name, (extra, _) in configs.items()}
    step = args.after_steps
    for setup in setups.values():
        for earlier in range(step):  # grad_sum's running sum, as grpo run keeps it
            setup.trainer.step(earlier, capture=setup.probes and step_capture(
                setup.probes, earlier, setup.model, probe=False))
    times = {name: {phase: [] for phase in PHASES} for name in configs}
    for _ in range(args.repeats):
        for name, (_, probed) in configs.items():
            setup = setups[name]
            timer = setup.trainer.timer
            timer.clear()
            capture = setup.probes and step_capture(setup.probes, step, setup.model, timer, probe=probed)
            output = setup.trainer.step(step, capture=capture)
            if probed:
                with timer.phase("probes"):
                    setup.probes.record(step, output, setup.model)
            seconds = timer.take()
            seconds["total"] = sum(seconds.values())
            for phase in PHASES:
                times[name][phase].append(seconds.get(phase, 0.0))
    print(f"load average {os.getloadavg()[0]:.1f}; step {step}; medians of {args.repeats} "
          "repetitions, seconds")
    median = {name: {phase: statistics.median(values) for phase, values in by_phase.items()}
              for name, by_phase in times.items()}
    for name, by_phase in median.items():
        cells = " ".join(f"{phase} {seconds:.3f}" for phase, seconds in by_phase.items())
        print(f"  {name:32s} {cells}")
    for name, (_, probed) in configs.items():
        plain = name.split(",")[0] + ", no probe"
        if probed and plain in median:
            probe, free = median[name], median[plain]
            added = probe["probes"] + sum(probe[p] - free[p] for p in ("forward", "backward"))
            print(f"  overhead at every={args.every}, {name}: {100 * added / (args.every * free['total']):.1f}%"
                  f" (probes phase alone: {100 * probe['probes'] / (args.every * free['total']):.1f}%)")


if __name__ == "__main__":
    main()
