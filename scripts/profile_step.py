"""One `grpo run` step under the profiler: operator tables of where its time goes, per phase.

    python scripts/profile_step.py --out step_profile.txt experiment=cpu_rank_collapse
    python scripts/profile_step.py --warmup 1 --out rehearsal.txt experiment=paper_rehearsal \
        rollout.backend=hf_static device=cuda

Builds the run as `grpo run` does (grpo_cli/bench/builder.py), runs `--warmup` steps (step 0
differs: no AdamW state yet), then one probed step under `torch.profiler`
(grpo_cli/bench/profile.py). Writes the phase seconds of the profiled step (the run's own
PhaseTimer) and the operator tables to `--out`.
"""

from __future__ import annotations

import argparse
import os

os.environ.setdefault("OMP_NUM_THREADS", "1")


def main() -> None:
    from grpo_cli.bench.builder import build_setup
    from grpo_cli.bench.profile import profiled
    from grpo_cli.config.compose import compose_config
    from grpo_cli.probes.capture import step_capture

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--warmup", type=int, default=1, help="steps before the profiled one")
    parser.add_argument("--rows", type=int, default=40, help="operators per table")
    parser.add_argument("--out", required=True, help="text file for the tables")
    args, overrides = parser.parse_known_args()
    cfg = compose_config(["progress=false", "eval.every=0", "probes.every=1", *overrides])
    setup = build_setup(cfg, log=print)
    trainer, probes = setup.trainer, setup.probes

    def step(index: int) -> dict[str, float]:
        trainer.timer.clear()
        capture = probes and step_capture(probes, index, setup.model, trainer.timer, probe=True)
        output = trainer.step(index, capture=capture)
        if probes:
            with trainer.timer.phase("probes"):
                probes.record(index, output, setup.model)
        return trainer.timer.take()

    for index in range(args.warmup):
        print(f"warm-up step {index}: {step(index)}", flush=True)
    seconds = profiled(lambda: step(args.warmup), args.out, f"step {args.warmup}: {' '.join(overrides)}",
                       rows=args.rows)
    line = ", ".join(f"{phase} {value:.3f}" for phase, value in seconds.items())
    print(f"profiled step {args.warmup} (seconds): {line}", flush=True)
    with open(args.out, "a") as handle:
        handle.write(f"phase seconds of the profiled step: {line}\n")


if __name__ == "__main__":
    main()
