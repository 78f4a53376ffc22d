"""A resume continues the run its directory holds, under the settings that run began with.

A run directory is named from command-line overrides only, so a re-run with another value of an
unnamed key (a preset YAML edited between a crash and the re-run, or a pinned `hydra.run.dir`)
lands in the same directory. Resuming it would mix two configurations in one set of results
while config.yaml claims the second for all of it. So a resume compares the composed config
with the directory's config.yaml and refuses any difference in a key that changes results,
naming it (exit 2); `resume_mismatch=allow` resumes anyway, on purpose, and `resume=false`
starts over.
"""

from __future__ import annotations

import json
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from grpo_cli.config.errors import ConfigError

# Keys (and the subtrees under them) that do not change a run's numbers: where files and caches
# go (or a copy of the run is taken from), what is shown or sent to trackers, how often a
# checkpoint is kept, a fault on purpose, and this guard's own switches. Every other key changes
# results (threads and device too: float summation order), so a resume refuses a difference in it.
RESULT_NEUTRAL = ("resume", "resume_mismatch", "reuse_from", "progress", "logger", "fault",
                  "results_dir", "cache_dir", "checkpoint_every", "keep_checkpoints")
SHOWN = 3  # differing keys named in the refusal; the rest are counted


def _flat(tree: dict, prefix: str = "") -> dict[str, object]:
    """{'optim.lr': 0.001, ...}: the leaves of a nested dict (a list is one leaf)."""
    flat: dict[str, object] = {}
    for key, value in tree.items():
        if isinstance(value, dict) and value:
            flat.update(_flat(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def _neutral(key: str) -> bool:
    return any(key == name or key.startswith(name + ".") for name in RESULT_NEUTRAL)


def differences(stored: dict, composed: dict) -> list[tuple[str, object, object]]:
    """(key, old, new) for each leaf that changes results and differs; a key one side lacks
    reads as `<absent>` there."""
    old, new = _flat(stored), _flat(composed)
    absent = "<absent>"
    return [(key, old.get(key, absent), new.get(key, absent))
            for key in sorted(old.keys() | new.keys(), key=lambda k: (k not in new, k))
            if not _neutral(key) and old.get(key, absent) != new.get(key, absent)]


def has_run_to_resume(run_dir: Path) -> bool:
    """A completed run (skipped by a resume), or a checkpoint a resume would continue from."""
    try:
        if json.loads((run_dir / "run.json").read_text()).get("status") == "completed":
            return True
    except (OSError, ValueError, AttributeError):  # none yet, torn or not an object
        pass
    folder = run_dir / "checkpoints"
    return folder.is_dir() and any(path.name != "initial_layers.pt" for path in folder.glob("*.pt*"))


def resume_conflict(cfg: DictConfig, run_dir: Path) -> str | None:
    """The refusal line for resuming `run_dir` under `cfg`; None where there is nothing to
    resume, `resume=false` starts over or the settings agree."""
    stored_path = Path(run_dir) / "config.yaml"
    if not cfg.resume or not stored_path.is_file() or not has_run_to_resume(Path(run_dir)):
        return None
    try:
        stored = OmegaConf.to_container(OmegaConf.load(stored_path), resolve=False)
    except Exception as error:  # noqa: BLE001 - YAML or OmegaConf: a damaged file is named
        return f"{stored_path}: cannot be read to compare with this resume ({str(error).splitlines()[0]})"
    composed = OmegaConf.to_container(OmegaConf.create(OmegaConf.to_yaml(cfg, resolve=True)))
    found = differences(stored if isinstance(stored, dict) else {}, composed)
    if not found:
        return None
    named = ", ".join(f"{key}: {old!r} -> {new!r}" for key, old, new in found[:SHOWN])
    more = f" (and {len(found) - SHOWN} more)" if len(found) > SHOWN else ""
    return (f"{run_dir} holds a run with other settings: {named}{more}; resuming would mix two "
            "configurations: resume=false starts over, resume_mismatch=allow resumes anyway")


def check_resume(cfg: DictConfig, run_dir: Path, log=print) -> None:
    """ConfigError (one line) unless resuming `run_dir` under `cfg` keeps its settings; with
    `resume_mismatch=allow` the differences are logged and the resume goes on."""
    line = resume_conflict(cfg, run_dir)
    if line is None:
        return
    if cfg.get("resume_mismatch", "refuse") == "allow":
        log(f"resume_mismatch=allow: {line.split('; resuming')[0]}; resuming anyway")
        return
    raise ConfigError(line)
