"""Named phase timers: the loop says `with timer.phase("rollout"):` once, and the timings row and
the bench's phase table are read from the same totals (after verl's `marked_timer`).

Phases are exclusive: inside `phase("backward")` nested in `phase("update")`, the time counts for
`backward` only, so the phases of a step add up to its wall time. Each phase boundary takes a
mark and closes a segment charged to the innermost open phase; `take()` sums the segments.

- CPU: a mark is the wall clock (`time.perf_counter`).
- CUDA: a mark is a timing event recorded on the current stream, and nothing waits for the
  device until `take()`, which synchronises once. A segment is then the stream's time between
  its two marks: kernels are charged to the phase that launched them (the next boundary's event
  runs after them), host work that overlaps earlier kernels is not charged twice, and the
  segments still add up to the span of the step (docs/results.md).
"""

from __future__ import annotations

import time
from collections import defaultdict
from contextlib import contextmanager

import torch

from grpo_cli.runtime.memory import PhaseMemory


class WallClock:
    """Marks are `time.perf_counter()` readings."""

    def mark(self) -> float:
        return time.perf_counter()

    def mark_after_error(self) -> float:
        return time.perf_counter()

    def settle(self) -> None:
        pass

    def reset(self) -> None:
        pass

    @staticmethod
    def seconds(start: float, end: float) -> float:
        return end - start


class CudaEventClock:
    """Marks are timing events recorded on the current CUDA stream, reused from step to step;
    `settle()` waits for the device once (the step's only sync for timing)."""

    def __init__(self):
        self._events: list[torch.cuda.Event] = []
        self._used = 0

    def mark(self) -> torch.cuda.Event:
        if self._used == len(self._events):
            self._events.append(torch.cuda.Event(enable_timing=True))
        event = self._events[self._used]
        self._used += 1
        event.record()
        return event

    def mark_after_error(self) -> None:
        return None  # recording after a CUDA error could raise again: the segment is dropped

    def settle(self) -> None:
        if self._used:
            torch.cuda.synchronize()  # every event done, whichever stream recorded it

    def reset(self) -> None:
        self._used = 0

    @staticmethod
    def seconds(start: torch.cuda.Event, end: torch.cuda.Event) -> float:
        return start.elapsed_time(end) / 1000.0  # elapsed_time is in milliseconds


class PhaseTimer:
    """Exclusive time per phase name, summed until `take()`."""

    def __init__(self, device: torch.device | None = None, memory: PhaseMemory | None = None):
        cuda = device is not None and device.type == "cuda"
        self.clock = CudaEventClock() if cuda else WallClock()
        self.memory = memory  # also the peak CUDA memory of each phase (grpo_cli/runtime/memory.py)
        self._segments: list[tuple[str, object, object]] = []  # (phase, start mark, end mark)
        self._stack: list[str] = []
        self._mark = None

    def _close_segment(self, end) -> None:
        """Charge the time since the last mark to the innermost open phase."""
        if self._stack:
            self._segments.append((self._stack[-1], self._mark, end))
        self._mark = end

    def start(self, name: str) -> None:
        """Enter phase `name`; the phase it interrupts (if any) stops counting until `stop`."""
        self._close_segment(self.clock.mark())
        self._stack.append(name)
        if self.memory is not None:
            self.memory.begin(name)

    def stop(self, name: str) -> None:
        if not self._stack or self._stack[-1] != name:
            raise RuntimeError(f"phase {name!r} stopped while {self._stack or 'none'} is open")
        self._close_segment(self.clock.mark())
        self._stack.pop()
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
        self._close_segment(self.clock.mark_after_error())  # no device sync after an error
        while self._stack.pop() != name:
            pass

    def clear(self) -> None:
        """Forget every total and any phase left open (by an exception in an earlier step)."""
        self._segments.clear()
        self._stack.clear()
        self.clock.reset()

    def take(self) -> dict[str, float]:
        """The totals so far (seconds per phase), then start again from zero."""
        if self._stack:
            raise RuntimeError(f"take() inside open phases {self._stack}")
        self.clock.settle()
        totals: dict[str, float] = defaultdict(float)
        for name, start, end in self._segments:
            if start is not None and end is not None:
                totals[name] += self.clock.seconds(start, end)
        self.clear()
        return dict(totals)
