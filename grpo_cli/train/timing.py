"""Named phase timers: the loop says `with timer.phase("rollout"):` once, and the timings row and
the bench's phase table are read from the same totals (after verl's `marked_timer`).

Phases are exclusive: inside `phase("backward")` nested in `phase("update")`, the time counts for
`backward` only, so the phases of a step add up to its wall time. On CUDA every phase boundary
synchronises the device first (the trainer already reads a loss scalar per micro-batch, so this
adds no extra stall there), so kernels are charged to the phase that launched them.
"""

from __future__ import annotations

import time
from collections import defaultdict
from contextlib import contextmanager

import torch

from grpo_cli.train.memory import PhaseMemory


class PhaseTimer:
    """Exclusive wall time per phase name, summed until `take()`."""

    def __init__(self, device: torch.device | None = None, memory: PhaseMemory | None = None):
        self.synchronize = device is not None and device.type == "cuda"
        self.memory = memory  # also the peak CUDA memory of each phase (grpo_cli/train/memory.py)
        self.seconds: dict[str, float] = defaultdict(float)
        self._stack: list[str] = []
        self._mark = 0.0

    def _now(self) -> float:
        if self.synchronize:
            torch.cuda.synchronize()
        return time.perf_counter()

    def start(self, name: str) -> None:
        """Enter phase `name`; the phase it interrupts (if any) stops counting until `stop`."""
        now = self._now()
        if self._stack:
            self.seconds[self._stack[-1]] += now - self._mark
        self._stack.append(name)
        self._mark = now
        if self.memory is not None:
            self.memory.begin(name)

    def stop(self, name: str) -> None:
        if not self._stack or self._stack[-1] != name:
            raise RuntimeError(f"phase {name!r} stopped while {self._stack or 'none'} is open")
        now = self._now()
        self.seconds[self._stack.pop()] += now - self._mark
        self._mark = now
        if self.memory is not None:
            self.memory.end(name)

    @contextmanager
    def phase(self, name: str):
        self.start(name)
        try:
            yield
        except BaseException:
            self._unwind(name)  # close phases an exception left open; the exception goes on
            raise
        self.stop(name)

    def _unwind(self, name: str) -> None:
        """Stop `name` and every phase opened inside it, without checks."""
        if name not in self._stack:
            return
        now = time.perf_counter()  # no device sync after an error (it may be a CUDA one)
        self.seconds[self._stack[-1]] += now - self._mark
        while self._stack.pop() != name:
            pass
        self._mark = now

    def clear(self) -> None:
        """Forget every total and any phase left open (by an exception in an earlier step)."""
        self.seconds.clear()
        self._stack.clear()

    def take(self) -> dict[str, float]:
        """The totals so far (seconds per phase), then start again from zero."""
        if self._stack:
            raise RuntimeError(f"take() inside open phases {self._stack}")
        totals = dict(self.seconds)
        self.seconds.clear()
        return totals
