"""One GPU per sweep member on one multi-GPU node (`hydra/launcher=local_gpus`).

submitit's local executor starts every member of a sweep at once, each in a fresh process that
sees the node's GPUs (CUDA_VISIBLE_DEVICES=0,...,G-1). Before the member's job runs, it claims
one of them with an OS file lock in the sweep directory (first try: member number modulo G, so
a sweep of G members lands on G distinct GPUs at once) and narrows CUDA_VISIBLE_DEVICES to it;
a member that finds every GPU claimed waits for one to be released. The kernel drops a dead
member's lock, so a crashed member never holds its GPU.
"""

from __future__ import annotations

import time
from pathlib import Path

from filelock import FileLock, Timeout


def visible_devices(cuda_visible_devices: str | None) -> list[str]:
    """The devices a CUDA_VISIBLE_DEVICES value lists ("0,2" -> ["0", "2"]; unset or "" -> [])."""
    return [device.strip() for device in (cuda_visible_devices or "").split(",") if device.strip()]


class DeviceSlot:
    """Hold one of `devices` (a lock file per device in `lock_dir`) until `release`."""

    def __init__(self, devices: list[str], lock_dir: Path, first: int, poll_s: float = 5.0):
        if not devices:
            raise ValueError("DeviceSlot needs at least one device")
        self.devices, self.lock_dir, self.first, self.poll_s = list(devices), Path(lock_dir), first, poll_s
        self._lock: FileLock | None = None

    def acquire(self) -> str:
        """The claimed device: `devices[first % G]` if free, else the next free one (waiting)."""
        self.lock_dir.mkdir(parents=True, exist_ok=True)
        count = len(self.devices)
        while True:
            for offset in range(count):
                device = self.devices[(self.first + offset) % count]
                lock = FileLock(self.lock_dir / f"device-{device}.lock")
                try:
                    lock.acquire(timeout=0)
                except Timeout:
                    continue
                self._lock = lock
                return device
            time.sleep(self.poll_s)

    def release(self) -> None:
        if self._lock is not None:
            self._lock.release()
            self._lock = None
