"""Writing torch files so that a full disk is named, not reported as a zip-writer assertion; and
reading them as tensors and plain data only, so that no file runs code as it loads."""

from __future__ import annotations

import pickle
import shutil
import warnings
from pathlib import Path

import torch

from grpo_cli.config.errors import InputError

DISK_HINT = "free space or write the results elsewhere (results_dir=...)"  # what to change when a disk is full


class UnsafeCheckpointError(InputError):
    """A torch file that holds pickled objects beyond tensors and plain data: refused unread."""


def load_plain(path: Path, device="cpu", mmap: bool = False):
    """torch.load `path` with `weights_only=True`: tensors and plain data (ints, floats, strings,
    lists, dicts) only. The one reader of grpo-cli's torch files (checkpoints, weight snapshots,
    the probes' initial layers and running sums, the TRL callback's state). A file that needs any
    other pickled object, which could run code as it loads, raises UnsafeCheckpointError in one
    line naming it; a damaged file raises what torch raises. `mmap`: tensors are read from the
    file as they are used (on the CPU), so a reader of many snapshots holds none whole."""
    try:
        with warnings.catch_warnings():  # a raw pickle's protocol: refused below anyway
            warnings.filterwarnings("ignore", message="Detected pickle protocol")
            return torch.load(path, map_location=device, weights_only=True, mmap=mmap)
    except pickle.UnpicklingError as error:  # torch's weights-only unpickler met another object
        cause = str(error.__context__ or "").strip().splitlines()
        raise UnsafeCheckpointError(
            f"{path}: refused: it holds pickled objects beyond tensors and plain data, which could "
            f"run code as it loads{f' ({cause[0]})' if cause else ''}; grpo-cli writes none, so this "
            "file was not written by grpo-cli or was altered"
        ) from None


class FileWriteError(OSError, InputError):
    """A file could not be written: its path, the free space on its disk and the cause. An
    InputError: `grpo run` answers it with its one line (exit 1), no traceback."""


def size_text(size: int) -> str:
    """Bytes for a message: GiB from 1 GiB, else MiB (KiB below 1 MiB).

    >>> size_text(3 * 2**30), size_text(5 * 2**20 + 2**19), size_text(1000), size_text(0)
    ('3.00 GiB', '5.5 MiB', '1 KiB', '0 KiB')
    """
    if size >= 2**30:
        return f"{size / 2**30:.2f} GiB"
    if size >= 2**20:
        return f"{size / 2**20:.1f} MiB"
    return f"{-(-size // 2**10)} KiB"


def _first_line(error: BaseException) -> str:
    """An error's first line (torch's zip writer adds lines of C++ context)."""
    return (str(error).strip().splitlines() or [""])[0]


def disk_full_error(error: OSError, directory: Path, hint: str = DISK_HINT) -> FileWriteError:
    """A write that failed with ENOSPC somewhere in `directory` (a results file), as one line
    naming the file where the OSError knows it, and the free space."""
    where = error.filename or directory
    return FileWriteError(
        f"could not write {where}: its disk is full ({size_text(free_bytes(Path(directory)))} "
        f"free; {type(error).__name__}: {error.strerror or error}); {hint}"
    )


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
    free = free_bytes(path.parent)  # before: torch's writer may hold the failed file's space a while
    try:
        torch.save(obj, temporary)
    except (OSError, RuntimeError) as error:
        if temporary.is_file():  # half written; anything else there is not ours
            temporary.unlink()
        needed = state_bytes(obj)
        raise FileWriteError(
            f"could not write the {what} {path}: it needs about {size_text(needed)} and its disk "
            f"had {size_text(free)} free ({type(error).__name__}: {_first_line(error)}){'; ' + hint if hint else ''}"
        ) from error
    return temporary


def save_atomic(obj, path: Path, what: str, hint: str = "") -> None:
    """`write_temporary`, then the temporary renamed to `path`: a reader never sees half a file."""
    write_temporary(obj, path, what, hint).replace(path)
