"""The Hydra application behind `grpo run`: compose, then train one run per job.

`grpo run [-m] OVERRIDES...` hands its arguments to `main()` unchanged, so every Hydra feature
(multirun sweeps, launcher plugins such as joblib or submitit, `--cfg job`) works as documented.
Run directories are named `R<group size>-<estimator>-s<seed>` plus any other overridden key, so
re-running the same command resumes the same directories.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import logging
import os
import re
from pathlib import Path
from typing import Any

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.experimental.callback import Callback
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf

from grpo_cli.config.schema import register_configs

log = logging.getLogger("grpo")


def conf_dir() -> Path:
    """The `conf/` directory: $GRPO_CONF_DIR, else the repository's top-level conf/."""
    return Path(os.environ.get("GRPO_CONF_DIR", Path(__file__).resolve().parents[1] / "conf"))


MAX_RUN_NAME = 160  # file systems allow 255 bytes per path component


def run_name(group_size: int, estimator: str, seed: int, other_overrides: str = "") -> str:
    """Directory name of a run; other overridden keys are appended so runs never collide.

    Long override lists (paths, say) are cut and end in a hash of the full list, so the name
    stays unique and within file-system limits.
    """
    name = f"R{group_size}-{estimator}-s{seed}"
    if other_overrides:
        name += "-" + re.sub(r"[^A-Za-z0-9_.=,+-]", "_", other_overrides)
    if len(name) > MAX_RUN_NAME:
        digest = hashlib.sha256(other_overrides.encode()).hexdigest()[:10]
        name = f"{name[: MAX_RUN_NAME - 11]}~{digest}"
    return name


def register_resolvers() -> None:
    if not OmegaConf.has_resolver("grpo_run_name"):
        OmegaConf.register_new_resolver("grpo_run_name", run_name)
    if not OmegaConf.has_resolver("grpo_conf"):  # ${grpo_conf:model/x.json}: a file shipped in conf/
        OmegaConf.register_new_resolver("grpo_conf", lambda relative: str(conf_dir() / relative))


class SweepSummary(Callback):
    """After a sweep, list each member's status (failed members do not stop the others)."""

    failed: list[str] = []

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        self.started = dt.datetime.now(dt.UTC).isoformat(timespec="seconds")

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        sweep_dir = Path(config.hydra.sweep.dir)
        rows = []
        for path in sorted(sweep_dir.glob("*/run.json")):
            record = json.loads(path.read_text())
            if (record.get("ended_at") or "") >= getattr(self, "started", ""):
                rows.append((path.parent.name, record.get("status"), record.get("error")))
        SweepSummary.failed = [name for name, status, _ in rows if status != "completed"]
        for name, status, error in rows:
            log.info("%-40s %s%s", name, status, f"  ({error})" if error else "")
        if SweepSummary.failed:
            log.error("%d of %d runs failed: %s", len(SweepSummary.failed), len(rows), ", ".join(SweepSummary.failed))


def train_job(cfg: DictConfig) -> str:
    """Hydra task function: one configuration -> one run directory."""
    from grpo_cli.train.run import run_experiment

    hydra_cfg = HydraConfig.get()
    run_dir = Path(hydra_cfg.runtime.output_dir)
    try:
        return run_experiment(cfg, run_dir, log=log.info)
    except Exception as error:
        log.error("run %s failed: %s: %s", run_dir, type(error).__name__, error)
        if hydra_cfg.mode == RunMode.MULTIRUN:
            return "failed"  # recorded in run.json; the other members of the sweep still run
        raise


def main() -> None:
    register_configs()
    register_resolvers()
    hydra.main(config_path=str(conf_dir()), config_name="config", version_base="1.3")(train_job)()
