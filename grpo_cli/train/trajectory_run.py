"""`grpo trajectory RUN`: the update W_t - W_0 over the checkpoints a run kept
(keep_checkpoints=true, checkpoints/step_<N>.pt), written to RUN/trajectory.csv (the measures:
grpo_cli/probes/trajectory.py; the file: docs/results.md).

Weights only: no rollout, no gradient. W_0 is the kept `step_000000.pt` where the run kept one
(the weights it started from), else the probes' checkpoints/initial_layers.pt where it holds every
selected weight (a run that probed `update`), else the run's initial model loaded again from its
config.yaml (pretrained weights, the cached warm start, or random weights under the run's
seed, as `grpo run` loads them). A snapshot holds the model's weights as the model keeps them: a
bf16 model's W_t is its bf16 weights, not the fp32 masters.
"""

from __future__ import annotations

import re
from pathlib import Path

import torch

from grpo_cli.config.errors import InputError
from grpo_cli.config.schema import ProbesConfig
from grpo_cli.measures import TRAJECTORY_COLUMNS
from grpo_cli.probes.trajectory import trajectory_rows
from grpo_cli.results.writer import write_table
from grpo_cli.runtime.files import load_plain
from grpo_cli.train.checkpoint import CheckpointError, UnsafeCheckpointError
from grpo_cli.train.probe_checkpoint import _run_config

TRAJECTORY_FILE = "trajectory.csv"
DEFAULT_LAYER_REGEX = ProbesConfig().layer_regex  # every block's projections and lm_head


def kept_snapshots(run_dir: Path) -> list[tuple[int, dict]]:
    """(step, state dict) of every kept checkpoint, ascending, memory-mapped (read as needed)."""
    folder = run_dir / "checkpoints"
    snapshots = []
    for path in sorted(folder.glob("step_*.pt")):
        try:
            state = load_plain(path, mmap=True)
        except UnsafeCheckpointError:
            raise
        except Exception as error:  # torch raises many types for a damaged file
            raise CheckpointError(f"{path}: not a readable weights snapshot ({type(error).__name__}: "
                                  f"{str(error).splitlines()[0][:200] if str(error) else ''})") from None
        if not isinstance(state, dict) or "model" not in state or "next_step" not in state:
            raise CheckpointError(f"{path}: not a grpo weights snapshot (no model / next_step)")
        snapshots.append((int(state["next_step"]), state["model"]))
    if not snapshots:
        raise InputError(f"{folder}: no kept checkpoints (step_<N>.pt); train with keep_checkpoints=true")
    return sorted(snapshots, key=lambda pair: pair[0])


def initial_weights(run_dir: Path, cfg, names: list[str], log=print) -> dict[str, torch.Tensor]:
    """W_0 of the weights `names` (module docstring)."""
    saved = run_dir / "checkpoints" / "initial_layers.pt"
    if saved.is_file():
        initial = load_plain(saved)
        if isinstance(initial, dict) and set(names) <= set(initial):
            return {name: initial[name] for name in names}
    from grpo_cli.models.policy import load_policy
    from grpo_cli.tasks import build_task

    log(f"{run_dir}: W_0 from the run's initial model ({cfg.model.name})")
    torch.manual_seed(cfg.seed)  # random weights are drawn under the run's seed, as grpo run does
    state = load_policy(cfg, build_task(cfg.task), torch.device("cpu"), log=log).model.state_dict()
    missing = [name for name in names if name not in state]
    if missing:
        raise InputError(f"{run_dir / 'config.yaml'}: its model has no weight {missing[0]!r} of the checkpoints")
    return {name: state[name].detach().to("cpu", copy=True) for name in names}


def write_trajectory(run_dir: Path, layer_regex: str = DEFAULT_LAYER_REGEX, log=print) -> Path:
    """RUN/trajectory.csv from the run's kept checkpoints; returns its path."""
    run_dir = Path(run_dir)
    if not (run_dir / "config.yaml").is_file():
        raise InputError(f"{run_dir}: not a run directory (no config.yaml)")
    snapshots = kept_snapshots(run_dir)
    start = snapshots.pop(0)[1] if snapshots[0][0] == 0 else None  # step_000000.pt: W_0 itself
    if not snapshots:
        raise InputError(f"{run_dir / 'checkpoints'}: no kept checkpoint after step 0")
    pattern = re.compile(layer_regex)
    last = snapshots[-1][1]
    names = [name for name, tensor in last.items() if tensor.ndim == 2 and pattern.search(name)]
    if not names:
        raise InputError(f"--layer-regex {layer_regex!r} selects no 2-D weight of {run_dir}'s checkpoints")
    if start is not None and set(names) <= set(start):
        initial = {name: start[name] for name in names}
    else:
        initial = initial_weights(run_dir, _run_config(run_dir, []), names, log)
    for name in names:
        if tuple(initial[name].shape) != tuple(last[name].shape):
            raise InputError(f"{run_dir}: W_0 of {name} is {tuple(initial[name].shape)}, its checkpoints "
                             f"{tuple(last[name].shape)}: not this run's initial weights")
    rows = trajectory_rows(initial, [step for step, _ in snapshots], [state for _, state in snapshots])
    path = run_dir / TRAJECTORY_FILE
    write_table(path, rows, TRAJECTORY_COLUMNS)
    return path
