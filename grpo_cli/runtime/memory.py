"""Peak memory per step: CUDA's allocator peak since the step began, or the process's peak RSS.

On CUDA `reset_step_peak` is called at the start of every step, so `peak_memory_mb` is that
step's peak (torch allocations only: the CUDA context, and whatever vLLM allocates outside torch's
caching allocator, are not in it). On CPU the
kernel keeps only a whole-process high-water mark, so the value is the run's peak so far.
`PhaseMemory` splits a CUDA step's peak by phase (rollout, train, optimizer, probes).
"""

from __future__ import annotations

import math
from contextlib import contextmanager

import torch


def reset_step_peak(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)


def peak_memory_mb(device: torch.device) -> float:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    try:
        import resource
    except ImportError:  # pragma: no cover - non-Unix
        return float("nan")
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux reports KiB


# timings.csv's peak_<column>_mb -> the loop's phases it covers (grpo_cli/train/trainer.py, loop.py)
PHASE_COLUMNS = {
    "rollout": ("rollout",),  # sampling
    "train": ("forward", "backward"),  # one micro-batch's forward (with the loss) and backward
    "optimizer": ("optimizer",),  # clipping and the optimizer step
    "probes": ("probes",),  # the probes' gradient copy and their own forward/backward
}
PHASES = tuple(PHASE_COLUMNS)


class PhaseMemory:
    """Peak CUDA memory of each named phase of a step, fed by the loop's PhaseTimer
    (grpo_cli/runtime/timing.py calls `begin`/`end` at every phase boundary).

    Every `begin`/`end` reads the allocator's peak since the last reset, credits it to every open
    phase (phases nest) and to the step, then resets it; so each phase's figure is the peak of
    torch allocations while it was open, whatever ran around it. A phase entered several times in
    a step (once per micro-batch) keeps its largest peak. On CPU nothing per phase is measurable
    (the kernel keeps one process-wide high-water mark): NaN, and the step's figure is the
    process's peak RSS.
    """

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        self.device = device
        self.start_step()

    def start_step(self) -> None:
        reset_step_peak(self.device)
        self.peaks: dict[str, float] = {}  # phase name -> MiB
        self._open: list[str] = []
        self._step_peak = 0.0  # MiB, up to the last reset

    def _credit(self) -> None:
        """Credit the peak since the last reset to the step and every open phase; reset it."""
        peak = peak_memory_mb(self.device)
        self._step_peak = max(self._step_peak, peak)
        for name in self._open:
            self.peaks[name] = max(self.peaks.get(name, 0.0), peak)
        torch.cuda.reset_peak_memory_stats(self.device)

    def begin(self, name: str) -> None:
        if self.cuda:
            self._credit()
            self._open.append(name)

    def end(self, name: str) -> None:
        if self.cuda:
            self._credit()
            if not self._open or self._open[-1] != name:
                raise RuntimeError(f"memory phase {name!r} ended while {self._open or 'none'} is open")
            self._open.pop()

    @contextmanager
    def phase(self, name: str):
        self.begin(name)
        try:
            yield
        finally:
            self.end(name)

    def step_peak_mb(self) -> float:
        """The step's peak: CUDA allocator over the whole step, else the process's peak RSS."""
        if not self.cuda:
            return peak_memory_mb(self.device)
        return max(self._step_peak, peak_memory_mb(self.device))

    def phase_peaks(self) -> dict[str, float]:
        """timings.csv's peak_<column>_mb (NaN when no phase of the column ran, or on CPU)."""
        row = {}
        for column, names in PHASE_COLUMNS.items():
            seen = [self.peaks[name] for name in names if name in self.peaks]
            row[f"peak_{column}_mb"] = max(seen) if seen else math.nan
        return row
