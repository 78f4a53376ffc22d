"""`grpo analyze`: run directories in, summary tables, verdicts, figures and a report out.

Status policy: failed runs are listed (with their error) and left out of every average, table
and figure. Incomplete runs (run.json still says `running`, or is missing) are left out too unless
`include_incomplete=True`, in which case their rows carry n_incomplete > 0 and their verdicts are
marked provisional. If no run has completed yet, incomplete runs are included automatically (with
a note), so a sweep can be watched while it runs.
"""

from __future__ import annotations

import os
import shutil
import signal
import tempfile
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import fields, replace
from pathlib import Path

import pandas as pd

from grpo_cli.analysis import (
    collapse,
    credit_compare,
    matching,
    outliers,
    render,
    report,
    same_checkpoint,
    token_weights,
    units,
    update_density,
    update_geometry,
)
from grpo_cli.analysis import composition as comp
from grpo_cli.analysis import figures as figures_module
from grpo_cli.analysis import rules as rules_module
from grpo_cli.analysis.claims import judge_claims, zero_sum_variants
from grpo_cli.analysis.grouping import Grouping, display_name, group_runs
from grpo_cli.analysis.load import Run, load_runs
from grpo_cli.analysis.parts import Joined
from grpo_cli.analysis.rank_verdict import matched_readings, rank_verdicts
from grpo_cli.analysis.records import AnalysisResult, Readings
from grpo_cli.analysis.rules import Rules
from grpo_cli.analysis.summary import (
    SUMMARY_KEYS,
    accuracy_summary,
    last_part_means,
    rank_summary,
)
from grpo_cli.analysis.tables import (
    ALIGNS,
    group_table,
    measures_present,
    progress_edges,
    rank_table,
    with_x,
)

REHEARSAL_NOTE = (
    "REHEARSAL, NOT SCIENCE: {runs} used random weights and/or coin-flip rewards "
    "(model.weights=random, task.reward=random). They test that the code runs at this size and "
    "how much memory and time it takes; their ranks and verdicts say nothing about GRPO."
)


def _numeric_problems(runs: list[Run]) -> list[str]:
    """Notes for non-numeric cells that load.py found in ranks.csv (left out, never silent)."""
    return [
        f"{run.name}: {problem}" for run in runs for problem in run.problems
        if "not a number" in problem or "non-numeric" in problem
    ]


class NoUsableRuns(ValueError):
    """Nothing to analyse: every run failed, contradicts itself, or has no known group size."""


def _select(runs: list[Run], include_incomplete: bool, notes: list[str]) -> tuple[list[Run], bool]:
    contradicted = [r.name for r in runs if r.contradictions]
    if contradicted:
        notes.append(
            f"left out (files contradict themselves, see Data problems): {', '.join(contradicted)}"
        )
    usable = [r for r in runs if r.status != "failed" and not r.contradictions]
    if not include_incomplete and usable and not any(r.status == "completed" for r in usable):
        include_incomplete = True
        notes.append(
            "no run has completed yet, so incomplete runs are included and every "
            "verdict is provisional"
        )
    analysed = [r for r in usable if include_incomplete or r.status == "completed"]
    unsized = [r.name for r in analysed if r.group_size is None]
    if unsized:
        notes.append(f"left out (group size unknown): {', '.join(unsized)}")
    analysed = [r for r in analysed if r.group_size is not None]
    if not analysed:
        raise NoUsableRuns(f"no run to analyse among {len(runs)}: {_states(runs)}")
    return analysed, include_incomplete


def analyze(
    paths: list[Path],
    out: Path | None = None,
    measure: str = "all",
    align: str = "step",
    tolerance: float = rules_module.RANK_BAND,
    trend_threshold: float = rules_module.GROWTH_TOLERANCE,
    last_fraction: float = rules_module.LAST_FRACTION,
    confidence: float = rules_module.CONFIDENCE,
    steps: list[int] | None = None,
    include_incomplete: bool = False,
    progress_bins: int = 8,
    figures: bool = True,
    follows_r: list[str] | tuple[str, ...] = (),
) -> AnalysisResult:
    """Analyse run or sweep directories; write summary.csv/.md, figures and report.html.

    Output goes to `out`, or `<first path>/analysis/`. `measure` is "all" or one ranks.csv
    measure; `align` ("step" | "reward" | "accuracy") is the x-axis of the rank and dynamics
    figures; matched-progress verdicts use `align`, or the training reward when align="step".
    `follows_r`: config keys that change with R by design (grouping.py), not variants.
    `tolerance` (claim 2's band around 2), `trend_threshold` (its growth tolerance per doubling
    of R), `last_fraction` and `confidence` (every interval's level) set analysis/rules.Rules.
    """
    paths = [Path(p) for p in paths]
    if not paths:
        raise ValueError("give at least one run or sweep directory")
    if align not in ALIGNS:
        raise ValueError(f"align must be one of {', '.join(ALIGNS)}, not {align!r}")
    rules = Rules(band=tolerance, growth_tolerance=trend_threshold,
                  last_fraction=last_fraction, confidence=confidence)
    # load: the run directories, and which of them enter the analysis
    runs = load_runs(paths)
    notes: list[str] = []
    analysed, include_incomplete = _select(runs, include_incomplete, notes)
    rehearsals = _rehearsals(runs, notes)
    # frames: tidy tables of the analysed runs, labelled by variant (group_runs sets run.variant)
    grouping = group_runs(runs, basis=analysed, follows_r=follows_r)
    measures = measures_present(analysed, measure)
    ranks = rank_table(analysed, measures)
    notes += _rank_notes(analysed, ranks)
    experiments = ", ".join(sorted({r.experiment for r in runs}))
    matched_progress = align if align != "step" else "reward"
    readings, comp_table = _judge(analysed, measures, rules, ranks, matched_progress, progress_bins)
    result = AnalysisResult(
        out_dir=Path(out) if out is not None else paths[0] / "analysis",
        runs=runs, analysed=analysed, grouping=grouping, measures=measures, rules=rules,
        accuracy=accuracy_summary(analysed),
        title=("REHEARSAL (not science): " if rehearsals else "") + experiments,
        align=align, matched_progress=matched_progress,
        progress_bins=progress_bins, last_fraction=last_fraction,
        include_incomplete=include_incomplete, notes=notes, **_variant_labels(runs, grouping),
        **{f.name: getattr(readings, f.name) for f in fields(readings)},
    )
    return _stage_outputs(result, ranks, comp_table, steps, figures, below=paths[0])


def _stage_outputs(result: AnalysisResult, ranks: pd.DataFrame, comp_table: pd.DataFrame,
                   steps: list[int] | None, figures: bool, below: Path) -> AnalysisResult:
    """Draw and write everything beside result.out_dir, then rename it in (staged_output);
    returns `result` with the paths its figures and files have once renamed in."""
    with staged_output(result.out_dir, below=below) as stage:
        if figures:
            drawn = figures_module.draw_figures(
                figures_module.figure_inputs(result, ranks, comp_table, steps), stage)
            result = replace(result, figures=drawn)
        files = _write(result, stage)
    return replace(
        result,
        figures={name: result.out_dir / path.name for name, path in result.figures.items()},
        files={name: result.out_dir / path.name for name, path in files.items()},
    )


class UnsafeOutput(ValueError):
    """The output directory, or a folder on the way to it, is a symbolic link."""


def _refuse_links(out: Path, below: Path) -> None:
    """UnsafeOutput naming the first symbolic link among `out` and the folders between `below`
    (the first analysed directory) and it: a link planted there would take every output
    elsewhere."""
    between = out.relative_to(below).parents if out.is_relative_to(below) else []
    for path in [*(below / part for part in reversed(list(between)) if str(part) != "."), out]:
        if path.is_symlink():
            raise UnsafeOutput(f"{path}: a symbolic link; grpo analyze writes its outputs only into "
                               "a real directory (give --out another path)")


@contextmanager
def staged_output(out: Path, below: Path) -> Iterator[Path]:
    """A temporary directory beside `out` (same parent) to build every output in; on success
    each file is renamed into `out`, through a handle opened without following links. A failed
    analysis leaves `out` as it was."""
    out, below = Path(os.path.abspath(out)), Path(os.path.abspath(below))
    _refuse_links(out, below)
    out.parent.mkdir(parents=True, exist_ok=True)
    stage = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        with _interrupts_remembered() as received:
            yield stage
            if received:  # a Ctrl-C whose KeyboardInterrupt Python swallowed (see below)
                raise KeyboardInterrupt
        out.mkdir(exist_ok=True)
        _refuse_links(out, below)  # not swapped for a link meanwhile
        flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW
        source, target = os.open(stage, flags), os.open(out, flags)
        try:
            for name in sorted(os.listdir(source)):
                os.replace(name, name, src_dir_fd=source, dst_dir_fd=target)
        finally:
            os.close(source)
            os.close(target)
    finally:
        shutil.rmtree(stage, ignore_errors=True)


@contextmanager
def _interrupts_remembered() -> Iterator[list[int]]:
    """Ctrl-C while the outputs are built, remembered as well as raised. A KeyboardInterrupt
    that lands in a finalizer or weakref callback (matplotlib drops transforms that way while
    drawing) is printed as "Exception ignored" and lost, and the analysis would then commit as
    if never interrupted; the caller checks the list before renaming anything in. Left alone
    where SIGINT is not Python's default (ignored, or handled by someone else) or off the main
    thread."""
    received: list[int] = []
    if (threading.current_thread() is not threading.main_thread()
            or signal.getsignal(signal.SIGINT) is not signal.default_int_handler):
        yield received
        return

    def handle(signum: int, frame: object) -> None:
        received.append(signum)
        raise KeyboardInterrupt

    signal.signal(signal.SIGINT, handle)
    try:
        yield received
    finally:
        signal.signal(signal.SIGINT, signal.default_int_handler)


def _variant_labels(runs: list[Run], grouping: Grouping) -> dict[str, dict]:
    """AnalysisResult's variant_columns (config key -> display name) and variant_values
    (variant label -> {config key: value})."""
    keys = grouping.variant_keys
    return {"variant_columns": {k: display_name(k) for k in keys},
            "variant_values": {r.variant: {k: r.config.get(k) for k in keys} for r in runs}}


def _rehearsals(runs: list[Run], notes: list[str]) -> list[str]:
    """The runs that are rehearsals (random weights or rewards), noted first."""
    rehearsals = [r.name for r in runs if r.rehearsal]
    if rehearsals:
        notes.insert(0, REHEARSAL_NOTE.format(runs=", ".join(rehearsals)))
    return rehearsals


def _states(runs: list[Run]) -> str:
    """Each run's name and status, for the error when none can be analysed."""
    return ", ".join(
        f"{r.name} {r.status}" + (f" ({r.error})" if r.error else "")
        + (" (files contradict themselves)" if r.contradictions else "")
        for r in runs
    )


def _rank_notes(analysed: list[Run], ranks: pd.DataFrame) -> list[str]:
    """What the rank table leaves out, in words: zero matrices, matrices without a finite value,
    non-numeric cells, or no rank at all."""
    notes = []
    if ranks.attrs.get("zero_rows"):
        notes.append(
            f"{ranks.attrs['zero_rows']} ranks.csv rows of zero matrices (every measure 0: "
            "no gradient signal) are left out of every average"
        )
    recorded = {m for r in analysed if "matrix" in r.ranks for m in r.ranks["matrix"].unique()}
    empty = sorted(recorded - set(ranks["matrix"]))
    if empty:
        notes.append(
            f"no finite rank values for {', '.join(empty)} (e.g. no group with "
            "unequal rewards at any probe step), so no verdict for them"
        )
    notes += _numeric_problems(analysed)
    if ranks.empty:
        notes.append("no rank value in any ranks.csv (no probe step, or no informative group): "
                     "claims 2 and 4 cannot be judged")
    return notes


def _judge(analysed: list[Run], measures: list[str], rules: Rules, ranks: pd.DataFrame,
           progress: str, progress_bins: int) -> tuple[Readings, pd.DataFrame]:
    """Every reading and verdict, in data order; with the composition table (the composition
    figure reads it). `progress`: the matched readings' variable; `progress_bins` its bins."""
    probes = frozenset(str(r.path) for r in analysed if r.info.get("kind") == "probe")
    groups = group_table(analysed, measures)
    verdicts, intervals = rank_verdicts(ranks, groups, rules, probes)
    summary = rank_summary(last_part_means(ranks, rules.last_fraction)).merge(
        intervals, on=[*SUMMARY_KEYS, "group_size"], how="left")
    edges = progress_edges(analysed, progress, progress_bins)
    matched = matched_readings(with_x(ranks, analysed, progress, edges), rules, progress)
    comp_table = comp.composition_table(analysed, measures)
    weights = token_weights.token_weight_table(analysed)
    # ranks on the same rows for every estimator, once: claim 4 decides on its measure, the
    # credit comparison shows every measure analysed
    same_rows = credit_compare.same_rows_table(
        analysed, [*measures, *([] if rules.rank_measure in measures else [rules.rank_measure])], rules)
    claims = judge_claims(analysed, verdicts, matched, rules, weights, same_rows, ranks)
    outlying = outliers.claim2_part(analysed, ranks, groups, rules, zero_sum_variants(analysed), probes)
    if outlying is not None:  # claim 2 says that its intervals rest on an outlying seed
        claims[1] = replace(claims[1], parts=[*claims[1].parts, outlying],
                            facts=Joined((claims[1].facts, outlying)))
    collapsed = collapse.collapse_frame(analysed, ranks, rules.rank_matrix, rules.rank_measure)
    stages = collapse.stage_table(collapsed)
    coverage, bins = matching.matching_tables(analysed, collapsed, progress_bins, rules)
    readings = Readings(
        summary=summary, verdicts=verdicts, matched=matched, composition=comp.departure(comp_table),
        claims=claims, collapse=collapsed, stages=stages,
        stage_readings=collapse.stage_readings(stages, rules),
        collapse_warnings=collapse.collapse_warnings(stages, rules),
        credit_comparison=credit_compare.comparison_table(analysed, measures, rules, same_rows),
        matching_coverage=coverage, matching_bins=bins,
        same_checkpoint=same_checkpoint.checkpoint_table(analysed, ranks, rules),
        token_weights=weights, update_density=update_density.density_table(analysed),
        top_energy=update_geometry.top_energy_table(analysed, rules.last_fraction),
        trajectory=update_geometry.trajectory_table(analysed),
        units=units.units_by_variant(analysed),
    )
    return readings, comp_table


def _write(result: AnalysisResult, out: Path) -> dict[str, Path]:
    """Every file of the analysis under `out`; returns {name: path}."""
    report.summary_frame(result).to_csv(out / "summary.csv", index=False)
    (out / "summary.md").write_text(render.render_markdown(report.blocks(result)))
    (out / report.DETAILS).write_text(render.render_markdown(report.details_page(result)))
    (out / "report.html").write_text(render.render_html(report.html_page(result), result.figures,
                                                        figures_module.CAPTIONS))
    files = {
        "summary_csv": out / "summary.csv",
        "summary_md": out / "summary.md",
        "details_md": out / report.DETAILS,
        "report": out / "report.html",
    }
    # issue 30's readings as data beside the summary (written only when there is something)
    for name, table in (
        ("stages", result.stages), ("stage_readings", result.stage_readings),
        ("credit_comparison", result.credit_comparison), ("matching", result.matching_coverage),
        ("matching_bins", result.matching_bins), ("same_checkpoint", result.same_checkpoint),
        ("token_weights", result.token_weights), ("update_density", result.update_density),
    ):
        if not table.empty:
            table.to_csv(out / f"{name}.csv", index=False)
            files[f"{name}_csv"] = out / f"{name}.csv"
    return files
