"""The rows of a results directory, built in one place for every trainer (docs/results.md).

grpo-cli's loop (grpo_cli/train/) and the TRL callback (grpo_cli/integrations/trl_spectra.py)
both build run.json with `run_record`, each metrics.csv row with `metrics_row` (its values from
grpo_cli/probes/step_metrics.py, shared too) and each timings.csv row with `timing_row`, so their
columns cannot drift apart. What one trainer cannot measure it passes as NaN (an empty cell), by
name; a key outside the contract is an error.
No torch here: a future trainer's hook, and `grpo analyze`, can import it alone.
"""

from __future__ import annotations

import datetime as dt
import math
import platform
import sys
from collections.abc import Iterable, Mapping
from importlib import metadata

import grpo_cli
from grpo_cli.results.writer import METRIC_COLUMNS, TIMING_COLUMNS

# The loop's phases in timings.csv order (rollout, reward, ..., other); time_step is their sum.
PHASES = tuple(
    column.removeprefix("time_") for column in TIMING_COLUMNS
    if column.startswith("time_") and column != "time_step"
)
# timings.csv's per-phase peak memory columns (grpo_cli/runtime/memory.py PHASE_COLUMNS)
PEAK_COLUMNS = tuple(column for column in TIMING_COLUMNS if column.startswith("peak_") and column != "peak_memory_mb")
# metrics.csv columns the probes fill on probe steps (grpo_cli/probes/runner.py ProbeRows.metrics)
PROBE_METRICS = (
    "grad_sparsity", "grad_hoyer", "grad_group_abs_cosine",
    "update_changed_frac", "update_changed_frac_master", "update_changed_frac_bf16",
    "step_changed_frac", "step_changed_frac_master", "step_changed_frac_bf16",  # probes.changed_every
    *(column for column in METRIC_COLUMNS if column.startswith(("grad_norm_", "grad_noise_", "grad_snr"))),
)
# run.json's estimator_facts (grpo_cli/algorithm/advantages.py RegisteredEstimator.facts)
ESTIMATOR_FACT_KEYS = ("name", "credit", "zero_sum_group")
# run.json keys beyond the common ones, each documented in docs/results.md, by trainer
EXTRA_RUN_KEYS = {"grpo-cli": (), "trl": ("loss_type",), "grpo-probe": ("kind", "probe")}


def utc_now() -> str:
    return dt.datetime.now(dt.UTC).isoformat(timespec="seconds")


def versions(**extra: str) -> dict:
    """run.json's `versions`: python, torch, transformers, grpo_cli (and any `extra`, e.g. trl).

    torch is the loaded module's `__version__`, build tag included ("2.11.0+cu130"; a CUDA wheel's
    metadata may say "2.11.0"): every writer of run.json has torch loaded, and this layer reads it
    from sys.modules rather than importing it (the import contract keeps torch out of results)."""
    torch = sys.modules.get("torch")
    return {
        "python": platform.python_version(),
        "torch": torch.__version__ if torch is not None else metadata.version("torch"),
        "transformers": metadata.version("transformers"),
        "grpo_cli": grpo_cli.__version__,
        **extra,
    }


def _checked_run_keys(trainer: str, estimator_facts: Mapping, extra: Mapping | None) -> dict:
    """`extra` as a dict, once the estimator's facts and the trainer's extra keys are the ones
    run.json records (KeyError / ValueError naming what differs)."""
    if set(estimator_facts) != set(ESTIMATOR_FACT_KEYS):
        raise KeyError(f"run.json: estimator_facts has keys {sorted(estimator_facts)}, "
                       f"expected {list(ESTIMATOR_FACT_KEYS)}")
    allowed = EXTRA_RUN_KEYS.get(trainer)
    if allowed is None:
        raise ValueError(f"run.json: unknown trainer {trainer!r}; known: {', '.join(EXTRA_RUN_KEYS)}")
    extra = dict(extra or {})
    if set(extra) != set(allowed):
        raise KeyError(f"run.json: trainer {trainer!r} records extra keys {sorted(allowed)}, "
                       f"got {sorted(extra)} (docs/results.md lists them)")
    return extra


def run_record(
    *,
    trainer: str,  # "grpo-cli" | "trl" | "grpo-probe" (`grpo probe`): who wrote the directory
    seed: int,
    group_size: int,
    estimator_facts: Mapping,  # RegisteredEstimator.facts(): name, credit, zero_sum_group
    model: str,
    task: str,
    experiment: str,
    param_regex: str,  # probes.param_regex: which parameters span P for the per-rollout matrices
    weights: str,  # model.weights
    reward: str,  # task.reward
    device: str | None = None,
    initial_model: Mapping | None = None,  # models/policy.py initial_model_record; None: not recorded (TRL)
    resumed_from: int | None = None,
    versions_extra: Mapping[str, str] | None = None,
    extra: Mapping | None = None,  # EXTRA_RUN_KEYS[trainer]
) -> dict:
    """run.json as a run starts (`status: running`); the run then updates its status keys."""
    extra = _checked_run_keys(trainer, estimator_facts, extra)
    return {
        "status": "running",
        "error": None,
        "started_at": utc_now(),
        "ended_at": None,
        "last_step": None,
        "stopped_by": None,
        "versions": versions(**(versions_extra or {})),
        "device": device,
        # what the rollout's auto settings chose (grpo run sets it once its backend is built,
        # train/setup.py resolved_rollout); None where grpo-cli does not sample (TRL, a probe)
        "rollout_resolved": None,
        "seed": seed,
        "group_size": group_size,
        "estimator": estimator_facts["name"],
        "estimator_facts": dict(estimator_facts),
        "model": model,
        # the weights RL starts from and whether every seed shares them (docs/results.md)
        "initial_model": dict(initial_model) if initial_model is not None else None,
        "task": task,
        "experiment": experiment,
        "resumed_from": resumed_from,
        "reused_from": None,  # the run directory this one's files were copied from (train/reuse.py)
        "checkpoint_step": None,
        "param_regex": param_regex,
        # Random weights or coin-flip rewards: a rehearsal of memory and time, never evidence
        "rehearsal": weights == "random" or reward == "random",
        "weights": weights,
        "reward": reward,
        "argv": sys.argv,
        "trainer": trainer,
        **extra,
    }


def metrics_row(values: Mapping) -> dict:
    """One metrics.csv row, every column in order. Every column but the probes' must be given
    (NaN where the trainer cannot measure it); the probe columns are NaN until the probes fill
    them on probe steps."""
    unknown = sorted(set(values) - set(METRIC_COLUMNS))
    missing = sorted(set(METRIC_COLUMNS) - set(values) - set(PROBE_METRICS))
    if unknown or missing:
        raise KeyError(f"metrics.csv row: unknown columns {unknown}, missing columns {missing}")
    return {column: values.get(column, math.nan) for column in METRIC_COLUMNS}


def timing_row(step: int, seconds: Mapping[str, float], peak_mb: float,
               phase_peaks: Mapping[str, float] | None = None,
               measured: Iterable[str] = PHASES) -> dict:
    """Phase totals as a timings.csv row: `time_<phase>` per phase (0.0 for a measured phase
    that did not run, NaN for one this trainer cannot separate), `time_step` their sum,
    `peak_memory_mb` and the per-phase `peak_<phase>_mb` (NaN when not measured)."""
    measured = set(measured)
    unknown = (set(seconds) | measured) - set(PHASES)
    if unknown:
        raise KeyError(f"phases without a timings.csv column: {sorted(unknown)}")
    row = {"step": step, **{f"time_{phase}": seconds.get(phase, 0.0) if phase in measured else math.nan
                            for phase in PHASES}}
    row["time_step"] = sum(seconds.values())
    row["peak_memory_mb"] = peak_mb
    peaks = dict(phase_peaks or {})
    if set(peaks) - set(PEAK_COLUMNS):
        raise KeyError(f"timings.csv: unknown peak columns {sorted(set(peaks) - set(PEAK_COLUMNS))}")
    row.update({column: peaks.get(column, math.nan) for column in PEAK_COLUMNS})
    return row
