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
from dataclasses import dataclass, field
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
from grpo_cli.analysis.claims import (
    Claim,
    judge_claims,
    zero_sum_variants,
)
from grpo_cli.analysis.grouping import Grouping, display_name, group_runs
from grpo_cli.analysis.load import Run, load_runs
from grpo_cli.analysis.rank_verdict import matched_readings, rank_verdicts
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


@dataclass
class AnalysisResult:
    out_dir: Path  # where every file below was written
    runs: list[Run]  # every run found, failed ones included
    analysed: list[Run]  # the runs that enter averages, verdicts and figures
    grouping: Grouping  # which config keys differ
    measures: list[str]  # rank measures analysed
    rules: Rules  # every verdict rule and threshold (analysis/rules.py)
    summary: pd.DataFrame  # per variant x matrix x layer x stat x measure x R: mean, std,
    # n_seeds, and for verdict rows the interval (low, high) and capped
    verdicts: pd.DataFrame  # one row per variant x matrix x measure (rank_verdict.py)
    matched: pd.DataFrame  # point readings of claim 2's rule at matched progress
    composition: pd.DataFrame  # mean |measured - predicted| of rollout_group per-group rows
    accuracy: pd.DataFrame  # held-out accuracy at the first and last eval, per variant x R
    title: str  # experiment name(s)
    align: str  # x-axis of the rank and dynamics figures
    matched_progress: str  # progress variable of the matched verdicts (reward or accuracy)
    progress_bins: int
    last_fraction: float
    include_incomplete: bool
    variant_columns: dict[str, str]  # variant config key -> display name
    variant_values: dict[str, dict]  # variant label -> {config key: value}
    claims: list[Claim] = field(default_factory=list)  # the paper's four claims, in order
    collapse: pd.DataFrame = field(default_factory=pd.DataFrame)  # per run x probe step (collapse.py)
    stages: pd.DataFrame = field(default_factory=pd.DataFrame)  # per variant x R x early/late stage
    stage_readings: pd.DataFrame = field(default_factory=pd.DataFrame)  # claim 2 per stage
    collapse_warnings: list[str] = field(default_factory=list)  # rank -> 2 as distinct falls
    credit_comparison: pd.DataFrame = field(default_factory=pd.DataFrame)  # claim 4, same rows
    matching_coverage: pd.DataFrame = field(default_factory=pd.DataFrame)  # matching.py
    matching_bins: pd.DataFrame = field(default_factory=pd.DataFrame)  # ... the per-bin readings
    same_checkpoint: pd.DataFrame = field(default_factory=pd.DataFrame)  # grpo probe: per checkpoint
    token_weights: pd.DataFrame = field(default_factory=pd.DataFrame)  # claim 1, empirically
    update_density: pd.DataFrame = field(default_factory=pd.DataFrame)  # beside claim 3 (update_density.py)
    top_energy: pd.DataFrame = field(default_factory=pd.DataFrame)  # E_k per matrix x R (update_geometry.py)
    trajectory: pd.DataFrame = field(default_factory=pd.DataFrame)  # trajectory.csv's last kept step per R
    units: dict = field(default_factory=dict)  # variant -> units.Unit: what its seeds replicate
    notes: list[str] = field(default_factory=list)
    figures: dict[str, Path] = field(default_factory=dict)
    files: dict[str, Path] = field(default_factory=dict)  # summary_csv, summary_md, report


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
    result = AnalysisResult(
        out_dir=Path(out) if out is not None else paths[0] / "analysis",
        runs=runs, analysed=analysed, grouping=grouping, measures=measures, rules=rules,
        summary=pd.DataFrame(), verdicts=pd.DataFrame(), matched=pd.DataFrame(),
        composition=pd.DataFrame(), accuracy=accuracy_summary(analysed),
        title=("REHEARSAL (not science): " if rehearsals else "") + experiments,
        align=align, matched_progress=align if align != "step" else "reward",
        progress_bins=progress_bins, last_fraction=last_fraction,
        include_incomplete=include_incomplete, notes=notes, **_variant_labels(runs, grouping),
    )
    comp_table = _judge(result, ranks)
    _stage_outputs(result, ranks, comp_table, steps, figures, below=paths[0])
    return result


def _stage_outputs(result: AnalysisResult, ranks: pd.DataFrame, comp_table: pd.DataFrame,
                   steps: list[int] | None, figures: bool, below: Path) -> None:
    """Draw and write everything beside result.out_dir, then rename it in (staged_output)."""
    with staged_output(result.out_dir, below=below) as stage:
        if figures:
            result.figures = figures_module.draw_figures(
                figures_module.figure_inputs(result, ranks, comp_table, steps), stage)
        _write(result, stage)
    result.figures = {name: result.out_dir / path.name for name, path in result.figures.items()}
    result.files = {name: result.out_dir / path.name for name, path in result.files.items()}


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


def _judge(result: AnalysisResult, ranks: pd.DataFrame) -> pd.DataFrame:
    """Readings and verdicts into `result`, in data order; returns the composition table (the
    composition figure reads it)."""
    analysed, measures, rules = result.analysed, result.measures, result.rules
    probes = frozenset(str(r.path) for r in analysed if r.info.get("kind") == "probe")
    groups = group_table(analysed, measures)
    verdicts, intervals = rank_verdicts(ranks, groups, rules, probes)
    result.verdicts = verdicts
    result.units = units.units_by_variant(analysed)
    result.summary = rank_summary(last_part_means(ranks, rules.last_fraction)).merge(
        intervals, on=[*SUMMARY_KEYS, "group_size"], how="left")
    progress = result.matched_progress
    edges = progress_edges(analysed, progress, result.progress_bins)
    result.matched = matched_readings(with_x(ranks, analysed, progress, edges), rules, progress)
    comp_table = comp.composition_table(analysed, measures)
    result.composition = comp.departure(comp_table)
    result.token_weights = token_weights.token_weight_table(analysed)
    result.update_density = update_density.density_table(analysed)
    # ranks on the same rows for every estimator, once: claim 4 decides on its measure, the
    # credit comparison shows every measure analysed
    same_rows = credit_compare.same_rows_table(
        analysed, [*measures, *([] if rules.rank_measure in measures else [rules.rank_measure])], rules)
    result.claims = judge_claims(analysed, verdicts, result.matched, rules, result.token_weights, same_rows,
                                 ranks)
    outlying = outliers.claim2_part(analysed, ranks, groups, rules, zero_sum_variants(analysed), probes)
    if outlying is not None:  # claim 2 says that its intervals rest on an outlying seed
        result.claims[1].parts.append(outlying)
        result.claims[1].evidence += f" {outlying.sentence}"
    result.collapse = collapse.collapse_frame(analysed, ranks, rules.rank_matrix, rules.rank_measure)
    result.stages = collapse.stage_table(result.collapse)
    result.stage_readings = collapse.stage_readings(result.stages, rules)
    result.collapse_warnings = collapse.collapse_warnings(result.stages, rules)
    result.matching_coverage, result.matching_bins = matching.matching_tables(
        analysed, result.collapse, result.progress_bins, rules)
    result.credit_comparison = credit_compare.comparison_table(analysed, measures, rules, same_rows)
    result.same_checkpoint = same_checkpoint.checkpoint_table(analysed, ranks, rules)
    result.top_energy = update_geometry.top_energy_table(analysed, rules.last_fraction)
    result.trajectory = update_geometry.trajectory_table(analysed)
    return comp_table


def _write(result: AnalysisResult, out: Path) -> None:
    report.summary_frame(result).to_csv(out / "summary.csv", index=False)
    (out / "summary.md").write_text(render.render_markdown(report.blocks(result)))
    (out / report.DETAILS).write_text(render.render_markdown(report.details_page(result)))
    (out / "report.html").write_text(render.render_html(report.html_page(result), result.figures,
                                                        figures_module.CAPTIONS))
    result.files = {
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
            result.files[f"{name}_csv"] = out / f"{name}.csv"
