"""One writer per run directory: an OS file lock, with the holder written beside it.

`filelock` takes an OS lock (flock/fcntl on POSIX, msvcrt on Windows) that the kernel drops when
the holding process dies, so a crashed or killed run never leaves the directory stuck, which a
hand-written "lock file exists" check cannot promise. The holder (pid, host, start time, argv) is
written to `.lock.holder` so a refused run can say who holds the directory.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import socket
import sys
from pathlib import Path

from filelock import FileLock, Timeout

LOCK_NAME = ".lock"
HOLDER_NAME = ".lock.holder"


class RunLockedError(RuntimeError):
    """Another live process holds the run directory; nothing in it was touched."""


def describe_holder(run_dir: Path) -> str:
    """'pid 123 on host since T (grpo run ...)', or a note when the holder file is unreadable."""
    try:
        holder = json.loads((Path(run_dir) / HOLDER_NAME).read_text())
        argv = " ".join(holder.get("argv") or [])
        return (f"pid {holder.get('pid')} on {holder.get('host')} since {holder.get('started_at')}"
                + (f" ({argv})" if argv else ""))
    except (OSError, ValueError):
        return "a process that has not yet written its holder file"


class RunLock:
    """Context manager: hold `run_dir` for the duration of one run, or raise RunLockedError."""

    def __init__(self, run_dir: Path):
        self.run_dir = Path(run_dir)
        self.lock = FileLock(self.run_dir / LOCK_NAME, timeout=0)

    def __enter__(self) -> RunLock:
        self.run_dir.mkdir(parents=True, exist_ok=True)
        try:
            self.lock.acquire()
        except Timeout:
            raise _locked(self.run_dir) from None
        holder = {
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "started_at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
            "argv": sys.argv,
        }
        (self.run_dir / HOLDER_NAME).write_text(json.dumps(holder) + "\n")
        return self

    def __exit__(self, *exc) -> None:
        (self.run_dir / HOLDER_NAME).unlink(missing_ok=True)
        self.lock.release()


def check_free(run_dir: Path) -> None:
    """Raise RunLockedError if a live process holds `run_dir` (takes and drops the lock at once)."""
    path = Path(run_dir) / LOCK_NAME
    if not path.exists():
        return
    try:
        with FileLock(path, timeout=0):
            pass
    except Timeout:
        raise _locked(Path(run_dir)) from None


def _locked(run_dir: Path) -> RunLockedError:
    return RunLockedError(
        f"{run_dir} is in use by {describe_holder(run_dir)}; wait for it to finish, "
        "or give this run another results_dir"
    )
