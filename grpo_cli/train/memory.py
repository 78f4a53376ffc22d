"""Peak memory per step: CUDA's allocator peak since the step began, or the process's peak RSS.

On CUDA `reset_step_peak` is called at the start of every step, so `peak_memory_mb` is that
step's peak (torch allocations only: vLLM's pool and the CUDA context are not in it). On CPU the
kernel keeps only a whole-process high-water mark, so the value is the run's peak so far.
"""

from __future__ import annotations

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
