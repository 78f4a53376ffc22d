"""Write one run's results as it goes: rows appended and flushed, so a crash loses nothing.

See docs/results.md for the contract. CSV logs are appended row by row; the spectra log is kept
as one Parquet file rewritten atomically at each probe step (a Parquet footer cannot be appended
to). On resume, every log is cut back to the steps before the checkpoint, so no row is duplicated
and none is missing.
"""

from __future__ import annotations

import csv
import errno
import io
import json
import math
import os
from collections.abc import Iterable, Sequence
from contextlib import contextmanager
from pathlib import Path

import pandas as pd

from grpo_cli.config.errors import InputError
from grpo_cli.measures import RANK_MEASURES, TOP_ENERGY_COLUMNS

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
    "groups_all_wrong",  # share of groups whose rollouts are all wrong (final answer)
    "groups_all_right",  # ... all right
    "groups_mixed",  # ... some right, some wrong
    "update_changed_frac",  # probe steps: entries of the update's weights changed since W_0
    "update_changed_frac_master",  # ... in the fp32 masters (empty without them)
    "update_changed_frac_bf16",  # ... in a bf16 round-to-nearest copy of the weights
    "distinct_completions",  # mean distinct completions per informative group (mode collapse)
    "token_weight_uniform_frac",  # informative rollouts whose d loss / d log pi(y_t) is uniform
    "token_weight_spread",  # ... and their mean relative spread max|w - mean w| / max|w|
    # probe steps, from the per-rollout Gram K_adv (grpo_cli/measures.py; docs/results.md):
    "grad_norm_rollout_mean",  # ||g_i|| = sqrt(K_ii) over rollouts with a non-zero advantage
    "grad_norm_rollout_median",
    "grad_norm_rollout_min",
    "grad_norm_rollout_max",
    "grad_norm_rollout_cv",  # population std / mean
    "grad_norm_batch_gram",  # ||sum_i g_i|| = sqrt(1^T K 1) over the probed parameters
    "grad_norm_probed",  # the trainer's own gradient norm over the probed parameters
    "grad_norm_mismatch",  # 1 when the two differ beyond round-off, 0 when not, empty: not comparable
    "grad_noise_scale",  # B_simple = tr Sigma / |G|^2 in rollouts (McCandlish et al. 2018)
    "grad_noise_scale_groups",  # ... with each group's summed gradient as one example, in prompts
    "grad_group_abs_cosine",  # mean |cos| between the groups' summed gradients (arXiv 2601.23135)
    "grad_snr",  # |G|^2 / (tr Sigma / N) = N / B_simple
    "grad_norm_layer_max_share",  # max over layers of ||G_l||^2 / ||G||^2, G the trainer's batch gradient
    # every step (grpo_cli/probes/head_share.py, step_change.py, step_metrics.py; docs/results.md)
    "grad_share_head_embedding",  # (||g_head||^2 + ||g_embedding||^2) / grad_norm^2, a tied weight once
    "grad_share_head",  # ||g_head||^2 / grad_norm^2 (empty: tied to the embedding)
    "grad_share_embedding",  # ||g_embedding||^2 / grad_norm^2 (empty: tied to the head)
    "step_changed_frac",  # entries of the layer weights this step's update changed (probes.changed_every)
    "step_changed_frac_master",  # ... in the fp32 masters (empty without them)
    "step_changed_frac_bf16",  # ... in a bf16 round-to-nearest copy of the weights
    "entropy_adv_positive",  # mean token entropy over tokens whose advantage is > 0 (EAPO)
    "entropy_adv_negative",  # ... < 0
    "entropy_adv_zero",  # ... == 0
    "distinct_correct",  # mean distinct correct completions per group with a correct one (G2RPO)
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
    + ("minority", "majority", "distinct", "mean_abs_cosine", "n_nonzero_rows", "problem_steps")
    + tuple(f"pred_{name}" for name in RANK_MEASURES)
    + tuple(f"pred_distinct_{name}" for name in RANK_MEASURES)
    + ("sparsity", "hoyer", "powerlaw_alpha", "powerlaw_r2")
    + TOP_ENERGY_COLUMNS  # every row: E_k, the share of sum sigma^2 in the top k directions
    + ("changed_frac", "changed_frac_master", "changed_frac_bf16")
    + ("coherence", "pred_coherence", "score_cosine")
)
SPECTRA_COLUMNS = ("step", "matrix", "layer", "group", "k", "sigma")
# one row per probe step, rollout and probed layer ("all": every probed parameter); rows with no
# rollout (nor group, reward, advantage): the trainer's batch gradient over that layer
GRAD_NORM_COLUMNS = ("step", "layer", "rollout", "group", "reward", "advantage", "grad_norm")


def _format(value) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        return "" if math.isnan(value) else repr(value)
    return str(value)


class CsvLog:
    """An append-only CSV; unknown keys are a programming error.

    A file written by an older version may have other columns (ranks.csv gained
    `pred_distinct_*`): before the first row is appended, or when cut back on resume, it is
    rewritten under the current columns, followed by any column only the file has; old rows stay
    empty in the new columns, and new rows in the old ones.
    """

    def __init__(self, path: Path, columns: Sequence[str]):
        self.path = path
        self.columns = tuple(columns)
        self._conformed = False  # the file's header is known to equal self.columns

    def append(self, rows: Iterable[dict]) -> None:
        rows = list(rows)
        if not rows:
            return
        new_file = not self.path.exists() or self.path.stat().st_size == 0
        if not new_file and not self._conformed:
            with open(self.path, newline="") as handle:
                header = next(csv.reader(handle), [])
            if tuple(header) != self.columns:
                self._rewrite(*self._read())
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
        self._conformed = True

    def truncate_from(self, step: int) -> None:
        """Drop every row with step >= `step` (used when resuming from a checkpoint).

        A torn last line (a run killed mid-write) is dropped too; the file is rewritten with LF
        line endings, like every row appended.
        """
        if not self.path.exists() or self.path.stat().st_size == 0:
            return
        header, body = self._read()
        column = header.index("step")
        self._rewrite(header, [
            row for row in body if row[column].isdigit() and int(row[column]) < step
        ])

    def _read(self) -> tuple[list[str], list[list[str]]]:
        """The file's header and its complete rows (a torn last line is left out)."""
        with open(self.path, newline="") as handle:
            text = handle.read()
        text = text[: text.rfind("\n") + 1]  # keep complete lines only
        rows = list(csv.reader(io.StringIO(text, newline="")))
        header, body = (rows[0], rows[1:]) if rows else (list(self.columns), [])
        if "step" not in header:
            raise ValueError(f"{self.path}: the header has no `step` column: {header}")
        return header, [row for row in body if len(row) == len(header)]

    def _rewrite(self, header: list[str], body: list[list[str]]) -> None:
        """Write `body` (rows under the file's `header`) under the current columns, then the
        columns only the file has; each value stays under its own column name."""
        columns = self.columns + tuple(name for name in header if name not in self.columns)
        where = {name: i for i, name in enumerate(header)}
        rows = [[row[where[name]] if name in where else "" for name in columns] for row in body]
        temporary = self.path.with_suffix(".tmp")
        with _removed_on_failure(temporary), open(temporary, "w", newline="") as handle:
            csv.writer(handle, lineterminator="\n").writerows([columns, *rows])
        temporary.replace(self.path)
        self.columns, self._conformed = columns, True


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
        with _removed_on_failure(temporary):
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
        self.grad_norms = CsvLog(self.run_dir / "grad_norms.csv", GRAD_NORM_COLUMNS)

    @property
    def checkpoint_path(self) -> Path:
        return self.run_dir / "checkpoints" / "latest.pt"

    def truncate_from(self, step: int) -> None:
        """Forget everything after a checkpoint taken once `step` optimizer steps were done."""
        for log in (self.metrics, self.timings, self.events, self.ranks, self.spectra, self.grad_norms):
            log.truncate_from(step)  # rows keyed by the 0-based index of the step
        # eval rows are keyed by steps completed; the step-0 evaluation is redone on a fresh start
        self.evals.truncate_from(step + 1 if step > 0 else 0)

    def ensure_files(self) -> None:
        """Create every contract file (header only) so a run that stops early is still readable."""
        for log in (self.metrics, self.timings, self.evals, self.events, self.ranks, self.grad_norms):
            if not log.path.exists():
                with open(log.path, "w", newline="") as handle:
                    csv.writer(handle, lineterminator="\n").writerow(log.columns)
        if not self.spectra.path.exists():
            pd.DataFrame(columns=list(SPECTRA_COLUMNS)).to_parquet(self.spectra.path, index=False)

    def read_status(self) -> dict | None:
        """run.json's record, None if there is none; InputError names the file if it is not a
        JSON object."""
        path = self.run_dir / "run.json"
        if not path.exists():
            return None
        try:
            record = json.loads(path.read_text())
        except (ValueError, OSError) as error:  # invalid JSON or UTF-8, or unreadable
            raise InputError(f"{path}: not a run status ({str(error).splitlines()[0]}); delete it "
                             "to resume from the run's checkpoints") from None
        if not isinstance(record, dict):
            raise InputError(f"{path}: not a run status (a JSON {type(record).__name__}, not an "
                             "object); delete it to resume from the run's checkpoints")
        return record

    def write_status(self, record: dict) -> None:
        """run.json, atomically (never half written). While the run goes (`status: running`) a
        small reserve file keeps room for it: when the disk fills, the reserve is deleted and the
        write retried, so the final status (`failed`, naming the full disk) is still recorded."""
        path, reserve = self.run_dir / "run.json", self.run_dir / STATUS_RESERVE
        text = json.dumps(record, indent=2, default=str) + "\n"
        try:
            _write_text_atomic(path, text)
        except OSError as error:
            if error.errno != errno.ENOSPC or not reserve.exists():
                raise
            reserve.unlink()  # the room kept for this write
            _write_text_atomic(path, text)
            if record.get("status") == "running":
                raise  # full: the run stops, and its final status takes the room freed
        if record.get("status") != "running":
            reserve.unlink(missing_ok=True)
        elif not reserve.exists():
            try:
                reserve.write_bytes(os.urandom(STATUS_RESERVE_BYTES))  # random: no compression or dedup
            except OSError:  # a disk already full: no room to keep
                reserve.unlink(missing_ok=True)


STATUS_RESERVE = ".run.json.reserve"  # room for run.json's last write on a full disk
STATUS_RESERVE_BYTES = 64 * 1024  # run.json is a few KiB


@contextmanager
def _removed_on_failure(temporary: Path):
    """A temporary file that an error while writing it (a full disk) does not leave behind."""
    try:
        yield temporary
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise


def _write_text_atomic(path: Path, text: str) -> None:
    """`text` to a temporary beside `path`, renamed into place; no temporary left on failure."""
    temporary = path.with_name(path.name + ".tmp")
    with _removed_on_failure(temporary):
        temporary.write_text(text)
        temporary.replace(path)


def write_table(path: Path, rows: Iterable[dict], columns: Sequence[str]) -> None:
    """A whole CSV (a file computed at once, e.g. trajectory.csv), written atomically; a key
    outside `columns` is a programming error."""
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(columns)
    for row in rows:
        unknown = set(row) - set(columns)
        if unknown:
            raise KeyError(f"{path.name}: unknown columns {sorted(unknown)}")
        writer.writerow([_format(row.get(column)) for column in columns])
    _write_text_atomic(path, buffer.getvalue())
