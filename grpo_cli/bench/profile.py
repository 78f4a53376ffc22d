"""Where a step's time goes: one call under `torch.profiler`, written as operator tables.

`profiled(fn, path)` runs `fn()` once with the CPU (and, where CUDA is available, the device)
activities on and writes two tables to `path`: operators by self device time (CUDA) and by self
CPU time, the top `rows` of each. Used by scripts/profile_step.py and `bench_rollout.py
--profile`; the tables are what a GPU visit brings back to plan the next speed-up (issue 45).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import torch

T = TypeVar("T")


def _table(events, sort_by: str, rows: int) -> str:
    try:
        return events.table(sort_by=sort_by, row_limit=rows)
    except (KeyError, AttributeError, ValueError):  # older torch: "cuda" instead of "device"
        return events.table(sort_by=sort_by.replace("device", "cuda"), row_limit=rows)


def profiled(fn: Callable[[], T], path: Path | str, title: str, rows: int = 40) -> T:
    """`fn()` under the profiler; its tables written to `path` (appended, under `title`)."""
    from torch.profiler import ProfilerActivity, profile

    cuda = torch.cuda.is_available()
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=activities) as prof:
        result = fn()
        if cuda:
            torch.cuda.synchronize()
    events = prof.key_averages()
    parts = [f"# {title}\n"]
    if cuda:
        parts.append("## by self device time\n" + _table(events, "self_device_time_total", rows))
    parts.append("## by self CPU time\n" + _table(events, "self_cpu_time_total", rows))
    with open(path, "a") as handle:
        handle.write("\n".join(parts) + "\n\n")
    return result
