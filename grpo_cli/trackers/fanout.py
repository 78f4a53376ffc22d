"""One object the run talks to; it fans each call out to the chosen trackers.

Tags: `train/<metrics.csv column>`, `eval/accuracy`, `rank/<matrix>/<measure>` (a rank measure or a
`top<k>_energy_share`), `alarm/<alarm>`
(the alarm's value; its message goes to each tracker's text log).
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

from grpo_cli.measures import RANK_MEASURES, TOP_ENERGY_COLUMNS


@dataclass(frozen=True)
class RunIdentity:
    """Who the run is, for the trackers: its directory and name, its experiment (the group a
    sweep's members share) and the settings shown beside it."""

    run_dir: Path
    experiment: str
    params: dict = field(default_factory=dict)  # flat {"rollout.group_size": 4, ...}

    @property
    def name(self) -> str:
        return self.run_dir.name


def rank_curves(rows: Iterable[dict], series: list[str]) -> dict[str, float]:
    """{"rank/<matrix>/<measure>": mean over the rows (layers or groups) of that matrix} for each
    chosen "matrix/measure" pair ("all": every pair present); NaN and empty values are skipped."""
    sums: dict[str, list[float]] = {}
    wanted = None if "all" in series else set(series)
    for row in rows:
        for measure in (*RANK_MEASURES, *TOP_ENERGY_COLUMNS):
            pair = f"{row['matrix']}/{measure}"
            value = row.get(measure)
            if (wanted is None or pair in wanted) and _finite(value):
                sums.setdefault(pair, []).append(float(value))
    return {f"rank/{pair}": sum(values) / len(values) for pair, values in sorted(sums.items())}


def _finite(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def scalars(prefix: str, row: dict) -> dict[str, float]:
    """Every finite number of a results row but its step, tagged `<prefix>/<column>`."""
    return {f"{prefix}/{key}": float(value) for key, value in row.items()
            if key != "step" and _finite(value)}


class Trackers:
    """The chosen trackers; each method forwards to all of them, and drops (warning once) any
    that raises."""

    def __init__(self, backends: list, rank_series: list[str], log: Callable[[str], None] = print):
        self.backends = list(backends)
        self.rank_series = list(rank_series)
        self.log = log

    def __bool__(self) -> bool:
        return bool(self.backends)

    def _each(self, method: str, *args) -> None:
        for backend in list(self.backends):
            try:
                getattr(backend, method)(*args)
            except Exception as error:  # noqa: BLE001 - a tracker never stops the run
                self.backends.remove(backend)
                self.log(f"WARNING tracker {backend.name} dropped ({type(error).__name__}: "
                         f"{str(error).splitlines()[0] if str(error) else ''}); the run goes on, "
                         "its results directory has everything")

    def step(self, step: int, metrics: dict | None = None, eval_row: dict | None = None,
             rank_rows: list[dict] | None = None, alarms: Iterable = ()) -> None:
        """What one training step wrote: its metrics row (step = the step's 0-based index), the
        evaluation row (step = steps completed), its probes' rank rows and its alarm events."""
        if eval_row is not None:
            self._each("scalars", eval_row["step"], {"eval/accuracy": float(eval_row["accuracy"])})
        values = scalars("train", metrics or {})
        values.update(rank_curves(rank_rows or [], self.rank_series))
        alarms = list(alarms)
        values.update({f"alarm/{event.alarm}": float(event.value) for event in alarms})
        if values:
            self._each("scalars", step, values)
        for event in alarms:
            self._each("text", step, f"alarm/{event.alarm}", event.message)

    def figures(self, paths: list[Path]) -> None:
        if paths:
            self._each("figures", paths)

    def close(self, status: str) -> None:
        self._each("close", status)
        self.backends = []


def open_trackers(logger_cfg, identity: RunIdentity, log: Callable[[str], None] = print) -> Trackers:
    """The trackers `logger_cfg` turns on, each started for this run; one that cannot start is
    left out with a warning."""
    starters = {
        "tensorboard": lambda: _tensorboard(logger_cfg, identity),
        "wandb": lambda: _wandb(logger_cfg, identity),
        "mlflow": lambda: _mlflow(logger_cfg, identity),
    }
    backends = []
    for name, start in starters.items():
        if not logger_cfg.get(name, False):
            continue
        try:
            backends.append(start())
            log(f"tracker {name}: {backends[-1].where}")
        except Exception as error:  # noqa: BLE001 - missing package, no network, bad key
            log(f"WARNING tracker {name} not started ({type(error).__name__}: "
                f"{str(error).splitlines()[0] if str(error) else ''}); the run goes on without it")
    return Trackers(backends, list(logger_cfg.get("rank_series", [])), log)


# A run directory is <results_dir>/<experiment>/<run>: the defaults below sit beside it.
def _tensorboard(cfg, identity: RunIdentity):
    from grpo_cli.trackers.tensorboard_backend import TensorBoardBackend

    root = Path(cfg.log_dir) if cfg.get("log_dir") else identity.run_dir.parent / "tensorboard"
    return TensorBoardBackend(root / identity.name, identity)


def _wandb(cfg, identity: RunIdentity):
    from grpo_cli.trackers.wandb_backend import WandbBackend

    return WandbBackend(identity, project=cfg.project, entity=cfg.get("entity"))


def _mlflow(cfg, identity: RunIdentity):
    from grpo_cli.trackers.mlflow_backend import MlflowBackend

    uri = (cfg.get("tracking_uri") or os.environ.get("MLFLOW_TRACKING_URI")
           or (identity.run_dir.parent.parent / "mlruns").resolve().as_uri())
    return MlflowBackend(identity, tracking_uri=uri, experiment_name=cfg.project)
