"""Per-step peak memory (timings.csv's peak_memory_mb)."""

from __future__ import annotations

import pytest
import torch

from grpo_cli.runtime.memory import peak_memory_mb, reset_step_peak


def test_cpu_peak_is_the_process_high_water_mark():
    before = peak_memory_mb(torch.device("cpu"))
    reset_step_peak(torch.device("cpu"))  # nothing to reset on CPU
    block = torch.ones(64 * 2**20 // 4)  # 64 MiB
    assert peak_memory_mb(torch.device("cpu")) >= before > 0
    del block


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_peak_is_per_step():
    device = torch.device("cuda")
    big = torch.empty(256 * 2**20, dtype=torch.uint8, device=device)
    del big
    assert peak_memory_mb(device) >= 256
    reset_step_peak(device)
    live = torch.cuda.memory_allocated(device) / 2**20  # tensors other tests left alive (xdist)
    small = torch.empty(2**20, dtype=torch.uint8, device=device)
    assert peak_memory_mb(device) < live + 64  # the 256 MiB block before the reset is forgotten
    del small
