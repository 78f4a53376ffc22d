"""Write one run's results as it goes: rows appended and flushed, so a crash loses nothing.

See docs/results.md for the contract. CSV logs are appended row by row; the spectra log is kept
as one Parquet file rewritten atomically at each probe step (a Parquet footer cannot be appended
to). On resume, every log is cut back to the steps before the checkpoint, so no row is duplicated
and none is missing.
"""

from __future__ import annotations

import csv
import io
import json
import math
import os
from collections.abc import Iterable, Sequence
from pathlib import Path

import pandas as pd

from grpo_cli.measures import RANK_MEASURES

METRIC_COLUMNS = (
    "step",
    "reward_mean",
    "reward_std",
    "accuracy_train",
    "zero_variance_frac",
    "expected_zero_variance_frac",
    "expected_zero_variance_frac_batch",
    "loss",
    "pg_loss",
    "kl",
    "value_loss",
    "entropy",
    "clip_frac",
    "grad_norm",
    "completion_len_mean",
    "completion_len_max",
    "tokens",
    "logprob_diff_mean",
    "logprob_diff_max",
    "groups_dropped",
    "grad_sparsity",
    "grad_hoyer",
    "credit_uniform_frac",
)
TIMING_COLUMNS = (
    "step",
    "time_rollout",  # one column per phase of grpo_cli/train/loop.py, exclusive (they sum to time_step)
    "time_reward",
    "time_old_log_prob",
    "time_advantage",
    "time_forward",
    "time_backward",
    "time_optimizer",
    "time_update",
    "time_sync_weights",
    "time_probes",
    "time_eval",
    "time_other",
    "time_step",
    "peak_memory_mb",
    "peak_rollout_mb",
    "peak_train_mb",
    "peak_optimizer_mb",
    "peak_probes_mb",
)
EVAL_COLUMNS = ("step", "accuracy", "n", "greedy")
EVENT_COLUMNS = ("step", "alarm", "value", "message")
RANK_COLUMNS = (
    ("step", "matrix", "layer", "group", "n_rows", "n_zero_groups")
    + RANK_MEASURES
    + ("minority", "majority", "distinct", "mean_abs_cosine")
    + tuple(f"pred_{name}" for name in RANK_MEASURES)
    + tuple(f"pred_distinct_{name}" for name in RANK_MEASURES)
    + ("sparsity", "hoyer", "powerlaw_alpha", "powerlaw_r2")
)
SPECTRA_COLUMNS = ("step", "matrix", "layer", "group", "k", "sigma")


def _format(value) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        return "" if math.isnan(value) else repr(value)
    return str(value)


class CsvLog:
    """An append-only CSV with a fixed header; unknown keys are a programming error."""

    def __init__(self, path: Path, columns: Sequence[str]):
        self.path = path
        self.columns = tuple(columns)

    def append(self, rows: Iterable[dict]) -> None:
        rows = list(rows)
        if not rows:
            return
        new_file = not self.path.exists() or self.path.stat().st_size == 0
        with open(self.path, "a", newline="") as handle:
            writer = csv.writer(handle, lineterminator="\n")
            if new_file:
                writer.writerow(self.columns)
            for row in rows:
                unknown = set(row) - set(self.columns)
                if unknown:
                    raise KeyError(f"{self.path.name}: unknown columns {sorted(unknown)}")
                writer.writerow([_format(row.get(column)) for column in self.columns])
            handle.flush()
            os.fsync(handle.fileno())

    def truncate_from(self, step: int) -> None:
        """Drop every row with step >= `step` (used when resuming from a checkpoint).

        A torn last line (a run killed mid-write) is dropped too; the file is rewritten with LF
        line endings, like every row appended.
        """
        if not self.path.exists() or self.path.stat().st_size == 0:
            return
        with open(self.path, newline="") as handle:
            text = handle.read()
        text = text[: text.rfind("\n") + 1]  # keep complete lines only
        rows = list(csv.reader(io.StringIO(text, newline="")))
        header, body = (rows[0], rows[1:]) if rows else (list(self.columns), [])
        column = header.index("step")
        kept = [
            row for row in body
            if len(row) == len(header) and row[column].isdigit() and int(row[column]) < step
        ]
        temporary = self.path.with_suffix(".tmp")
        with open(temporary, "w", newline="") as handle:
            csv.writer(handle, lineterminator="\n").writerows([header, *kept])
        temporary.replace(self.path)


class ParquetLog:
    """A long-format table rewritten atomically on every append."""

    def __init__(self, path: Path, columns: Sequence[str]):
        self.path = path
        self.columns = tuple(columns)
        self.frames: list[pd.DataFrame] = []
        if path.exists():
            self.frames.append(pd.read_parquet(path))

    def append(self, rows: list[dict]) -> None:
        if not rows:
            return
        self.frames.append(pd.DataFrame(rows, columns=list(self.columns)))
        self._write()

    def truncate_from(self, step: int) -> None:
        if not self.frames:
            return
        frame = pd.concat(self.frames, ignore_index=True)
        self.frames = [frame[frame["step"] < step]]
        self._write()

    def _write(self) -> None:
        frame = pd.concat(self.frames, ignore_index=True)
        self.frames = [frame]
        temporary = self.path.with_suffix(".parquet.tmp")
        frame.to_parquet(temporary, index=False)
        temporary.replace(self.path)


class RunResults:
    """All the files of one run directory."""

    def __init__(self, run_dir: Path):
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        (self.run_dir / "checkpoints").mkdir(exist_ok=True)
        self.metrics = CsvLog(self.run_dir / "metrics.csv", METRIC_COLUMNS)
        self.timings = CsvLog(self.run_dir / "timings.csv", TIMING_COLUMNS)
        self.evals = CsvLog(self.run_dir / "eval.csv", EVAL_COLUMNS)
        self.events = CsvLog(self.run_dir / "events.csv", EVENT_COLUMNS)
        self.ranks = CsvLog(self.run_dir / "ranks.csv", RANK_COLUMNS)
        self.spectra = ParquetLog(self.run_dir / "spectra.parquet", SPECTRA_COLUMNS)

    @property
    def checkpoint_path(self) -> Path:
        return self.run_dir / "checkpoints" / "latest.pt"

    def truncate_from(self, step: int) -> None:
        """Forget everything after a checkpoint taken once `step` optimizer steps were done."""
        for log in (self.metrics, self.timings, self.events, self.ranks, self.spectra):
            log.truncate_from(step)  # rows keyed by the 0-based index of the step
        # eval rows are keyed by steps completed; the step-0 evaluation is redone on a fresh start
        self.evals.truncate_from(step + 1 if step > 0 else 0)

    def ensure_files(self) -> None:
        """Create every contract file (header only) so a run that stops early is still readable."""
        for log in (self.metrics, self.timings, self.evals, self.events, self.ranks):
            if not log.path.exists():
                with open(log.path, "w", newline="") as handle:
                    csv.writer(handle, lineterminator="\n").writerow(log.columns)
        if not self.spectra.path.exists():
            pd.DataFrame(columns=list(SPECTRA_COLUMNS)).to_parquet(self.spectra.path, index=False)

    def read_status(self) -> dict | None:
        path = self.run_dir / "run.json"
        return json.loads(path.read_text()) if path.exists() else None

    def write_status(self, record: dict) -> None:
        temporary = self.run_dir / "run.json.tmp"
        temporary.write_text(json.dumps(record, indent=2, default=str) + "\n")
        temporary.replace(self.run_dir / "run.json")
