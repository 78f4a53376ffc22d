"""Writing torch files so that a full disk is named, not reported as a zip-writer assertion."""

from __future__ import annotations

import shutil
from pathlib import Path

import torch

DISK_HINT = "free space or write the results elsewhere (results_dir=...)"  # what to change when a disk is full


class FileWriteError(OSError):
    """A file could not be written: its path, the free space on its disk and the cause."""


def free_bytes(path: Path) -> int:
    """Free space on the disk that holds `path` (or its nearest existing parent)."""
    for candidate in (path, *path.parents):
        if candidate.exists():
            return shutil.disk_usage(candidate).free
    return 0


def state_bytes(obj) -> int:
    """Bytes of the tensors in a (nested) state: about what torch.save writes."""
    if isinstance(obj, torch.Tensor):
        return obj.numel() * obj.element_size()
    if isinstance(obj, dict):
        return sum(state_bytes(value) for value in obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(state_bytes(value) for value in obj)
    return 0


def write_temporary(obj, path: Path, what: str, hint: str = "") -> Path:
    """torch.save `obj` to a temporary beside `path` and return it (the caller renames it into
    place once complete). On failure the temporary is removed and FileWriteError names the
    file, the bytes it needed, the bytes free on its disk, the cause and `hint` (what to change)."""
    path = Path(path)
    temporary = path.with_suffix(".tmp")
    try:
        torch.save(obj, temporary)
    except (OSError, RuntimeError) as error:
        if temporary.is_file():  # half written; anything else there is not ours
            temporary.unlink()
        needed, free = state_bytes(obj), free_bytes(path.parent)
        raise FileWriteError(
            f"could not write the {what} {path}: it needs about {needed / 2**30:.2f} GiB and its disk "
            f"has {free / 2**30:.2f} GiB free ({type(error).__name__}: {error}){'; ' + hint if hint else ''}"
        ) from error
    return temporary


def save_atomic(obj, path: Path, what: str, hint: str = "") -> None:
    """`write_temporary`, then the temporary renamed to `path`: a reader never sees half a file."""
    write_temporary(obj, path, what, hint).replace(path)
