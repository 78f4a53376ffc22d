"""Resumable checkpoints: policy, optimizer (fp32 masters and rounding generators included),
value head, alarm counters, per-problem success counts, the probes' running sums and the next
step. With `keep_checkpoints=true` each one's weights (policy, value head, next step) are also
kept as `step_<N>.pt`, N the step it continues from, for `grpo probe RUN --all-checkpoints`.

The last two are kept (`latest.pt`, `previous.pt`) while the run goes: a checkpoint that cannot
be read (a disk filled up, a copy cut short) is named in the log, set aside as
`latest.pt.corrupt`, and the run resumes from the previous one. A completed run keeps the last.

Checkpoints hold tensors and plain data only (ints, floats, strings, lists, dicts; the
optimizer's rounding generators as their `get_state()` tensors) and are read with
`torch.load(weights_only=True)`: a file that needs any other pickled object (which could run
code as it loads; issue 41) is refused, naming it, and never falls back to an earlier one.
"""

from __future__ import annotations

from pathlib import Path

from grpo_cli.config.errors import InputError
from grpo_cli.runtime.files import (  # noqa: F401 - UnsafeCheckpointError: re-exported
    DISK_HINT,
    UnsafeCheckpointError,
    load_plain,
    save_atomic,
    write_temporary,
)

PREVIOUS = "previous.pt"
SNAPSHOT = "step_{:06d}.pt"  # keep_checkpoints: the weights a run continues from at step N
# a run keeps two checkpoints (latest and previous), each policy + optimizer state + the rest
CHECKPOINT_HINT = DISK_HINT + "; a run keeps two checkpoints"


class CheckpointError(InputError):
    """No readable checkpoint to resume from, though one exists."""


def read_checkpoint(path: Path, device="cpu") -> dict:
    """A checkpoint or weights snapshot, unpickling tensors and plain data only.

    Raises UnsafeCheckpointError (one line naming `path`) for a file that needs more; a damaged
    file raises what torch raises.
    """
    state = load_plain(path, device)
    if not isinstance(state, dict) or "next_step" not in state:
        raise ValueError(f"not a grpo checkpoint (a {type(state).__name__} without next_step)")
    return state


def save_checkpoint(path: Path, next_step: int, trainer, monitor, probes=None) -> None:
    """Write `path` atomically; the checkpoint it replaces becomes `previous.pt` beside it."""
    commit_checkpoint(write_checkpoint(path, next_step, trainer, monitor, probes), path)


def write_checkpoint(path: Path, next_step: int, trainer, monitor, probes=None) -> Path:
    """The checkpoint written to a temporary beside `path` (the long part: ~1.6 GB for SmolLM2);
    commit_checkpoint puts it in place. Cut off before that, `path` is as it was."""
    state = {
        "probes": probes.state_dict() if probes is not None else None,
        "next_step": next_step,
        "model": trainer.model.state_dict(),
        "optimizer": trainer.optimizer.state_dict(),
        "value_head": trainer.value_head.state_dict() if trainer.value_head is not None else None,
        "alarms": monitor.state_dict(),
        "problem_success": trainer.problem_success.state_dict(),
    }
    return write_temporary(state, path, "checkpoint", CHECKPOINT_HINT)


def commit_checkpoint(temporary: Path, path: Path) -> None:
    """`temporary` becomes `path`, the checkpoint there `previous.pt` (two renames: between them
    only `previous.pt` exists, and a resume reads it)."""
    if path.exists():
        path.replace(path.with_name(PREVIOUS))
    temporary.replace(path)


def drop_previous(path: Path) -> None:
    """A completed run keeps only its last checkpoint (`path`): `previous.pt`, the fallback while
    the run could still be cut off mid-write, goes (a SmolLM2 checkpoint is ~1.6 GB)."""
    path.with_name(PREVIOUS).unlink(missing_ok=True)


def save_weights_snapshot(directory: Path, next_step: int, trainer) -> Path:
    """Keep the weights the run continues from at `next_step` (keep_checkpoints=true)."""
    path = directory / SNAPSHOT.format(next_step)
    state = {
        "next_step": next_step,
        "model": trainer.model.state_dict(),
        "value_head": trainer.value_head.state_dict() if trainer.value_head is not None else None,
    }
    save_atomic(state, path, "weights snapshot", CHECKPOINT_HINT)
    return path


class WeightsMismatchError(CheckpointError):
    """A readable checkpoint of another model (missing keys or another shape): not damaged, so a
    resume does not fall back past it to an earlier one."""


def _load_model_state(path: Path, model, state: dict) -> None:
    """The checkpoint's policy weights into `model`; WeightsMismatchError, one line naming `path`
    and the first key that does not fit, for another architecture."""
    try:
        model.load_state_dict(state["model"])
    except RuntimeError as error:  # another architecture: missing keys or size mismatches
        lines = [line.strip() for line in str(error).splitlines() if line.strip()]
        raise WeightsMismatchError(f"{path}: its weights do not fit this model ("
                                   f"{(lines[1:] or lines)[0][:200]})") from None


def load_weights(path: Path, model, value_head=None, device="cpu") -> int:
    """Load the policy (and value head) of a checkpoint or weights snapshot; return its step."""
    state = read_checkpoint(path, device)
    _load_model_state(path, model, state)
    if value_head is not None and state.get("value_head") is not None:
        value_head.load_state_dict(state["value_head"])
    return int(state["next_step"])


def load_checkpoint(path: Path, trainer, monitor, probes=None) -> int:
    """Restore a run's state in place; return the step to continue from."""
    state = read_checkpoint(path, trainer.device)
    _load_model_state(path, trainer.model, state)
    trainer.optimizer.load_state_dict(state["optimizer"])
    if trainer.value_head is not None and state["value_head"] is not None:
        trainer.value_head.load_state_dict(state["value_head"])
    monitor.load_state_dict(state["alarms"])
    if "problem_success" in state:  # absent in checkpoints written before it existed
        trainer.problem_success.load_state_dict(state["problem_success"])
    if probes is not None and state.get("probes") is not None:
        probes.load_state_dict(state["probes"])
    trainer.backend.sync_weights(trainer.model)
    return int(state["next_step"])


def resume_checkpoint(path: Path, trainer, monitor, probes=None, log=print) -> int | None:
    """Load `path`, or `previous.pt` beside it when `path` is unreadable; None if neither exists.

    When the fallback is used, the unreadable `path` is renamed `<name>.corrupt` (so the next save
    does not rotate it into `previous.pt`); if no checkpoint can be read, CheckpointError names
    every file tried and leaves them in place. A file refused as unsafe stops the resume there
    (UnsafeCheckpointError naming it): falling back past it would hide that it was planted; so
    does one of another model (WeightsMismatchError naming its first key that does not fit).
    """
    tried = []
    for candidate in (path, path.with_name(PREVIOUS)):
        if not candidate.exists():
            continue
        try:
            next_step = load_checkpoint(candidate, trainer, monitor, probes)
        except UnsafeCheckpointError as error:
            raise UnsafeCheckpointError(
                f"{error}; move it away to resume from an earlier checkpoint, or start over with "
                "resume=false"
            ) from None
        except WeightsMismatchError as error:  # another model's weights, not a damaged file
            raise WeightsMismatchError(f"{error}; start over with resume=false") from None
        except Exception as error:  # torch raises many types for a damaged file
            tried.append(f"{candidate}: {type(error).__name__}: {error}".splitlines()[0])
            log(f"checkpoint unreadable, trying an earlier one: {tried[-1]}")
            continue
        if candidate != path and path.exists():
            path.replace(path.with_name(path.name + ".corrupt"))
        return next_step
    if tried:
        raise CheckpointError(
            "no readable checkpoint (" + "; ".join(tried)
            + "); start over with resume=false, which discards this run's results"
        )
    return None
