"""The run's side of the experiment trackers (grpo_cli/trackers/): start them from the config,
and after a completed run send them the figures `grpo analyze` draws for it."""

from __future__ import annotations

import tempfile
from pathlib import Path

from omegaconf import OmegaConf

from grpo_cli.trackers import RunIdentity, Trackers, open_trackers


def flat_settings(cfg) -> dict:
    """{"rollout.group_size": 4, ...}: every resolved setting, lists kept as their text."""
    flat: dict = {}

    def walk(node, prefix: str) -> None:
        for key, value in node.items():
            if isinstance(value, dict):
                walk(value, f"{prefix}{key}.")
            else:
                flat[f"{prefix}{key}"] = value if isinstance(value, (int, float, str, bool)) else str(value)

    walk(OmegaConf.to_container(cfg, resolve=True), "")
    return flat


def start_trackers(cfg, run_dir: Path, log) -> Trackers:
    identity = RunIdentity(Path(run_dir), cfg.experiment.name, flat_settings(cfg))
    return open_trackers(cfg.logger, identity, log=log)


def finish_trackers(trackers: Trackers, cfg, run_dir: Path, status: str, log) -> None:
    """Figures first (completed runs only, with logger.figures), then close every tracker."""
    if trackers and status == "completed" and cfg.logger.figures:
        from grpo_cli.analysis import analyze

        with tempfile.TemporaryDirectory() as out:
            try:  # the figures of this one run, drawn where the results directory is untouched
                analyze([Path(run_dir)], out=Path(out))
            except Exception as error:  # noqa: BLE001 - figures are a courtesy to the tracker
                log(f"WARNING figures for the trackers not drawn ({type(error).__name__}: {error})")
            trackers.figures(sorted(Path(out).glob("*.png")))
    trackers.close(status)
