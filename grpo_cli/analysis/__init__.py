"""Analysis of results directories: tables, verdicts, figures, report (`grpo analyze`).

Reads only the files of docs/results.md (pandas, numpy, matplotlib); nothing here imports torch,
transformers or vLLM, so `grpo analyze` runs on a laptop. Data flow:
load -> grouping -> tables -> summary / composition -> plots / plots_training -> report,
orchestrated by `pipeline.analyze`. `analyze` is imported lazily to keep `import grpo_cli` cheap.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from grpo_cli.analysis.pipeline import AnalysisResult, analyze

__all__ = ["AnalysisResult", "analyze"]


def __getattr__(name: str):
    if name in __all__:
        from grpo_cli.analysis import pipeline

        return getattr(pipeline, name)
    raise AttributeError(f"module 'grpo_cli.analysis' has no attribute {name!r}")
