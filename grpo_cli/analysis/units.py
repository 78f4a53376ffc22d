"""The unit behind a reading's intervals, and the population it speaks for (issue 60).

A seed-level interval treats the runs' seeds as independent replicates. That holds for the whole
experiment only where each seed trained from its own initial model: a model shared by every seed
(one warm start, one pretrained model, one checkpoint under `grpo probe`) is a random effect
common to all of them, left out of the interval, so the interval is conditional on that model
and speaks for RL from it, not for the experiment (pseudo-replication: two draws of the CPU
preset's warm start read 3.70 and 3.06 at R = 16, intervals apart; tests/test_calibration.py
measures the coverage). Which model a run started from is run.json's `initial_model`
(analysis/load.Run.initial_model, the one reader; older results read as the old design).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from grpo_cli.analysis.load import Run

INDEPENDENT = "independent seeds"  # each seed its own initial model: replicates of the experiment
SHARED_MODEL = "RL seeds on one shared model"  # every seed from one model: conditional on it
PROMPT_GROUPS = "prompt groups on one checkpoint"  # `grpo probe`: one set of weights
SHARED_NAMES = {"warm_start": "warm start", "pretrained": "pretrained model",
                "random": "random initialisation", "checkpoint": "checkpoint"}


@dataclass(frozen=True)
class Unit:
    """What the intervals of a reading over `runs` runs are about."""

    kind: str  # INDEPENDENT | SHARED_MODEL | PROMPT_GROUPS
    model: str  # the initial model's kind in words (SHARED_NAMES), e.g. "warm start"
    where: str = ""  # the shared model: a warm-start key, a path ("" when unknown or independent)
    legacy: bool = False  # inferred for results written before run.json's `initial_model`
    runs: int = 0

    @property
    def conditional(self) -> bool:
        return self.kind != INDEPENDENT

    @property
    def words(self) -> str:
        """The verdict table's `unit` column."""
        if self.kind == INDEPENDENT:
            return f"independent seeds (each its own {self.model})"
        if self.kind == PROMPT_GROUPS:
            return "prompt groups on one checkpoint (conditional on it)"
        return f"RL seeds on one shared {self.model} (conditional on it)"

    @property
    def clause(self) -> str:
        """E.g. "conditional on one warm start"; "" for independent seeds."""
        return f"conditional on one {self.model}" if self.conditional else ""

    def sentence(self) -> str:
        """What population the claim's intervals speak for, in words."""
        named = f" ({self.where})" if self.where else ""
        old = (" (results without run.json's initial_model: read as the old design, one model "
               "for every seed)" if self.legacy else "")
        if self.kind == INDEPENDENT:
            return (f"Unit: independent seeds, each trained from its own {self.model}: the "
                    "intervals speak for the experiment (initial model and RL seed drawn "
                    "afresh), what a new sweep of the same preset would read.")
        if self.kind == PROMPT_GROUPS:
            return (f"Unit: prompt groups on one checkpoint{named}{old}: every interval is "
                    "conditional on that checkpoint's weights and says nothing about training's "
                    "seed-to-seed variation.")
        return (f"Unit: RL seeds on one shared {self.model}{named}{old}: every interval is "
                f"{self.clause}, whose own draw it leaves out; it speaks for RL from that "
                f"model, not for the experiment (another {self.model} can read outside it).")


def _shared(models: list[dict], seeds: list[int | None]) -> bool:
    """One model for every seed: a run says so, or two seeds recorded the same warm start."""
    if any(m.get("shared") for m in models):
        return True
    owner: dict[str, int | None] = {}
    for model, seed in zip(models, seeds, strict=True):
        key = model.get("key")
        if model.get("kind") == "warm_start" and key:
            if owner.setdefault(key, seed) != seed:
                return True
    return False


def unit_of(runs: Iterable[Run]) -> Unit | None:
    """The unit of a reading over `runs` (None without a run). Any shared model makes the whole
    reading conditional; `grpo probe` directories alone read prompt groups on one checkpoint."""
    runs = list(runs)
    if not runs:
        return None
    models = [run.initial_model for run in runs]
    kinds = sorted({str(m.get("kind")) for m in models})
    legacy = any(m.get("legacy") for m in models)
    if kinds == ["checkpoint"]:
        paths = sorted({str(m.get("path") or "") for m in models} - {""})
        return Unit(PROMPT_GROUPS, "checkpoint", ", ".join(paths), runs=len(runs))  # always shared
    if _shared(models, [run.seed for run in runs]):
        shared = [m for m in models if m.get("shared")] or models
        kind = str(shared[0].get("kind"))
        where = sorted({str(m.get("key") or m.get("path") or "") for m in shared} - {""})
        return Unit(SHARED_MODEL, SHARED_NAMES.get(kind, "model"), ", ".join(where), legacy,
                    len(runs))
    names = {SHARED_NAMES.get(k, "model") for k in kinds}
    return Unit(INDEPENDENT, names.pop() if len(names) == 1 else "initial model",
                runs=len(runs))


def units_by_variant(runs: Iterable[Run]) -> dict[str, Unit]:
    """variant label -> the unit of its runs (the verdict table's `unit` column)."""
    by_variant: dict[str, list[Run]] = {}
    for run in runs:
        by_variant.setdefault(run.variant, []).append(run)
    return {variant: unit_of(group) for variant, group in by_variant.items()}
