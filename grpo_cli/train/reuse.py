"""A run that another experiment already ran is taken from there, not trained again.

`reuse_from` names experiment directories (under `results_dir`, or paths). Before a run trains,
each completed run there is compared with it: the same value of every key that changes results
(train/resume_guard.py `differences`; the experiment's name aside, which names a folder), on the
same device and under the same package versions, is the same computation (same seed, warm start,
data order, kernels and thread count), so its files are copied into this run's directory and its
run.json says where they came from (`reused_from`). `make settle` takes the 40 runs it shares with
`make reproduce-cpu` this way (conf/experiment/settle_credit.yaml); `resume=false` trains anew.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from grpo_cli.results.rows import versions
from grpo_cli.results.writer import RunResults
from grpo_cli.train.resume_guard import differences

NAMING_KEYS = ("experiment.name",)  # what differs between two experiments' copies of one run
# files of a run directory that are its own: the lock and Hydra's folder, the log this run is
# writing, and the two records rewritten for it
OWN_FILES = ("run.log", "run.json", "config.yaml")


def source_dirs(cfg: DictConfig) -> list[Path]:
    """The experiment directories `reuse_from` names, relative ones under `results_dir`."""
    root = Path(str(cfg.results_dir))
    return [path if path.is_absolute() else root / path for path in map(Path, cfg.get("reuse_from") or [])]


def same_run(composed: dict, device: str, candidate: Path) -> bool:
    """Whether `candidate` holds a completed run of the configuration `composed` on `device`
    under this process's package versions (a file that cannot be read is no match)."""
    try:
        record = json.loads((candidate / "run.json").read_text())
        if not isinstance(record, dict) or not _may_match(record, composed, device):
            return False  # read before the YAML: most candidates differ here
        stored = OmegaConf.to_container(OmegaConf.load(candidate / "config.yaml"), resolve=False)
    except Exception:  # noqa: BLE001 - unreadable, torn or not YAML: not a run to take
        return False
    if not isinstance(stored, dict):
        return False
    return all(key in NAMING_KEYS for key, _, _ in differences(stored, composed))


def _may_match(record: dict, composed: dict, device: str) -> bool:
    """run.json's part of the comparison: completed, the same seed, group size and estimator,
    device and package versions."""
    return (record.get("status") == "completed" and record.get("device") == device
            and record.get("versions") == versions() and record.get("seed") == composed.get("seed")
            and record.get("group_size") == composed.get("rollout", {}).get("group_size")
            and record.get("estimator") == composed.get("algorithm", {}).get("name"))


def find_source(cfg: DictConfig, run_dir: Path, device: str) -> Path | None:
    """The first completed run under `reuse_from` that is this run (None when there is none,
    or `resume=false` asks to train anew)."""
    folders = [folder for folder in source_dirs(cfg) if folder.is_dir()]
    if not cfg.resume or not folders:
        return None
    composed = OmegaConf.to_container(OmegaConf.create(OmegaConf.to_yaml(cfg, resolve=True)))
    here = Path(run_dir).resolve()
    for folder in folders:
        for marker in sorted(folder.glob("*/run.json")):
            if marker.parent.resolve() != here and same_run(composed, device, marker.parent):
                return marker.parent
    return None


def take_run(cfg: DictConfig, source: Path, results: RunResults) -> dict:
    """Copy `source`'s files into `results.run_dir` (copies, not links: a later run in either
    directory must not change the other), then this run's config.yaml and, last, its run.json:
    the source's record under this experiment's name, with `reused_from` (the run that trained,
    where the source is itself a copy). Returns the record."""
    run_dir = results.run_dir
    for path in sorted(source.iterdir()):
        if path.name.startswith(".") or path.name in OWN_FILES:
            continue
        if path.is_dir():
            shutil.copytree(path, run_dir / path.name, dirs_exist_ok=True)
        else:
            shutil.copy2(path, run_dir / path.name)
    (run_dir / "config.yaml").write_text(OmegaConf.to_yaml(cfg, resolve=True))
    record = json.loads((source / "run.json").read_text())
    record.update(experiment=str(cfg.experiment.name), reused_from=record.get("reused_from") or str(source))
    results.write_status(record)
    return record
