"""Named phase timers: exclusive phases that add up to the step, turned into one timings row."""

from __future__ import annotations

import time

import pytest
import torch

from grpo_cli.results.rows import PHASES, timing_row
from grpo_cli.results.writer import TIMING_COLUMNS
from grpo_cli.runtime.timing import PhaseTimer


def test_nested_phases_are_exclusive_and_sum_to_the_wall_time():
    timer = PhaseTimer()
    start = time.perf_counter()
    with timer.phase("other"):
        time.sleep(0.02)
        with timer.phase("update"):
            with timer.phase("forward"):
                time.sleep(0.03)
            with timer.phase("forward"):  # a second micro-batch adds to the same phase
                time.sleep(0.03)
    wall = time.perf_counter() - start
    seconds = timer.take()
    assert seconds["forward"] >= 0.06 and seconds["forward"] < 0.06 + 0.05
    assert seconds["other"] >= 0.02 and seconds["other"] < 0.02 + 0.05  # forward not counted twice
    assert seconds["update"] < 0.01
    assert sum(seconds.values()) == pytest.approx(wall, abs=2e-3)
    assert timer.take() == {}  # take() starts again from zero


def test_mismatched_stop_and_open_take_are_errors():
    timer = PhaseTimer()
    timer.start("update")
    with pytest.raises(RuntimeError, match="'forward' stopped while"):
        timer.stop("forward")
    with pytest.raises(RuntimeError, match="open phases"):
        timer.take()
    timer.clear()  # an exception in a step leaves phases open; the next step starts clean
    assert timer.take() == {}


def test_timing_row_has_every_column_and_rejects_unknown_phases():
    row = timing_row(3, {"rollout": 0.5, "forward": 0.25, "other": 0.25}, peak_mb=12.0)
    assert tuple(row) == TIMING_COLUMNS
    assert row["time_step"] == 1.0 and row["time_backward"] == 0.0 and row["step"] == 3
    assert {"rollout", "forward", "backward", "optimizer", "probes", "eval", "other"} <= set(PHASES)
    with pytest.raises(KeyError, match="time_warmup|warmup"):
        timing_row(0, {"warmup": 1.0}, peak_mb=0.0)


def test_an_exception_inside_open_phases_propagates_unchanged():
    timer = PhaseTimer()
    with pytest.raises(ValueError, match="the real error"):
        with timer.phase("other"):
            timer.start("update")
            timer.start("forward")  # explicit phases left open by the error
            raise ValueError("the real error")
    assert set(timer.take()) == {"other", "update", "forward"}  # closed, nothing left open


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_phase_boundaries_do_not_wait_and_take_reads_the_events():
    """On CUDA a boundary records an event and returns: the host passes a phase holding a long
    kernel at once, and `take()` (the one sync) charges the kernel's time to that phase.
    Not run in the session that wrote it (no GPU)."""
    device = torch.device("cuda")
    torch.cuda.synchronize()
    timer = PhaseTimer(device)
    start = time.perf_counter()
    with timer.phase("other"):
        with timer.phase("forward"):
            torch.cuda._sleep(2_000_000_000)  # a kernel spinning ~1 s (clock cycles)
        with timer.phase("optimizer"):
            pass
    host = time.perf_counter() - start  # the boundaries did not wait for the kernel
    seconds = timer.take()
    wall = time.perf_counter() - start
    assert set(seconds) == {"other", "forward", "optimizer"}
    assert host < 0.2 * seconds["forward"]
    assert seconds["forward"] == pytest.approx(wall, rel=0.2)
    assert seconds["optimizer"] < 0.05 and seconds["other"] < 0.05
    assert sum(seconds.values()) <= wall
    # the events are reused: a second step's totals are its own
    with timer.phase("other"):
        pass
    assert set(timer.take()) == {"other"}
