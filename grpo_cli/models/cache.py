"""Model directories built once per key under the cache, safe for parallel sweep members."""

from __future__ import annotations

import fcntl
from collections.abc import Callable
from pathlib import Path


def cached_model_dir(root: Path, key: str, build: Callable[[Path], None]) -> Path:
    """`root/key`, built by `build(partial)` the first time; an exclusive file lock makes a
    parallel job wait rather than build it twice, and the finished directory appears whole (a
    killed build leaves only `key.partial`, which the next build reuses)."""
    root.mkdir(parents=True, exist_ok=True)
    target = root / key
    with open(root / f"{key}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (target / "config.json").exists():
            return target
        partial = root / f"{key}.partial"
        partial.mkdir(exist_ok=True)
        build(partial)
        partial.rename(target)
    return target
