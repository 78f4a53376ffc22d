"""`grpo`: run GRPO experiments, print configs, analyse results, benchmark steps.

Commands stay thin: they forward to one function each, and heavy imports (torch, transformers,
vLLM) happen inside the commands, never at import time.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Annotated

import typer

from grpo_cli.analysis import rules as verdict_rules  # thresholds only: plain Python, cheap
from grpo_cli.config.errors import debug

app = typer.Typer(
    help="Test the rank-collapse claim about GRPO: train, probe gradient spectra, analyse.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

# load.py's problem lines that `grpo analyze` prints as warnings (file, what, what was left out)
DATA_PROBLEM_WORDS = ("torn", "not a number", "non-numeric", "unreadable", "lacks columns", "singular values",
                      "values empty")
HYDRA_ARGS = {"allow_extra_args": True, "ignore_unknown_options": True, "help_option_names": []}


@app.callback()
def working_directory_exists() -> None:
    """Every command reads paths relative to the working directory (Hydra records it too)."""
    try:
        os.getcwd()
    except FileNotFoundError:
        typer.secho("error: the working directory no longer exists (deleted?); cd into an existing "
                    "directory and run the command again", fg=typer.colors.RED, err=True)
        raise typer.Exit(code=1) from None


RUN_USAGE = """Usage: grpo run [-m] [OVERRIDE ...]

Train one run (or, with -m, a sweep) from Hydra overrides; results go to
results/<experiment>/<run>/ and the last line printed names the directory.

Examples:
  grpo run experiment=smoke                                  # < 1 min, every results file
  grpo run experiment=cpu_rank_collapse rollout.group_size=8 seed=1
  grpo run -m experiment=cpu_rank_collapse rollout.group_size=2,4,8,16 seed=0,1
  grpo run -m experiment=smoke rollout.group_size=2,4 hydra/launcher=local_parallel
  grpo run -m experiment=paper_gsm8k rollout.group_size=2,4,8 hydra/launcher=slurm

Config groups (conf/):
{groups}

Every key and value is checked before any model is built: `grpo config OVERRIDES` prints the
composed config, or the one-line error naming the bad key.

Re-running a command resumes each run from its last checkpoint; completed runs are skipped;
resume=false starts over. A directory held by a live run is refused. SIGTERM or Ctrl-C finishes
the step, saves a checkpoint and leaves run.json `interrupted` (resumable); a second one stops at once. GRPO_DEBUG=1 shows tracebacks for refused settings.

Hydra's own flags: grpo run --hydra-help (--cfg job, --info, -m, --multirun, ...).
"""


def config_groups() -> str:
    from grpo_cli.hydra_app import conf_dir

    groups = sorted(p for p in conf_dir().iterdir() if p.is_dir() and p.name != "hydra")
    return "\n".join(
        f"  {group.name}=" + "|".join(sorted(f.stem for f in group.glob("*.yaml"))) for group in groups
    )


@app.command(context_settings=HYDRA_ARGS)
def run(ctx: typer.Context) -> None:
    """Train one run, or a sweep with -m, from Hydra overrides (`grpo run --help` for examples).

    Arguments go to Hydra unchanged (sweeps, launcher plugins, --cfg job); re-running a command
    resumes its run directories from their checkpoints.
    """
    if {"--help", "-h"} & set(ctx.args):
        typer.echo(RUN_USAGE.format(groups=config_groups()))
        return
    from grpo_cli.config.compose import check_group_options
    from grpo_cli.config.errors import ConfigError
    from grpo_cli.hydra_app import SweepSummary, check_composes, main, refusal_line

    try:
        check_group_options(list(ctx.args))  # also for a sweep, which Hydra composes itself
        check_composes(list(ctx.args))
    except ConfigError as error:
        if debug():
            raise
        typer.echo(refusal_line(error), err=True)
        raise typer.Exit(code=2) from None
    sys.argv = ["grpo run", *ctx.args]
    SweepSummary.failed, SweepSummary.refused, SweepSummary.composed = [], [], False
    try:
        main()
    except KeyboardInterrupt as interrupt:  # SIGINT or SIGTERM: run.json says interrupted
        signal_name = getattr(interrupt, "signal_name", "SIGINT")
        raise typer.Exit(code=143 if signal_name == "SIGTERM" else 130) from None
    except SystemExit as exit_:  # Hydra exits 1 on a config it cannot compose: a config error
        if exit_.code == 1 and not SweepSummary.composed:
            raise typer.Exit(code=2) from None
        raise
    if SweepSummary.failed or SweepSummary.refused:
        raise typer.Exit(code=1)


@app.command("config", context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def config(
    ctx: typer.Context,
    resolve: Annotated[bool, typer.Option(help="Resolve interpolations.")] = True,
) -> None:
    """Print the composed config for the given overrides (e.g. `grpo config experiment=smoke`)."""
    from grpo_cli.config.compose import compose_config, to_yaml
    from grpo_cli.config.errors import ConfigError
    from grpo_cli.hydra_app import composition_error_line
    from grpo_cli.validate import validate_config

    try:
        cfg = compose_config(list(ctx.args))
        validate_config(cfg)
    except Exception as error:  # compose and value errors name the bad key; show just that
        if debug():
            raise
        text = str(error) if isinstance(error, ConfigError) else composition_error_line(error)
        for line in text.splitlines():
            typer.secho(f"config error: {line}", fg=typer.colors.RED, err=True)
        raise typer.Exit(code=2) from None
    typer.echo(to_yaml(cfg, resolve=resolve))


@app.command()
def analyze(
    paths: Annotated[list[Path], typer.Argument(help="Run or sweep directories.", exists=True)],
    out: Annotated[Path | None, typer.Option(help="Output directory (default <first>/analysis).")] = None,
    measure: Annotated[str, typer.Option(help="Rank measure to plot, or 'all'.")] = "all",
    align: Annotated[str, typer.Option(help="x-axis: step | reward | accuracy.")] = "step",
    tolerance: Annotated[float, typer.Option(help="Claim 2c: |rank - 2| allowed at each judged R.")] = verdict_rules.RANK_BAND,
    trend: Annotated[float, typer.Option(help="Claim 2b: |slope| of rank vs log2 R allowed.")] = verdict_rules.GROWTH_TOLERANCE,
    last_fraction: Annotated[float, typer.Option(help="Part of training averaged for summaries.")] = verdict_rules.LAST_FRACTION,
    confidence: Annotated[float, typer.Option(help="Two-sided level of every interval; claim 3 tests at (1 - confidence) / 2.")] = verdict_rules.CONFIDENCE,
    write_docs: Annotated[str | None, typer.Option(
        "--write-docs", help="Rewrite the block <!-- generated:claims:TAG --> ... "
        "<!-- /generated:claims:TAG --> of --docs-page from these results.")] = None,
    docs_page: Annotated[Path, typer.Option(help="The page --write-docs rewrites.")] = Path("docs/interpreting.md"),
    follows_r: Annotated[list[str] | None, typer.Option(
        "--follows-r", help="A config key that changes with R by design (e.g. "
        "rollout.prompts_per_step for a fixed number of rollouts per step): part of the R axis, "
        "not a variant. Repeatable.")] = None,
    same_weights: Annotated[bool, typer.Option(
        "--same-weights", help="Read `grpo probe` trees over checkpoints instead (claims 2 and 4 "
        "per checkpoint, units prompt groups, and over independently trained checkpoints; the "
        "claim map): same_weights.md and its CSVs.")] = False,
) -> None:
    """Turn results into plots, summary.csv/summary.md and a self-contained report.html."""
    if same_weights:
        _analyze_same_weights(paths, out, tolerance, trend, confidence, write_docs, docs_page)
        return
    from grpo_cli.analysis import analyze as run_analysis
    from grpo_cli.analysis.docs_blocks import DocsBlockError
    from grpo_cli.analysis.docs_blocks import write_docs as write_docs_block
    from grpo_cli.analysis.grouping import GroupingError
    from grpo_cli.analysis.load import NoRunsFound
    from grpo_cli.analysis.pipeline import NoUsableRuns

    try:
        result = run_analysis(
            list(paths),
            out=out,
            measure=measure,
            align=align,
            tolerance=tolerance,
            trend_threshold=trend,
            last_fraction=last_fraction,
            confidence=confidence,
            follows_r=follows_r or (),
        )
        if write_docs:
            source = " ".join(str(p) for p in paths)
            typer.echo(f"rewrote {write_docs_block(result, docs_page, write_docs, source)} "
                       f"(block {write_docs})")
    except (NoUsableRuns, NoRunsFound) as error:
        typer.secho(f"nothing analysed: {error}", fg=typer.colors.RED, err=True)
        raise typer.Exit(code=1) from None
    except (GroupingError, DocsBlockError, ValueError) as error:  # bad options or markers
        typer.secho(f"error: {error}", fg=typer.colors.RED, err=True)
        raise typer.Exit(code=2) from None
    except KeyboardInterrupt:  # the outputs are built beside the target: none was half written
        typer.secho("interrupted: no output written", fg=typer.colors.RED, err=True)
        raise typer.Exit(code=130) from None
    _warn_run_problems(result.runs)
    typer.echo(f"wrote {result.out_dir}")


def _warn_run_problems(runs: list) -> None:
    """One stderr line per data problem the loader found: contradictions left the run out."""
    for run in runs:
        for problem in run.contradictions:
            typer.secho(f"data problem: {run.name}: {problem} (run left out)", fg=typer.colors.YELLOW, err=True)
        for problem in run.problems:
            if problem not in run.contradictions and any(word in problem for word in DATA_PROBLEM_WORDS):
                typer.secho(f"warning: {run.name}: {problem}", fg=typer.colors.YELLOW, err=True)


@app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def probe(
    ctx: typer.Context,
    checkpoint: Annotated[Path, typer.Argument(
        help="A run directory (its latest checkpoint), a checkpoint file, or an HF model directory.")],
    group_sizes: Annotated[str, typer.Option(help="Group sizes R, comma-separated.")] = "2,4,8,16",
    prompts: Annotated[int | None, typer.Option(help="Prompts per R (default: the config's rollout.prompts_per_step).")] = None,
    seed: Annotated[int | None, typer.Option(help="Sampling seed (default: the config's).")] = None,
    out: Annotated[Path | None, typer.Option(help="Output directory (default <results_dir>/probe/<name>).")] = None,
    all_checkpoints: Annotated[bool, typer.Option(
        "--all-checkpoints", help="Probe every checkpoint a run kept (keep_checkpoints=true).")] = False,
) -> None:
    """Probe one set of weights at every R: same weights, same prompts, no optimizer step.

    Writes one results directory per R (<out>/R<R>, the files of `grpo run`) for `grpo analyze`.
    Extra arguments are config overrides: key=value on a run, any Hydra override on a model
    directory (e.g. experiment=cpu_smollm2 task=gsm8k).
    """
    from grpo_cli.config.errors import ConfigError, InputError
    from grpo_cli.train.probe_checkpoint import (
        ProbeTargetError,
        parse_group_sizes,
        probe_checkpoint,
    )
    from grpo_cli.validate import validate_config

    try:
        probe_checkpoint(checkpoint, parse_group_sizes(group_sizes), prompts=prompts, seed=seed,
                         out=out, all_checkpoints=all_checkpoints, overrides=list(ctx.args),
                         check=validate_config, log=typer.echo)
    except (ProbeTargetError, ConfigError) as error:
        if debug():
            raise
        typer.secho(f"probe error: {error}", fg=typer.colors.RED, err=True)
        raise typer.Exit(code=2) from None
    except InputError as error:  # unusable data: a model directory, a checkpoint refused as unsafe
        if debug():
            raise
        typer.secho(f"probe error: {error}", fg=typer.colors.RED, err=True)
        raise typer.Exit(code=1) from None


@app.command()
def trajectory(
    runs: Annotated[list[Path], typer.Argument(help="Run directories that kept checkpoints (keep_checkpoints=true).")],
    layer_regex: Annotated[str | None, typer.Option(
        help="2-D weights to read (default: every block's projections and lm_head).")] = None,
) -> None:
    """The update W_t - W_0 over each run's kept checkpoints: per layer its rank-1 share and the
    path's rank-1 share and linearity (AlphaRL, RELEX), written to RUN/trajectory.csv."""
    from grpo_cli.config.errors import ConfigError, InputError
    from grpo_cli.train.trajectory_run import DEFAULT_LAYER_REGEX, write_trajectory

    for run_dir in runs:
        try:
            typer.echo(f"wrote {write_trajectory(run_dir, layer_regex or DEFAULT_LAYER_REGEX, log=typer.echo)}")
        except (ConfigError, InputError) as error:
            if debug():
                raise
            typer.secho(f"trajectory error: {error}", fg=typer.colors.RED, err=True)
            raise typer.Exit(code=2 if isinstance(error, ConfigError) else 1) from None


def _analyze_same_weights(paths: list[Path], out: Path | None, tolerance: float, trend: float,
                          confidence: float, write_docs: str | None, docs_page: Path) -> None:
    """`grpo analyze --same-weights` (analysis/same_weights_report.py)."""
    from grpo_cli.analysis.docs_blocks import DocsBlockError
    from grpo_cli.analysis.load import NoRunsFound
    from grpo_cli.analysis.pipeline import NoUsableRuns
    from grpo_cli.analysis.rules import Rules
    from grpo_cli.analysis.same_weights_report import analyze_same_weights

    rules = Rules(band=tolerance, growth_tolerance=trend, confidence=confidence)
    try:
        out_dir, _ = analyze_same_weights(list(paths), out, rules,
                                          (docs_page, write_docs) if write_docs else None)
    except (NoUsableRuns, NoRunsFound) as error:
        typer.secho(f"nothing analysed: {error}", fg=typer.colors.RED, err=True)
        raise typer.Exit(code=1) from None
    except (DocsBlockError, ValueError) as error:
        typer.secho(f"error: {error}", fg=typer.colors.RED, err=True)
        raise typer.Exit(code=2) from None
    except KeyboardInterrupt:
        typer.secho("interrupted: no output written", fg=typer.colors.RED, err=True)
        raise typer.Exit(code=130) from None
    if write_docs:
        typer.echo(f"rewrote {docs_page} (block {write_docs})")
    typer.echo(f"wrote {out_dir}")


@app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def bench(
    ctx: typer.Context,
    steps: Annotated[int, typer.Option(help="Timed steps (after one warm-up step).", min=1)] = 5,
    vs_trl: Annotated[bool, typer.Option("--vs-trl", help="Alternate with TRL's GRPOTrainer.")] = False,
) -> None:
    """Time GRPO steps on a fixed model and batch; split by phase; optionally against TRL.

    Extra arguments are bench flags or Hydra overrides: --model-size tiny|5m|25m|smollm2,
    --shared-prompt-forward (train.shared_prompt_forward), --autocast bf16 (model.autocast),
    --compile-decode (rollout.compile_decode), --out CSV, --trl-bf16,
    --trl-gradient-checkpointing. The phases are those of timings.csv, from the loop `grpo run`
    uses. docs/speed.md has the measured ratios.
    """
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    from grpo_cli.bench.step_bench import prepare_bench, run_prepared
    from grpo_cli.hydra_app import composition_error_line
    from grpo_cli.validate import validate_bench_config

    try:
        options, cfg = prepare_bench(list(ctx.args), vs_trl=vs_trl)
        validate_bench_config(cfg)  # ConfigError (a ValueError): one line per problem
    except (ValueError, HydraException, OmegaConfBaseException) as error:  # a flag or an override
        if debug():
            raise
        hydra_words = isinstance(error, (HydraException, OmegaConfBaseException))
        text = composition_error_line(error) if hydra_words else str(error)
        for line in text.splitlines():
            typer.secho(f"config error: {line}", fg=typer.colors.RED, err=True)
        raise typer.Exit(code=2) from None
    run_prepared(options, cfg, steps=steps, vs_trl=vs_trl)


if __name__ == "__main__":  # pragma: no cover
    app()
