"""The Hydra application behind `grpo run`: compose, then train one run per job.

`grpo run [-m] OVERRIDES...` hands its arguments to `main()` unchanged, so every Hydra feature
(multirun sweeps, launcher plugins such as joblib or submitit, `--cfg job`) works as documented.
Run directories are named `R<group size>-<estimator>-s<seed>` plus any other overridden key, so
re-running the same command resumes the same directories.
"""

from __future__ import annotations

import copy
import json
import logging
import os
import sys
from pathlib import Path
from typing import Any

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.experimental.callback import Callback
from hydra.types import RunMode
from omegaconf import DictConfig, open_dict, read_write

from grpo_cli.config.errors import ConfigError, InputError, RunStopped, debug, unknown_key_hint
from grpo_cli.config.resolvers import conf_dir, register_resolvers
from grpo_cli.config.schema import register_configs
from grpo_cli.results.lock import RunLockedError, check_free
from grpo_cli.results.rows import utc_now

log = logging.getLogger("grpo")


REFUSALS = (ConfigError, RunLockedError)  # answered with one line and no traceback
MEMBERS_LOG = ".members.jsonl"  # how each sweep member ended, for the sweep's summary


def refusal_line(error: Exception) -> str:
    kind = "config error" if isinstance(error, ConfigError) else "refused"
    return "\n".join(f"{kind}: {line}" for line in str(error).splitlines())


def job_config(config: DictConfig) -> DictConfig:
    """The task's config (Hydra's node removed), as the task function receives it."""
    task_cfg = copy.deepcopy(config)
    with read_write(task_cfg), open_dict(task_cfg):
        del task_cfg["hydra"]
    return task_cfg


def check_under_results(directory: Path, config: DictConfig, key: str) -> None:
    """ConfigError naming `key` unless `directory` lies under results_dir: nothing is written
    outside it (a `hydra.run.dir=/elsewhere` was once honoured)."""
    root, where = (Path(os.path.abspath(str(path))) for path in (config.results_dir, directory))
    if not where.is_relative_to(root):
        raise ConfigError(f"{key}={directory}: must be under results_dir={config.results_dir} "
                          "(grpo run writes nothing outside results_dir)")


def check_writable(directory: Path) -> None:
    """ConfigError naming `results_dir` unless files can be created in `directory`."""
    try:
        directory.mkdir(parents=True, exist_ok=True)
        probe = directory / f".write-test-{os.getpid()}"
        probe.touch()
        probe.unlink()
    except OSError as error:
        raise ConfigError(
            f"results_dir: cannot write to {directory} ({error.strerror or error}); "
            "choose another results_dir"
        ) from None


class SweepSummary(Callback):
    """Refuse a bad single run before Hydra creates anything; after a sweep, list each member's
    status (failed or refused members do not stop the others)."""

    failed: list[str] = []
    refused: list[str] = []  # sweep members refused by a value check or another run's lock
    composed = False  # Hydra composed the config (a SystemExit(1) before that is a config error)

    def on_run_start(self, config: DictConfig, **kwargs: Any) -> None:
        from grpo_cli.train.resume_guard import check_resume
        from grpo_cli.validate import validate_config

        SweepSummary.composed = True
        try:
            validate_config(job_config(config))
            HydraConfig.instance().set_config(config)
            run_dir = Path(str(config.hydra.run.dir))
            check_under_results(run_dir, config, "hydra.run.dir")
            check_free(run_dir)
            check_resume(job_config(config), run_dir, log.info)  # before .hydra/ and run.log
            check_writable(run_dir)
        except REFUSALS as error:
            _refuse_now(error)

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        SweepSummary.composed = True
        self.started = utc_now()
        try:
            HydraConfig.instance().set_config(config)
            problems = sweep_problems(config)  # first: experiment.name=../.. must not be written to
            if problems:
                raise ConfigError("\n".join(problems))
            check_under_results(Path(str(config.hydra.sweep.dir)), config, "hydra.sweep.dir")
            check_writable(Path(str(config.hydra.sweep.dir)))
        except REFUSALS as error:
            _refuse_now(error)

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        sweep_dir = Path(config.hydra.sweep.dir)
        try:
            rows = sweep_rows(sweep_dir, getattr(self, "started", ""))
        except Exception as error:  # noqa: BLE001 - Hydra would turn it into a warning and exit 0
            log.error("sweep summary of %s failed: %s: %s", sweep_dir, type(error).__name__, error)
            SweepSummary.failed = [f"(summary of {sweep_dir})"]
            return
        SweepSummary.failed = [n for n, status, _ in rows if status not in ("completed", "refused")]
        SweepSummary.refused = [name for name, status, _ in rows if status == "refused"]
        unfinished = [name for name, status, _ in rows if status != "completed"]
        for name, status, error in rows:
            log.info("%-40s %s%s", name, status, f"  ({error})" if error else "")
        if unfinished:
            log.error("%d of %d runs did not complete: %s", len(unfinished), len(rows), ", ".join(unfinished))
        log.info("results: %s", sweep_dir)


def record_member(sweep_dir: Path, run: str, status: str, error: str | None = None) -> None:
    """One line in the sweep's member log: how a member ended, for the sweep's summary (members
    may run in other processes, and run.json may be missing, as for a refused member)."""
    entry = {"run": run, "status": status, "error": error, "at": utc_now()}
    with open(sweep_dir / MEMBERS_LOG, "a") as handle:
        handle.write(json.dumps(entry) + "\n")


def sweep_rows(sweep_dir: Path, started: str) -> list[tuple[str, str, str | None]]:
    """(run, status, error) of each member of the sweep that began at `started`: each run.json
    written since `started`, then the members that logged how they ended (MEMBERS_LOG) but left
    no such run.json (refused, or skipped as already completed). A run.json that cannot be read
    is a row saying so and counts as not completed; older files of the directory are not read."""
    rows: dict[str, tuple[str, str, str | None]] = {}
    for path in sorted(sweep_dir.glob("*/run.json")):
        name = path.parent.name
        try:
            if utc_from_mtime(path) < started:
                continue
            record = json.loads(path.read_text())
            rows[name] = (name, str(record.get("status")), record.get("error"))
        except (OSError, ValueError, AttributeError) as error:  # AttributeError: not an object
            rows[name] = (name, "unreadable", f"{path}: {type(error).__name__}: {error}")
    members = sweep_dir / MEMBERS_LOG
    if members.exists():
        for line in members.read_text(errors="replace").splitlines():
            try:
                entry = json.loads(line)
                if entry["at"] >= started and entry["run"] not in rows:
                    rows[entry["run"]] = (entry["run"], entry["status"], entry.get("error"))
            except (ValueError, KeyError, TypeError):  # a line torn by a killed member
                continue
        members.unlink()
    return list(rows.values())


def utc_from_mtime(path: Path) -> str:
    """A file's modification time in utc_now()'s format (they compare as strings)."""
    from datetime import UTC, datetime

    return datetime.fromtimestamp(path.stat().st_mtime, tz=UTC).isoformat(timespec="seconds")


class OneGpuPerJob(Callback):
    """`hydra/launcher=local_gpus`: each sweep member narrows CUDA_VISIBLE_DEVICES to one GPU of
    those it inherits, claimed for its lifetime (grpo_cli/runtime/gpu_slots.py)."""

    def on_job_start(self, config: DictConfig, **kwargs: Any) -> None:
        from grpo_cli.runtime.gpu_slots import DeviceSlot, visible_devices

        self._inherited = os.environ.get("CUDA_VISIBLE_DEVICES")
        devices = visible_devices(self._inherited)
        self._slot = None
        if not devices:
            log.info("one GPU per job: no visible GPU (CUDA_VISIBLE_DEVICES=%r)", self._inherited)
            return
        member = int(config.hydra.job.get("num") or 0)
        self._slot = DeviceSlot(devices, Path(str(config.hydra.sweep.dir)) / ".devices", first=member)
        os.environ["CUDA_VISIBLE_DEVICES"] = self._slot.acquire()
        log.info("CUDA_VISIBLE_DEVICES=%s (sweep member %d; this node's GPUs: %s)",
                 os.environ["CUDA_VISIBLE_DEVICES"], member, ",".join(devices))

    def on_job_end(self, config: DictConfig, job_return: Any = None, **kwargs: Any) -> None:
        if getattr(self, "_slot", None) is None:
            return
        self._slot.release()
        os.environ["CUDA_VISIBLE_DEVICES"] = self._inherited


def sweep_problems(config: DictConfig) -> list[str]:
    """Value problems of every member of a sweep, composed up front, so that no member trains
    while another is doomed; and members that would share one run directory (a swept key that
    run names leave out, such as `threads=1,2`: only the last member's results would remain).
    Sweep syntax the basic sweeper does not expand (a plugin sweeper's ranges) is left to the
    per-job check in `train_job`."""
    from hydra import compose
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
    from hydra.core.override_parser.overrides_parser import OverridesParser

    from grpo_cli.train.resume_guard import resume_conflict
    from grpo_cli.validate import config_problems

    try:
        parsed = OverridesParser.create().parse_overrides(list(config.hydra.overrides.task))
        members = BasicSweeper.split_arguments(parsed, max_batch_size=None)[0]
    except Exception:  # noqa: BLE001 - not a basic sweep: members are checked as they start
        return []
    problems: dict[str, None] = {}  # ordered, each line once however many members share it
    directories: dict[Path, list[list[str]]] = {}  # run directory -> the members that write it
    for member in members:
        try:
            cfg = compose(config_name=config.hydra.job.config_name, overrides=member,
                          return_hydra_config=True)
        except Exception as error:  # noqa: BLE001 - a composition error names its key
            problems[composition_error_line(error)] = None
            continue
        found = config_problems(cfg)
        if not found and cfg.resume_mismatch != "allow":  # a member that would mix two configs
            found = [line for line in [resume_conflict(job_config(cfg), member_run_dir(cfg))] if line]
        problems.update(dict.fromkeys(found))
        if not found:
            directories.setdefault(member_run_dir(cfg), []).append(list(member))
    for directory, sharing in directories.items():
        if len(sharing) > 1:
            problems[shared_directory_problem(directory, sharing)] = None
    return list(problems)


def member_run_dir(cfg: DictConfig) -> Path:
    """Where a composed sweep member writes: hydra.sweep.dir / hydra.sweep.subdir of config.yaml."""
    from grpo_cli.config.resolvers import run_name

    name = run_name(cfg.rollout.group_size, cfg.algorithm.name, cfg.seed, cfg.hydra.job.override_dirname)
    return Path(str(cfg.results_dir)) / str(cfg.experiment.name) / name


def shared_directory_problem(directory: Path, sharing: list[list[str]]) -> str:
    """One line naming the swept keys that run names leave out."""
    values: dict[str, set[str]] = {}
    for member in sharing:
        for override in member:
            key, _, value = override.partition("=")
            values.setdefault(key, set()).add(value)
    keys = [key for key, seen in values.items() if len(seen) > 1]
    if not keys:
        return (f"{len(sharing)} sweep members have the same settings and would share one run "
                f"directory ({directory}); list each value once")
    return (f"{', '.join(keys)}: {len(sharing)} sweep members would share one run directory "
            f"({directory}), since run names leave {' and '.join(keys)} out (settings that do not "
            "change results: hydra.job.config.override_dirname.exclude_keys in conf/config.yaml); "
            "run each value as its own command with its own experiment.name")


def composition_error_line(error: Exception) -> str:
    """Hydra's composition error in one line: 'Error merging override rollout.group_size=abc:
    Value 'abc' of type 'str' could not be converted to Integer' (its full_key, reference_type
    and object_type lines left out: the override names the key)."""
    lines = [line.strip() for line in f"{error}\n{error.__cause__ or ''}".splitlines()]
    hint = unknown_key_hint(error)  # replaces Hydra's "use +key=value" (the schema refuses it)
    text, listing = "", False  # listing: the lines after "Available options in 'experiment':"
    for line in dict.fromkeys(lines + ([hint] if hint else [])):
        if line.startswith("Config search path"):
            break
        if not line or line.startswith(("full_key:", "reference_type", "object_type")):
            continue
        if hint and line.startswith("To append to your config use"):
            continue
        if listing or text.endswith(":"):
            text += (", " if listing else " ") + line
            listing = True
        else:
            text = f"{text.rstrip('.')}: {line}" if text else line  # Hydra's "Could not override 'x'."
    return text or type(error).__name__


def check_composes(args: list[str]) -> None:
    """ConfigError in one line unless a single run's overrides compose (exit 2 where Hydra would
    print its multi-line error and exit 1). Only plain key=value overrides are checked here;
    anything else (flags, sweeps) is left to Hydra, and cli.run maps its exit 1 to 2."""
    if not args or any(arg.startswith("-") or "=" not in arg for arg in args):
        return
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    from grpo_cli.config.compose import compose_config

    try:
        compose_config(args)
    except (HydraException, OmegaConfBaseException, ValueError) as error:
        raise ConfigError(composition_error_line(error)) from error


def _refuse_now(error: Exception) -> None:
    """Before Hydra has set up logging or created anything: one line on stderr, exit 2."""
    if debug():
        raise error
    print(refusal_line(error), file=sys.stderr)
    raise SystemExit(2) from None


def train_job(cfg: DictConfig) -> str:
    """Hydra task function: one configuration -> one run directory. A sweep member logs how it
    ended (record_member) for the sweep's summary, and never stops the other members."""
    from grpo_cli.train.run import run_experiment
    from grpo_cli.validate import validate_config

    hydra_cfg = HydraConfig.get()
    run_dir = Path(hydra_cfg.runtime.output_dir)
    multirun = hydra_cfg.mode == RunMode.MULTIRUN
    try:
        validate_config(cfg)
        status = run_experiment(cfg, run_dir, log=log.info)
    except REFUSALS as error:
        if debug():
            raise
        log.error("%s", refusal_line(error))
        if multirun:  # the sweep goes on; its summary lists this run
            record_member(Path(hydra_cfg.sweep.dir), run_dir.name, "refused", str(error).replace("\n", "; "))
            return "refused"
        raise SystemExit(2) from None
    except Exception as error:
        log.error("run %s failed: %s: %s", run_dir, type(error).__name__, error)
        if multirun:  # recorded in run.json; the other members of the sweep still run
            record_member(Path(hydra_cfg.sweep.dir), run_dir.name, "failed", f"{type(error).__name__}: {error}")
            return "failed"
        if isinstance(error, (InputError, RunStopped)) and not debug():
            raise SystemExit(1) from None  # the line above names the file:line or path, or the step
        raise
    if multirun:
        record_member(Path(hydra_cfg.sweep.dir), run_dir.name, status)
    return status


def main() -> None:
    register_configs()
    register_resolvers()
    hydra.main(config_path=str(conf_dir()), config_name="config", version_base="1.3")(train_job)()
