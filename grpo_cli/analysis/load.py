"""Read run directories (docs/results.md) into plain pandas tables.

A run directory is recognised by `run.json` (or, when that was never written, `config.yaml` or
`metrics.csv`); a sweep directory is any directory whose sub-directories are runs. Every file is
optional: a missing or half-written file becomes an empty table and a line in `Run.problems`, so
a sweep that is still running, or a run that crashed early, can always be analysed. A torn last
line (a number cut short by a kill) is dropped with a problem line, never read as data. Files that
contradict each other or themselves (a step twice, a step missing, probe steps without spectra)
are listed in `Run.contradictions`; `grpo analyze` leaves such runs out and says why.
"""

from __future__ import annotations

import io
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd
import yaml

from grpo_cli.algorithm.kinds import LEGACY_ESTIMATOR_FACTS
from grpo_cli.measures import RANK_MEASURES, TRAJECTORY_COLUMNS

RUN_MARKERS = ("run.json", "config.yaml", "metrics.csv")
SKIP_DIRS = {"analysis", "checkpoints", "__pycache__"}
GROUP_SIZE_KEY = "rollout.group_size"
SEED_KEY = "seed"
# run.json fields that stand in for config keys when config.yaml is missing
RUN_JSON_KEYS = {
    "group_size": GROUP_SIZE_KEY,
    "estimator": "algorithm.name",
    "seed": SEED_KEY,
    "model": "model.name",
    "task": "task.name",
}
EMPTY_COLUMNS = {
    "metrics.csv": ["step", "reward_mean"],
    "eval.csv": ["step", "accuracy", "n", "greedy"],
    "ranks.csv": ["step", "matrix", "layer", "group"],
    "events.csv": ["step", "alarm", "value", "message"],
}


@dataclass
class Run:
    """One run directory, its status and its tables (empty when a file is missing)."""

    path: Path
    status: str  # completed | failed | incomplete (run.json says running, or is missing)
    error: str | None  # run.json `error` for failed runs
    info: dict[str, Any]  # run.json as written
    config: dict[str, Any]  # config.yaml flattened to dotted keys, lists as tuples
    metrics: pd.DataFrame  # metrics.csv, one row per optimizer step
    evals: pd.DataFrame  # eval.csv
    ranks: pd.DataFrame  # ranks.csv, `layer`/`group` as strings ("" when empty)
    events: pd.DataFrame  # events.csv (training-health alarms)
    spectra_path: Path | None  # spectra.parquet, read lazily (it can be large)
    problems: list[str] = field(default_factory=list)  # missing or unreadable files
    contradictions: list[str] = field(default_factory=list)  # repeated or missing steps
    variant: str = ""  # label of the non-R, non-seed config keys (set by grouping)

    @property
    def name(self) -> str:
        return self.path.name

    @property
    def group_size(self) -> int | None:
        value = self.config.get(GROUP_SIZE_KEY)
        return None if value is None else int(value)

    @property
    def seed(self) -> int | None:
        value = self.config.get(SEED_KEY)
        return None if value is None else int(value)

    @property
    def experiment(self) -> str:
        return str(self.config.get("experiment.name") or self.path.parent.name)

    @property
    def rehearsal(self) -> bool:
        """Random weights or coin-flip rewards (`experiment=paper_rehearsal`): not evidence."""
        return bool(
            self.info.get("rehearsal")
            or self.config.get("model.weights") == "random"
            or self.config.get("task.reward") == "random"
        )

    @property
    def estimator_facts(self) -> dict[str, Any]:
        """What the run's estimator is (name, credit, zero_sum_group): run.json's
        `estimator_facts` as the run recorded them; for directories written before that key, the
        frozen table of grpo_cli/algorithm/kinds.py; "unknown" credit when neither knows it."""
        recorded = self.info.get("estimator_facts")
        if isinstance(recorded, dict) and {"name", "credit", "zero_sum_group"} <= set(recorded):
            return dict(recorded)
        name = self.config.get("algorithm.name")
        legacy = LEGACY_ESTIMATOR_FACTS.get(name)
        if legacy is not None:
            return dict(legacy)
        return {"name": name, "credit": "unknown", "zero_sum_group": False}

    @property
    def initial_model(self) -> dict[str, Any]:
        """The weights the run's RL started from (run.json `initial_model`: `kind` warm_start,
        pretrained, random or checkpoint, and `shared`: one model for every run seed). Results
        written before that key: a `grpo probe` directory shares its checkpoint; a char_llama run
        one warm start shared by every seed (the old design: `WARM_START_SEED = 0`); any other
        run one pretrained model. `legacy` says the record was inferred."""
        recorded = self.info.get("initial_model")
        if isinstance(recorded, dict) and isinstance(recorded.get("shared"), bool) and "kind" in recorded:
            return {**recorded, "legacy": False}
        if self.info.get("kind") == "probe":
            source = (self.info.get("probe") or {}).get("source", "")
            return {"kind": "checkpoint", "path": str(source), "shared": True, "legacy": True}
        if self.config.get("model.source", "char_llama") == "char_llama":
            return {"kind": "warm_start", "key": "", "seed": 0, "shared": True, "legacy": True}
        return {"kind": "pretrained", "source": self.config.get("model.source"),
                "path": str(self.config.get("model.path") or self.config.get("model.name") or ""),
                "shared": True, "legacy": True}

    @property
    def last_step(self) -> int | None:
        steps = [t["step"].max() for t in (self.metrics, self.ranks) if len(t)]
        if self.info.get("last_step") is not None:
            steps.append(self.info["last_step"])
        steps = [s for s in steps if pd.notna(s)]
        return int(max(steps)) if steps else None


def is_run_dir(path: Path) -> bool:
    return path.is_dir() and any((path / marker).is_file() for marker in RUN_MARKERS)


def find_run_dirs(path: Path, depth: int = 3) -> list[Path]:
    """Run directories at or below `path` (a run, a sweep, or a results root), sorted."""
    path = Path(path)
    if is_run_dir(path):
        return [path]
    if depth == 0 or not path.is_dir():
        return []
    found: list[Path] = []
    for child in sorted(path.iterdir()):
        if child.is_dir() and not child.name.startswith(".") and child.name not in SKIP_DIRS:
            found.extend(find_run_dirs(child, depth - 1))
    return found


def flatten(tree: Any, prefix: str = "") -> dict[str, Any]:
    """Nested dict -> {"a.b.c": value}; lists become tuples so that values are hashable."""
    if isinstance(tree, dict):
        flat: dict[str, Any] = {}
        for key, value in tree.items():
            flat.update(flatten(value, f"{prefix}{key}."))
        return flat
    if isinstance(tree, list):
        tree = tuple(tree)
    return {prefix[:-1]: tree}


def _read_csv(path: Path, problems: list[str]) -> tuple[pd.DataFrame, list[int]]:
    """(the table, the file line of each of its rows). The lines are kept beside the table, not
    in its `attrs`: pandas deep-copies `attrs` into every frame derived from it, which for a
    list of one int a row took half of `grpo analyze`'s time."""
    empty = pd.DataFrame(columns=EMPTY_COLUMNS.get(path.name, ["step"])), []
    if not path.is_file():
        problems.append(f"{path.name} missing")
        return empty
    try:
        data = path.read_bytes()
        if data and not data.endswith(b"\n"):  # a run killed mid-write: the last line is torn
            data = data[: data.rfind(b"\n") + 1]
            problems.append(f"{path.name}: torn last line dropped")
        table = pd.read_csv(io.BytesIO(data), on_bad_lines="skip", dtype={"layer": str, "group": str})
    except pd.errors.EmptyDataError:
        return empty
    except (OSError, ValueError, pd.errors.ParserError) as err:
        problems.append(f"{path.name} unreadable ({err})")
        return empty
    if "step" in table:
        steps = pd.to_numeric(table["step"], errors="coerce")
        bad = steps.isna() | steps.isin([math.inf, -math.inf])
        for index in bad[bad & table["step"].notna()].index[:3]:
            problems.append(f"{path.name} line {index + 2}, column step: {str(table['step'][index])!r} "
                            "is not a number (row left out)")
        table = table.assign(step=steps)[~bad].astype({"step": int})
    for column in ("layer", "group"):
        if column in table:
            table[column] = table[column].fillna("").astype(str)
    lines = (table.index + 2).tolist()  # file line of each row kept (line 1 is the header)
    return table.reset_index(drop=True), lines


def line_number(lines: list[int] | None, index: int) -> int:
    """The file line row `index` of `_read_csv`'s table was read from, given its `lines` (rows
    left out shift the index)."""
    return lines[index] if lines is not None and index < len(lines) else index + 2


def non_numeric_cells(table: pd.DataFrame, filename: str, columns, limit: int = 3,
                      lines: list[int] | None = None) -> list[str]:
    """One line per cell of `columns` that is neither empty nor a number (file, line, column);
    such cells are read as missing, so they are reported rather than silently dropped."""
    found = []
    for column in [c for c in columns if c in table]:
        values = table[column]
        if pd.api.types.is_numeric_dtype(values):
            continue
        bad = values.notna() & pd.to_numeric(values, errors="coerce").isna()
        bad &= values.astype(str).str.strip().ne("")
        for index in bad[bad].index:
            found.append(f"{filename} line {line_number(lines, index)}, column {column}: "
                         f"{str(values[index])!r} is not a number (left out)")
    if len(found) > limit:
        found = found[:limit] + [f"{filename}: {len(found) - limit} more non-numeric cells"]
    return found


def non_finite_cells(table: pd.DataFrame, filename: str, columns, limit: int = 3,
                     lines: list[int] | None = None) -> list[str]:
    """Set every infinite cell of `columns` to NaN (missing), with one line per cell (file, line,
    column): a rank or spectrum measure is a finite number, and an infinite one would stretch
    every axis and mean it touches."""
    found = []
    for column in [c for c in columns if c in table]:
        values = pd.to_numeric(table[column], errors="coerce")
        infinite = values.isin([math.inf, -math.inf])
        for index in infinite[infinite].index:
            found.append(f"{filename} line {line_number(lines, index)}, column {column}: {values[index]} is not a "
                         "number (infinite; left out)")
        if infinite.any():
            table[column] = values.mask(infinite)
    if len(found) > limit:
        found = found[:limit] + [f"{filename}: {len(found) - limit} more infinite cells"]
    return found


def missing_cells(table: pd.DataFrame, filename: str, columns) -> list[str]:
    """One line per column of `columns` that some rows leave empty (NaN) and others fill: a
    measure grpo computed for every row, so a hole means a damaged or hand-edited file (a column
    empty throughout is a measure not recorded, and says nothing)."""
    found = []
    for column in [c for c in columns if c in table]:
        empty = int(pd.to_numeric(table[column], errors="coerce").isna().sum())
        if 0 < empty < len(table):
            found.append(f"{filename}, column {column}: {empty} of {len(table)} values empty "
                         "(NaN; left out of every mean)")
    return found


def _read_yaml(path: Path, problems: list[str]) -> dict[str, Any]:
    if not path.is_file():
        problems.append(f"{path.name} missing")
        return {}
    try:
        tree = yaml.safe_load(path.read_text()) or {}
    except (OSError, yaml.YAMLError) as err:
        problems.append(f"{path.name} unreadable ({err})")
        return {}
    return flatten(tree) if isinstance(tree, dict) else {}


def _read_json(path: Path, problems: list[str]) -> dict[str, Any]:
    if not path.is_file():
        problems.append(f"{path.name} missing")
        return {}
    try:
        info = json.loads(path.read_text())
    except (OSError, ValueError) as err:
        problems.append(f"{path.name} unreadable ({err})")
        return {}
    return info if isinstance(info, dict) else {}


RUN_JSON_INTEGERS = ("last_step", "checkpoint_step", "resumed_from", "group_size", "seed")


def integer_fields(info: dict[str, Any], problems: list[str]) -> dict[str, Any]:
    """run.json with each of RUN_JSON_INTEGERS that is not a whole number left out, and a
    problem line naming it (a hand-edited or foreign file: `"last_step": "nine"`)."""
    kept = dict(info)
    for key in RUN_JSON_INTEGERS:
        value = kept.get(key)
        if value is None or (isinstance(value, int) and not isinstance(value, bool)):
            continue
        del kept[key]
        problems.append(f"run.json, field {key}: {value!r} is not a number (left out)")
    return kept


def load_run(path: Path) -> Run:
    """Read one run directory; never raises for missing or partial files."""
    path = Path(path)
    problems: list[str] = []
    info = integer_fields(_read_json(path / "run.json", problems), problems)
    config = _read_yaml(path / "config.yaml", problems)
    for info_key, config_key in RUN_JSON_KEYS.items():
        if config.get(config_key) is None and info.get(info_key) is not None:
            config[config_key] = info[info_key]
    raw_status = info.get("status")
    status = raw_status if raw_status in ("completed", "failed") else "incomplete"
    spectra = path / "spectra.parquet"
    if not spectra.is_file():
        problems.append("spectra.parquet missing")
    ranks, rank_lines = _read_csv(path / "ranks.csv", problems)
    problems += non_numeric_cells(ranks, "ranks.csv", RANK_MEASURES, lines=rank_lines)
    problems += non_finite_cells(ranks, "ranks.csv", RANK_MEASURES, lines=rank_lines)
    problems += missing_cells(ranks, "ranks.csv", RANK_MEASURES)
    run = Run(
        path=path,
        status=status,
        error=info.get("error") if status == "failed" else None,
        info=info,
        config=config,
        metrics=_finite_metrics(_read_csv(path / "metrics.csv", problems), problems),
        evals=_read_csv(path / "eval.csv", problems)[0],
        ranks=ranks,
        events=_read_csv(path / "events.csv", problems)[0],
        spectra_path=spectra if spectra.is_file() else None,
        problems=problems,
    )
    run.contradictions = find_contradictions(run)
    return run


def _finite_metrics(read: tuple[pd.DataFrame, list[int]], problems: list[str]) -> pd.DataFrame:
    """metrics.csv with every infinite cell read as missing, one line per cell (non_finite_cells)."""
    table, lines = read
    problems += non_finite_cells(table, "metrics.csv", [c for c in table.columns if c != "step"], lines=lines)
    return table


def _repeated(steps: pd.Series) -> list[int]:
    return sorted({int(s) for s in steps[steps.duplicated()]})


def find_contradictions(run: Run) -> list[str]:
    """Ways a run's files contradict themselves: what two writers into one directory leave."""
    found = []
    steps = run.metrics["step"] if "step" in run.metrics else pd.Series(dtype=int)
    if len(steps):
        if repeated := _repeated(steps):
            found.append(f"metrics.csv repeats steps {repeated}")
        elif not steps.is_monotonic_increasing:
            found.append("metrics.csv steps are out of order")
        missing = sorted(set(range(int(steps.max()) + 1)) - {int(s) for s in steps})
        if missing and run.info.get("kind") != "probe":  # `grpo probe`: the checkpoints' steps
            found.append(f"metrics.csv misses steps {missing}")
    elif run.status == "completed" and run.last_step is not None:  # 0 bytes, or a header alone
        found.append(f"metrics.csv has no rows, though run.json says completed at step {run.last_step}")
    every = run.config.get("probes.every")
    probed = isinstance(every, int) and every > 0 and run.config.get("probes.enabled") is not False
    if (run.status == "completed" and probed and not len(run.ranks) and (run.path / "ranks.csv").is_file()
            and not any(p.startswith("ranks.csv unreadable") for p in run.problems)):
        found.append("ranks.csv has no rows (0 bytes or a header alone), though the run probed "
                     f"every {run.config.get('probes.every')} steps")
    if len(run.evals) and (repeated := _repeated(run.evals["step"])):
        found.append(f"eval.csv repeats steps {repeated}")
    if len(run.ranks):
        keys = [c for c in ("step", "matrix", "layer", "group") if c in run.ranks]
        repeated = run.ranks[run.ranks.duplicated(keys)]
        if len(repeated):
            found.append(f"ranks.csv repeats rows of steps {sorted(set(repeated['step'].tolist()))}")
        if run.spectra_path is not None:
            probed = set(run.ranks["step"].tolist()) - set(spectra_steps(run))
            if run.status == "incomplete":  # a live run writes ranks.csv just before spectra
                probed.discard(int(run.ranks["step"].max()))
            unreadable = [p for p in run.problems if p.startswith("spectra.parquet unreadable")]
            if unreadable:  # cut short, or another file's schema: said as such, not as lacking steps
                found.append(unreadable[0])
            elif probed:
                found.append(f"spectra.parquet lacks probe steps {sorted(probed)} of ranks.csv")
    return found


class NoRunsFound(FileNotFoundError):
    """A path given to analyse does not exist, or holds no run directory."""


def load_runs(paths: list[Path]) -> list[Run]:
    """Every run under `paths` (runs or sweeps), each directory once, in path order."""
    seen: set[Path] = set()
    runs: list[Run] = []
    for path in paths:
        if not Path(path).exists():
            raise NoRunsFound(f"no such directory: {path}")
        for run_dir in find_run_dirs(Path(path)):
            if run_dir.resolve() not in seen:
                seen.add(run_dir.resolve())
                runs.append(load_run(run_dir))
    if not runs:
        raise NoRunsFound(
            f"no run directories (containing {', '.join(RUN_MARKERS)}) under: "
            + ", ".join(str(p) for p in paths)
        )
    return runs


def read_spectra(run: Run, steps: list[int] | None = None) -> pd.DataFrame:
    """spectra.parquet rows (optionally only `steps`); empty table if absent or unreadable."""
    columns = ["step", "matrix", "layer", "group", "k", "sigma"]
    if run.spectra_path is None:
        return pd.DataFrame(columns=columns)
    try:
        filters = [("step", "in", [int(s) for s in steps])] if steps is not None else None
        table = pd.read_parquet(run.spectra_path, filters=filters)
    except Exception as err:  # a parquet file still being written (or cut short) raises many types
        detail = str(err).splitlines()[0][:160] if str(err) else ""
        _note(run, f"spectra.parquet unreadable ({type(err).__name__}: {detail})")
        return pd.DataFrame(columns=columns)
    if lacking := [column for column in columns if column not in table]:  # another file's schema
        _note(run, f"spectra.parquet lacks columns {lacking} (not a grpo spectra file; left out)")
        return pd.DataFrame(columns=columns)
    for column in ("layer", "group"):
        table[column] = table[column].fillna("").astype(str)
    sigma = pd.to_numeric(table["sigma"], errors="coerce")
    bad = sigma.isna() | sigma.isin([math.inf, -math.inf]) | (sigma < 0)  # a singular value is >= 0
    if bad.any():
        _note(run, f"spectra.parquet: {int(bad.sum())} singular values NaN, infinite or negative (left out)")
        table = table[~bad].reset_index(drop=True)
    return table


def read_trajectory(run: Run) -> pd.DataFrame:
    """trajectory.csv (`grpo trajectory`), numbers as numbers; empty if absent, unreadable or of
    another schema (noted in run.problems)."""
    path = run.path / "trajectory.csv"
    if not path.is_file():
        return pd.DataFrame(columns=list(TRAJECTORY_COLUMNS))
    table, _ = _read_csv(path, run.problems)
    if table.empty:
        return pd.DataFrame(columns=list(TRAJECTORY_COLUMNS))
    if lacking := [column for column in TRAJECTORY_COLUMNS if column not in table]:
        _note(run, f"trajectory.csv lacks columns {lacking} (left out)")
        return pd.DataFrame(columns=list(TRAJECTORY_COLUMNS))
    numbers = [column for column in TRAJECTORY_COLUMNS if column != "layer"]
    table[numbers] = table[numbers].apply(pd.to_numeric, errors="coerce")
    return table.dropna(subset=["step"])


def _note(run: Run, problem: str) -> None:
    """A problem of `run`'s files, once however often the file is read."""
    if problem not in run.problems:
        run.problems.append(problem)


def spectra_steps(run: Run) -> list[int]:
    """Probe steps present in a run's spectra.parquet."""
    if run.spectra_path is None:
        return []
    try:
        steps = pd.read_parquet(run.spectra_path, columns=["step"])["step"]
    except Exception as err:  # noqa: BLE001 - cut short, or no step column: named by find_contradictions
        detail = str(err).splitlines()[0][:160] if str(err) else ""
        _note(run, f"spectra.parquet unreadable ({type(err).__name__}: {detail})")
        return []
    return sorted(int(s) for s in steps.unique())
