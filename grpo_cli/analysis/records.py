"""The analysis's hand-off: one frozen record, built once by `pipeline.analyze` and read by
the renderers (report.py, figures.py, docs_blocks.py) and by callers.

It sits low in the stack (no analysis module imports anything above it), so the figures and the
report can name its type instead of `Any`. Frozen: a stage that computes a reading returns it,
and the pipeline builds the record from the readings in one call; nothing downstream fills a
field in. Its DataFrames are the readings' tables as computed (pandas frames are not deep-frozen:
treat them as read-only).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import pandas as pd

if TYPE_CHECKING:  # annotations only: no import at run time, so no cycle
    from grpo_cli.analysis.claims import Claim
    from grpo_cli.analysis.grouping import Grouping
    from grpo_cli.analysis.load import Run
    from grpo_cli.analysis.rules import Rules
    from grpo_cli.analysis.words_over_r import ModeCollapse


@dataclass(frozen=True)
class Readings:
    """What `pipeline._judge` computes from the analysed runs' tables: every reading and
    verdict, in data order, before anything is rendered."""

    summary: pd.DataFrame  # per variant x matrix x layer x stat x measure x R: mean, std,
    # n_seeds, and for verdict rows the interval (low, high) and capped
    verdicts: pd.DataFrame  # one row per variant x matrix x measure (rank_verdict.py)
    matched: pd.DataFrame  # point readings of claim 2's rule at matched progress
    composition: pd.DataFrame  # mean |measured - predicted| of rollout_group per-group rows
    claims: list[Claim]  # the paper's four claims, in order
    collapse: pd.DataFrame  # per run x probe step (collapse.py)
    stages: pd.DataFrame  # per variant x R x early/late stage
    stage_readings: pd.DataFrame  # claim 2 per stage
    collapse_warnings: list[ModeCollapse]  # rank -> 2 as distinct falls
    credit_comparison: pd.DataFrame  # claim 4, same rows
    matching_coverage: pd.DataFrame  # matching.py
    matching_bins: pd.DataFrame  # ... the per-bin readings
    same_checkpoint: pd.DataFrame  # grpo probe: per checkpoint
    token_weights: pd.DataFrame  # claim 1, empirically
    update_density: pd.DataFrame  # beside claim 3 (update_density.py)
    top_energy: pd.DataFrame  # E_k per matrix x R (update_geometry.py)
    trajectory: pd.DataFrame  # trajectory.csv's last kept step per R
    units: dict  # variant -> units.Unit: what its seeds replicate


@dataclass(frozen=True)
class AnalysisResult(Readings):
    """Its `Readings` (inherited: result.verdicts, result.claims, ...), the inputs the analysis
    was given and chose, and the files it wrote (absolute paths under out_dir)."""

    out_dir: Path  # where every file below was written
    runs: list[Run]  # every run found, failed ones included
    analysed: list[Run]  # the runs that enter averages, verdicts and figures
    grouping: Grouping  # which config keys differ
    measures: list[str]  # rank measures analysed
    rules: Rules  # every verdict rule and threshold (analysis/rules.py)
    accuracy: pd.DataFrame  # held-out accuracy at the first and last eval, per variant x R
    title: str  # experiment name(s)
    align: str  # x-axis of the rank and dynamics figures
    matched_progress: str  # progress variable of the matched verdicts (reward or accuracy)
    progress_bins: int
    last_fraction: float
    include_incomplete: bool
    variant_columns: dict[str, str]  # variant config key -> display name
    variant_values: dict[str, dict]  # variant label -> {config key: value}
    notes: list[str] = field(default_factory=list)
    figures: dict[str, Path] = field(default_factory=dict)
    files: dict[str, Path] = field(default_factory=dict)  # summary_csv, summary_md, report
