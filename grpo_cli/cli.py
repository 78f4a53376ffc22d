"""`grpo`: run GRPO experiments, print configs, analyse results, benchmark steps.

Commands stay thin: they forward to one function each, and heavy imports (torch, transformers,
vLLM) happen inside the commands, never at import time.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer

app = typer.Typer(
    help="Test the rank-collapse claim about GRPO: train, probe gradient spectra, analyse.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

HYDRA_ARGS = {"allow_extra_args": True, "ignore_unknown_options": True, "help_option_names": []}


@app.command(context_settings=HYDRA_ARGS)
def run(ctx: typer.Context) -> None:
    """Train one run, or a sweep with -m, from Hydra overrides.

    Examples: `grpo run experiment=smoke`;
    `grpo run -m experiment=cpu_rank_collapse rollout.group_size=2,4,8 seed=0,1`;
    `grpo run -m hydra/launcher=local_parallel ...` (joblib). Arguments go to Hydra unchanged,
    so `grpo run --help` prints Hydra's help and config groups. Re-running a command resumes its
    run directories from their checkpoints.
    """
    from grpo_cli.hydra_app import SweepSummary, main

    sys.argv = ["grpo run", *ctx.args]
    SweepSummary.failed = []
    main()
    if SweepSummary.failed:
        raise typer.Exit(code=1)


@app.command("config", context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def config(
    ctx: typer.Context,
    resolve: Annotated[bool, typer.Option(help="Resolve interpolations.")] = True,
) -> None:
    """Print the composed config for the given overrides (e.g. `grpo config experiment=smoke`)."""
    from grpo_cli.config.compose import compose_config, to_yaml

    try:
        cfg = compose_config(list(ctx.args))
    except Exception as error:  # compose errors name the bad key; show just that
        detail = f" ({error.__cause__})" if error.__cause__ else ""
        typer.secho(f"config error: {error}{detail}", fg=typer.colors.RED, err=True)
        raise typer.Exit(code=2) from error
    typer.echo(to_yaml(cfg, resolve=resolve))


@app.command()
def analyze(
    paths: Annotated[list[Path], typer.Argument(help="Run or sweep directories.", exists=True)],
    out: Annotated[Path | None, typer.Option(help="Output directory (default <first>/analysis).")] = None,
    measure: Annotated[str, typer.Option(help="Rank measure to plot, or 'all'.")] = "all",
    align: Annotated[str, typer.Option(help="x-axis: step | reward | accuracy.")] = "step",
    tolerance: Annotated[float, typer.Option(help="Verdict: |rank - 2| allowed.")] = 0.5,
    trend: Annotated[float, typer.Option(help="Verdict: max |slope| of rank vs log2 R.")] = 0.25,
    last_fraction: Annotated[float, typer.Option(help="Part of training averaged for summaries.")] = 0.25,
) -> None:
    """Turn results into plots, summary.csv/summary.md and a self-contained report.html."""
    from grpo_cli.analysis import analyze as run_analysis

    result = run_analysis(
        list(paths),
        out=out,
        measure=measure,
        align=align,
        tolerance=tolerance,
        trend_threshold=trend,
        last_fraction=last_fraction,
    )
    typer.echo(f"wrote {result.out_dir}")


@app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def bench(
    ctx: typer.Context,
    steps: Annotated[int, typer.Option(help="Timed steps (after one warm-up step).")] = 5,
    vs_trl: Annotated[bool, typer.Option("--vs-trl", help="Alternate with TRL's GRPOTrainer.")] = False,
) -> None:
    """Time GRPO steps on a fixed model and batch; split by phase; optionally against TRL.

    Extra arguments are bench flags or Hydra overrides: --model-size tiny|5m|25m,
    --shared-prefix (train.shared_prompt_forward), --autocast bf16 (model.autocast),
    --compile-decode (rollout.compile_decode), --out CSV, --trl-bf16,
    --trl-gradient-checkpointing. The phases are those of timings.csv, from the loop `grpo run`
    uses. docs/speed.md has the measured ratios.
    """
    from grpo_cli.bench.step_bench import run_bench

    run_bench(list(ctx.args), steps=steps, vs_trl=vs_trl)


if __name__ == "__main__":  # pragma: no cover
    app()
