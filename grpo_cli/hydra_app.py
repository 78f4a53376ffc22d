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

from grpo_cli.config.errors import ConfigError, InputError, debug
from grpo_cli.config.resolvers import conf_dir, register_resolvers
from grpo_cli.config.schema import register_configs
from grpo_cli.results.lock import RunLockedError, check_free
from grpo_cli.results.rows import utc_now

log = logging.getLogger("grpo")


REFUSALS = (ConfigError, RunLockedError)  # answered with one line and no traceback
REFUSED_LOG = ".refused.jsonl"  # sweep members refused, for the sweep's summary


def refusal_line(error: Exception) -> str:
    kind = "config error" if isinstance(error, ConfigError) else "refused"
    return "\n".join(f"{kind}: {line}" for line in str(error).splitlines())


def job_config(config: DictConfig) -> DictConfig:
    """The task's config (Hydra's node removed), as the task function receives it."""
    task_cfg = copy.deepcopy(config)
    with read_write(task_cfg), open_dict(task_cfg):
        del task_cfg["hydra"]
    return task_cfg


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

    def on_run_start(self, config: DictConfig, **kwargs: Any) -> None:
        from grpo_cli.validate import validate_config

        try:
            validate_config(job_config(config))
            HydraConfig.instance().set_config(config)
            run_dir = Path(str(config.hydra.run.dir))
            check_free(run_dir)
            check_writable(run_dir)
        except REFUSALS as error:
            _refuse_now(error)

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        self.started = utc_now()
        try:
            HydraConfig.instance().set_config(config)
            check_writable(Path(str(config.hydra.sweep.dir)))
            problems = sweep_problems(config)
            if problems:
                raise ConfigError("\n".join(problems))
        except REFUSALS as error:
            _refuse_now(error)

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        sweep_dir = Path(config.hydra.sweep.dir)
        started = getattr(self, "started", "")
        rows = []
        for path in sorted(sweep_dir.glob("*/run.json")):
            record = json.loads(path.read_text())
            if (record.get("ended_at") or "") >= started:
                rows.append((path.parent.name, record.get("status"), record.get("error")))
        refusals = sweep_dir / REFUSED_LOG  # written by members, maybe in other processes
        if refusals.exists():
            for line in refusals.read_text().splitlines():
                entry = json.loads(line)
                if entry["at"] >= started:
                    rows.append((entry["run"], "refused", entry["error"]))
            refusals.unlink()
        SweepSummary.failed = [n for n, status, _ in rows if status not in ("completed", "refused")]
        SweepSummary.refused = [name for name, status, _ in rows if status == "refused"]
        unfinished = [name for name, status, _ in rows if status != "completed"]
        for name, status, error in rows:
            log.info("%-40s %s%s", name, status, f"  ({error})" if error else "")
        if unfinished:
            log.error("%d of %d runs did not complete: %s", len(unfinished), len(rows), ", ".join(unfinished))
        log.info("results: %s", sweep_dir)


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
    while another is doomed. Sweep syntax the basic sweeper does not expand (a plugin sweeper's
    ranges) is left to the per-job check in `train_job`."""
    from hydra import compose
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
    from hydra.core.override_parser.overrides_parser import OverridesParser

    from grpo_cli.validate import config_problems

    try:
        parsed = OverridesParser.create().parse_overrides(list(config.hydra.overrides.task))
        members = BasicSweeper.split_arguments(parsed, max_batch_size=None)[0]
    except Exception:  # noqa: BLE001 - not a basic sweep: members are checked as they start
        return []
    problems: dict[str, None] = {}  # ordered, each line once however many members share it
    for member in members:
        try:
            cfg = compose(config_name=config.hydra.job.config_name, overrides=member)
        except Exception as error:  # noqa: BLE001 - a composition error names its key
            problems[str(error).splitlines()[0]] = None
            continue
        problems.update(dict.fromkeys(config_problems(cfg)))
    return list(problems)


def _refuse_now(error: Exception) -> None:
    """Before Hydra has set up logging or created anything: one line on stderr, exit 2."""
    if debug():
        raise error
    print(refusal_line(error), file=sys.stderr)
    raise SystemExit(2) from None


def train_job(cfg: DictConfig) -> str:
    """Hydra task function: one configuration -> one run directory."""
    from grpo_cli.train.run import run_experiment
    from grpo_cli.validate import validate_config

    hydra_cfg = HydraConfig.get()
    run_dir = Path(hydra_cfg.runtime.output_dir)
    try:
        validate_config(cfg)
        return run_experiment(cfg, run_dir, log=log.info)
    except REFUSALS as error:
        if debug():
            raise
        log.error("%s", refusal_line(error))
        if hydra_cfg.mode == RunMode.MULTIRUN:  # the sweep goes on; its summary lists this run
            entry = {"run": run_dir.name, "error": str(error).replace("\n", "; "), "at": utc_now()}
            with open(Path(hydra_cfg.sweep.dir) / REFUSED_LOG, "a") as handle:
                handle.write(json.dumps(entry) + "\n")
            return "refused"
        raise SystemExit(2) from None
    except Exception as error:
        log.error("run %s failed: %s: %s", run_dir, type(error).__name__, error)
        if hydra_cfg.mode == RunMode.MULTIRUN:
            return "failed"  # recorded in run.json; the other members of the sweep still run
        if isinstance(error, InputError) and not debug():
            raise SystemExit(1) from None  # the line above names the file:line or path
        raise


def main() -> None:
    register_configs()
    register_resolvers()
    hydra.main(config_path=str(conf_dir()), config_name="config", version_base="1.3")(train_job)()
