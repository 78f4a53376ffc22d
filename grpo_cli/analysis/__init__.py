"""Analysis of results directories: tables, verdicts, figures, report (`grpo analyze`).

Reads only the files of docs/results.md (pandas, numpy, matplotlib); nothing here imports torch,
transformers or vLLM, so `grpo analyze` runs on a laptop. Stages, in data order (pyproject.toml's
import-linter contract keeps each module in its layer; docs/analysis.md "How it is built"):
rules (the rule book) -> load -> frames (tables, summary, grouping) -> statistics (bootstrap,
over_r, trend) -> readings (collapse, matching, same_checkpoint, credit_compare, composition) ->
verdicts (rank_verdict, falsifier, token_weights, claims) -> figures (plots*, the figures
registry) -> report (sections as typed blocks; render writes Markdown and HTML), orchestrated by
`pipeline.analyze`. `analyze` is imported lazily to keep `import grpo_cli` cheap.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from grpo_cli.analysis.pipeline import analyze
    from grpo_cli.analysis.records import AnalysisResult

__all__ = ["AnalysisResult", "analyze"]


def __getattr__(name: str):
    if name in __all__:
        from grpo_cli.analysis import pipeline

        return getattr(pipeline, name)
    raise AttributeError(f"module 'grpo_cli.analysis' has no attribute {name!r}")
