"""Nothing lost, nothing silently wrong: locks, signals, checkpoints and restarts of `grpo run`."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
from cli_helpers import fault_at, grpo_run, run_dir

from grpo_cli.train.run import RunInterrupted, StopRequests

ROOT = Path(__file__).resolve().parents[1]
# long enough to be caught mid-run, with few probes and evaluations
LONGER = ("train.steps=8", "probes.every=4", "eval.every=8")
LONGER_NAME = "R4-grpo-s0-eval.every=8,probes.every=4,train.steps=8"
TABLES = ("metrics.csv", "eval.csv", "ranks.csv", "events.csv", "grad_norms.csv")


def spawn_run(results: Path, cache: Path, *overrides: str) -> subprocess.Popen:
    """`grpo run experiment=smoke ...` in its own process (signals and locks are per process)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
           "OMP_NUM_THREADS": "1"}
    command = [sys.executable, "-m", "grpo_cli.cli", "run", "experiment=smoke",
               f"results_dir={results}", f"cache_dir={cache}", "progress=false", "device=cpu", *overrides]
    return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=env, cwd=ROOT)


def wait_until(condition, process: subprocess.Popen, timeout: float = 240.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if process.poll() is not None:
            raise AssertionError(f"process ended first:\n{process.stdout.read()}")
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def status(out: Path) -> dict:
    try:
        return json.loads((out / "run.json").read_text())
    except (OSError, ValueError):
        return {}


def test_second_run_into_a_held_directory_is_refused_naming_the_holder(tmp_path, cache_dir):
    grpo_run(tmp_path / "warm", cache_dir, "train.steps=1")  # the warm start, built once
    first = spawn_run(tmp_path, cache_dir, *LONGER)
    out = run_dir(tmp_path, LONGER_NAME)
    wait_until(lambda: status(out).get("status") == "running", first)

    second = grpo_run(tmp_path, cache_dir, *LONGER)
    assert second.exit_code == 2, second.output
    assert f"refused: {out} is in use by pid {first.pid} on" in second.output

    output = first.communicate(timeout=300)[0]
    assert first.returncode == 0, output
    assert status(out)["status"] == "completed"
    assert pd.read_csv(out / "metrics.csv")["step"].tolist() == list(range(8))
    assert pd.read_csv(out / "eval.csv")["step"].tolist() == [0, 8]
    ranks = pd.read_csv(out / "ranks.csv", dtype={"layer": str, "group": str})
    assert not ranks.duplicated(["step", "matrix", "layer", "group"]).any()
    assert sorted(pd.read_parquet(out / "spectra.parquet")["step"].unique()) == [0, 4, 7]


def test_sigterm_stops_after_the_step_with_a_checkpoint_and_resume_is_byte_identical(
        tmp_path, cache_dir):
    """checkpoint_every=100: without the checkpoint taken on the signal, a re-run would start over
    (and used to say it would resume)."""
    assert grpo_run(tmp_path / "full", cache_dir, *LONGER).exit_code == 0
    process = spawn_run(tmp_path / "cut", cache_dir, *LONGER, "checkpoint_every=100")
    out = run_dir(tmp_path / "cut", LONGER_NAME)
    wait_until(lambda: status(out).get("last_step") is not None, process)
    process.send_signal(signal.SIGTERM)
    output = process.communicate(timeout=120)[0]

    assert process.returncode == 143, output
    record = status(out)
    assert record["status"] == "interrupted" and record["stopped_by"] == "SIGTERM", record
    last = record["last_step"]
    assert 0 <= last < 7 and record["checkpoint_step"] == last + 1, record
    assert "SIGTERM received: stopping after the step in progress" in output
    assert (f"interrupted by SIGTERM after step {last}; re-run the same command to resume at "
            f"step {last + 1}") in output
    assert pd.read_csv(out / "metrics.csv")["step"].tolist() == list(range(last + 1))

    resumed = grpo_run(tmp_path / "cut", cache_dir, *LONGER, "checkpoint_every=100")
    assert resumed.exit_code == 0, resumed.output
    record = status(out)
    assert record["status"] == "completed" and record["resumed_from"] == last + 1
    assert f"results: {out}" in resumed.output
    full = run_dir(tmp_path / "full", LONGER_NAME)
    for name in TABLES:
        assert (out / name).read_bytes() == (full / name).read_bytes(), name
    pd.testing.assert_frame_equal(
        pd.read_parquet(out / "spectra.parquet"), pd.read_parquet(full / "spectra.parquet")
    )


def test_a_second_signal_stops_at_once():
    messages = []
    stops = StopRequests(log=messages.append)
    with pytest.raises(RunInterrupted):  # during set-up there is no step to finish: at once
        stops._handle(signal.SIGINT, None)
    stops.requested, stops.training = None, True
    stops.stop_now_if_requested()  # nothing asked yet: carries on
    stops._handle(signal.SIGINT, None)
    assert stops.requested == "SIGINT" and "send it again to stop at once" in messages[0]
    with pytest.raises(RunInterrupted) as second:
        stops._handle(signal.SIGTERM, None)
    assert second.value.signal_name == "SIGTERM"
    with pytest.raises(KeyboardInterrupt):  # Ctrl-C's exit path (cli.py: exit 130)
        stops.stop_now_if_requested()


def test_ctrl_c_records_interrupted_not_failed(tmp_path, cache_dir):
    result = grpo_run(tmp_path, cache_dir, *fault_at(3, "interrupt"))
    assert result.exit_code == 130
    record = status(run_dir(tmp_path))
    assert record["status"] == "interrupted" and record["stopped_by"] == "SIGINT"
    assert record["last_step"] == 2 and record["error"] is None
    assert ("interrupted by SIGINT after step 2; re-run the same command to resume at step 2"
            in result.output)  # smoke: checkpoint_every=2
    assert "it/s]" not in result.output  # progress=false: no tqdm bar from transformers either


def test_interrupt_before_any_checkpoint_says_a_rerun_starts_over(tmp_path, cache_dir):
    result = grpo_run(tmp_path, cache_dir, "checkpoint_every=100", *fault_at(1, "interrupt"))
    assert result.exit_code == 130
    assert status(run_dir(tmp_path))["checkpoint_step"] is None
    assert ("interrupted by SIGINT after step 0; no checkpoint yet: re-running the same command "
            "starts over") in result.output


def test_param_regex_matching_nothing_is_refused_before_training(tmp_path, cache_dir):
    result = grpo_run(tmp_path, cache_dir, "probes.param_regex=matchesnothing")
    assert result.exit_code == 2
    assert "config error: probes.param_regex='matchesnothing' matches no trainable parameter" in result.output
    assert "Traceback" not in result.output
    out = run_dir(tmp_path, "R4-grpo-s0-probes.param_regex=matchesnothing")
    assert status(out)["status"] == "failed"
    assert not (out / "metrics.csv").exists()  # refused before the first step


def test_restart_from_step_0_leaves_no_duplicate_rows_and_lf_endings(tmp_path, cache_dir):
    short = "train.steps=2"
    assert grpo_run(tmp_path, cache_dir, short).exit_code == 0
    out = run_dir(tmp_path, "R4-grpo-s0-train.steps=2")
    first = {name: (out / name).read_bytes() for name in TABLES}
    assert grpo_run(tmp_path, cache_dir, short, "resume=false").exit_code == 0  # over old files
    assert pd.read_csv(out / "eval.csv")["step"].tolist() == [0, 2]
    for name in TABLES:
        assert b"\r" not in (out / name).read_bytes(), name
        assert (out / name).read_bytes() == first[name], name

    # killed before the first checkpoint
    assert grpo_run(tmp_path / "crashed", cache_dir, short, *fault_at(1)).exit_code != 0
    assert grpo_run(tmp_path / "crashed", cache_dir, short).exit_code == 0
    crashed = run_dir(tmp_path / "crashed", "R4-grpo-s0-train.steps=2")
    for name in TABLES:
        assert (crashed / name).read_bytes() == first[name], name


def test_corrupt_checkpoint_is_named_and_the_previous_one_used(tmp_path, cache_dir):
    overrides = ("train.steps=3", "checkpoint_every=1")
    name = "R4-grpo-s0-train.steps=3"
    assert grpo_run(tmp_path / "full", cache_dir, *overrides).exit_code == 0
    kept = run_dir(tmp_path / "full", name) / "checkpoints"
    assert (kept / "latest.pt").exists() and not (kept / "previous.pt").exists()  # completed: the last only
    assert grpo_run(tmp_path / "cut", cache_dir, *overrides, *fault_at(2)).exit_code != 0
    out = run_dir(tmp_path / "cut", name)
    latest, previous = out / "checkpoints" / "latest.pt", out / "checkpoints" / "previous.pt"
    assert previous.exists()
    latest.write_bytes(latest.read_bytes()[:1000])  # a copy cut short

    result = grpo_run(tmp_path / "cut", cache_dir, *overrides)
    assert result.exit_code == 0, result.output
    assert f"checkpoint unreadable, trying an earlier one: {latest}" in result.output
    record = status(out)
    assert record["status"] == "completed" and record["resumed_from"] == 1
    assert (out / "checkpoints" / "latest.pt.corrupt").exists()
    full = run_dir(tmp_path / "full", name)
    for table in TABLES:
        assert (out / table).read_bytes() == (full / table).read_bytes(), table


def test_no_readable_checkpoint_names_the_files_and_resume_false(tmp_path, cache_dir):
    assert grpo_run(tmp_path, cache_dir, *fault_at(3)).exit_code != 0
    latest = run_dir(tmp_path) / "checkpoints" / "latest.pt"
    latest.write_bytes(b"truncated")

    result = grpo_run(tmp_path, cache_dir)
    assert result.exit_code != 0
    error = status(run_dir(tmp_path))["error"]
    assert error.startswith("CheckpointError: no readable checkpoint") and str(latest) in error
    assert "resume=false" in error
    assert latest.exists()  # left for the user to inspect


def test_a_checkpoint_of_another_model_is_named_not_passed_over(tmp_path, cache_dir):
    """A latest.pt holding another model's weights once read as damaged ('no readable
    checkpoint', naming no key) and a resume would have fallen back past it to previous.pt."""
    import torch
    from conftest import tiny_llama

    assert grpo_run(tmp_path, cache_dir, *fault_at(3)).exit_code == 1
    latest = run_dir(tmp_path) / "checkpoints" / "latest.pt"
    other = tiny_llama(hidden_size=16, intermediate_size=32, head_dim=4)
    torch.save({"model": other.state_dict(), "next_step": 2}, latest)

    result = grpo_run(tmp_path, cache_dir)
    assert result.exit_code == 1, result.output
    error = status(run_dir(tmp_path))["error"]
    assert error.startswith(f"WeightsMismatchError: {latest}: its weights do not fit this model "
                            "(size mismatch for model.embed_tokens.weight: "), error
    assert error.endswith("; start over with resume=false"), error
    assert latest.exists() and not latest.with_name("latest.pt.corrupt").exists()


def test_held_sweep_member_is_refused_and_the_others_run(tmp_path, cache_dir):
    from grpo_cli.results.lock import RunLock

    held = run_dir(tmp_path, "R4-grpo-s0-train.steps=1")
    with RunLock(held):  # another live run holds this member's directory
        result = grpo_run(tmp_path, cache_dir, "rollout.group_size=2,4", "train.steps=1",
                          multirun=True)
    assert result.exit_code == 1, result.output
    assert f"refused: {held} is in use by pid {os.getpid()}" in result.output
    assert status(run_dir(tmp_path, "R2-grpo-s0-train.steps=1"))["status"] == "completed"
    assert not (held / "run.json").exists() and not (held / "metrics.csv").exists()
    assert "R4-grpo-s0-train.steps=1                 refused" in result.output


def test_a_killed_run_leaves_no_stuck_lock(tmp_path, cache_dir):
    process = spawn_run(tmp_path, cache_dir, *LONGER)
    out = run_dir(tmp_path, LONGER_NAME)
    wait_until(lambda: status(out).get("status") == "running", process)
    process.kill()  # SIGKILL: no handler runs, the holder file stays behind
    process.wait(timeout=60)
    assert (out / ".lock.holder").exists()

    result = grpo_run(tmp_path, cache_dir, *LONGER)
    assert result.exit_code == 0, result.output
    assert status(out)["status"] == "completed"
    assert not (out / ".lock.holder").exists()


def test_a_checkpoint_that_cannot_be_written_names_the_file_and_the_free_space(tmp_path, cache_dir):
    """A checkpoint the disk cannot take (here a directory stands where its temporary file goes,
    as a full disk would fail the write) fails the run naming the file, the space it needs, the
    space free and what to change, not torch's zip-writer assertion; the rows so far stay."""
    out = run_dir(tmp_path, "R4-grpo-s0-train.steps=2")
    blocker = out / "checkpoints" / "latest.tmp"
    blocker.mkdir(parents=True)
    result = grpo_run(tmp_path, cache_dir, "train.steps=2", "checkpoint_every=1")
    assert result.exit_code == 1 and "Traceback" not in result.output, result.output
    record = status(out)
    assert record["status"] == "failed"
    error = record["error"]
    assert error.startswith("FileWriteError: could not write the checkpoint " + str(out / "checkpoints" / "latest.pt"))
    assert re.search(r"it needs about [\d.]+ (KiB|MiB|GiB) and its disk had [\d.]+ (KiB|MiB|GiB) "
                     r"free", error) and "results_dir=" in error
    assert pd.read_csv(out / "metrics.csv")["step"].tolist() == [0]
    assert blocker.is_dir()  # not the run's file: left alone


def test_a_resume_with_another_learning_rate_is_refused_naming_it(tmp_path, cache_dir):
    """A run crashed at step 2 with optim.lr=0.001, re-run into the same directory with 0.01,
    once resumed, completed and left config.yaml claiming 0.01 for the whole run (issue 63)."""
    out = tmp_path / "smoke" / "pinned"
    pinned = f"hydra.run.dir={out}"
    assert grpo_run(tmp_path, cache_dir, pinned, "optim.lr=0.001", *fault_at(2)).exit_code == 1
    before = {path: path.read_bytes() for path in out.rglob("*") if path.is_file()}
    assert "lr: 0.001" in (out / "config.yaml").read_text()

    refused = grpo_run(tmp_path, cache_dir, pinned, "optim.lr=0.01")
    assert refused.exit_code == 2, refused.output
    assert [line for line in refused.output.splitlines() if line.strip()] == [
        f"config error: {out} holds a run with other settings: optim.lr: 0.001 -> 0.01; resuming "
        "would mix two configurations: resume=false starts over, resume_mismatch=allow resumes anyway"]
    assert {path: path.read_bytes() for path in out.rglob("*") if path.is_file()} == before

    allowed = grpo_run(tmp_path, cache_dir, pinned, "optim.lr=0.01", "resume_mismatch=allow")
    assert allowed.exit_code == 0, allowed.output
    assert status(out)["status"] == "completed" and status(out)["resumed_from"] == 2


def test_a_sweep_resume_with_another_thread_count_is_refused_naming_it(tmp_path, cache_dir):
    """The sweep path of the resume guard (hydra_app.sweep_problems, before any member starts),
    under Hydra's basic launcher and the joblib one: threads changes results (summation order)
    but is left out of run names, so both members would resume their crashed runs under
    another setting. Each is named with its key, exit 2, and no file changes."""
    sweep = ("rollout.group_size=2,4", "train.steps=3")
    crashed = grpo_run(tmp_path, cache_dir, *sweep, *fault_at(2), multirun=True)
    assert crashed.exit_code == 1, crashed.output  # a failed sweep exits 1; both checkpointed at 2
    runs = [run_dir(tmp_path, f"R{size}-grpo-s0-train.steps=3") for size in (2, 4)]
    assert all((run / "checkpoints" / "latest.pt").is_file() for run in runs)
    before = {path: path.read_bytes() for path in tmp_path.rglob("*") if path.is_file()}
    for launcher in ((), ("hydra/launcher=local_parallel",)):
        refused = grpo_run(tmp_path, cache_dir, *sweep, "threads=2", *launcher, multirun=True)
        assert refused.exit_code == 2, refused.output
        lines = [line for line in refused.output.splitlines() if line.strip()]
        assert len(lines) == 2, refused.output
        for run in runs:
            assert sum(f"{run} holds a run with other settings: threads: 1 -> 2; resuming would mix "
                       "two configurations" in line for line in lines) == 1, (run, refused.output)
        assert {path: path.read_bytes() for path in tmp_path.rglob("*") if path.is_file()} == before


def test_a_resume_may_change_only_keys_that_do_not_change_results():
    from grpo_cli.train.resume_guard import differences

    stored = {"optim": {"lr": 0.001, "betas": [0.9, 0.99]}, "progress": True, "fault": {"step": 2},
              "logger": {"wandb": False}, "threads": 1}
    assert differences(stored, stored | {"progress": False, "fault": {"step": None},
                                         "logger": {"wandb": True}}) == []
    assert differences(stored, stored | {"threads": 2, "optim": {"lr": 0.001, "betas": [0.9, 0.9]},
                                         "seed": 1}) == [
        ("optim.betas", [0.9, 0.99], [0.9, 0.9]), ("seed", "<absent>", 1), ("threads", 1, 2)]


def test_sigterm_during_a_warm_start_stops_at_once(tmp_path):
    """The first SIGTERM once only asked the loop to stop after its step, while a warm start
    (set-up, minutes long) went on: acknowledged and ignored (issue 63)."""
    cache = tmp_path / "cache"
    process = spawn_run(tmp_path, cache, "model.warm_start.steps=5000")  # minutes on 2 cores
    wait_until(lambda: any(cache.rglob("*.partial")), process)  # the warm start is being built
    time.sleep(1.0)
    process.send_signal(signal.SIGTERM)
    try:
        output = process.communicate(timeout=60)[0]
    finally:
        process.kill()  # a no-op once it has ended; else it would warm-start on for minutes
    assert process.returncode == 143, output
    record = status(run_dir(tmp_path, "R4-grpo-s0-model.warm_start.steps=5000"))
    assert record["status"] == "interrupted" and record["stopped_by"] == "SIGTERM", record
    assert "no checkpoint yet: re-running the same command starts over" in output


def test_a_sigterm_after_a_steps_status_write_still_stops_with_its_checkpoint(tmp_path, cache_dir):
    """A SIGTERM landing after a step's run.json write and before the loop's stop check once
    ended the run without the checkpoint it promised (checkpoint_every=100: none at all, so a
    re-run started over). fault.kind=sigterm raises it in that window, in this process."""
    assert grpo_run(tmp_path / "full", cache_dir, "checkpoint_every=100").exit_code == 0
    result = grpo_run(tmp_path / "cut", cache_dir, "checkpoint_every=100", *fault_at(1, "sigterm"))
    assert result.exit_code == 143, result.output
    out = run_dir(tmp_path / "cut")
    record = status(out)
    assert record["status"] == "interrupted" and record["stopped_by"] == "SIGTERM", record
    assert record["last_step"] == 1 and record["checkpoint_step"] == 2, record
    assert ("interrupted by SIGTERM after step 1; re-run the same command to resume at step 2"
            in result.output)

    resumed = grpo_run(tmp_path / "cut", cache_dir, "checkpoint_every=100")
    assert resumed.exit_code == 0, resumed.output
    assert status(out)["status"] == "completed" and status(out)["resumed_from"] == 2
    full = run_dir(tmp_path / "full")
    for name in TABLES:
        assert (out / name).read_bytes() == (full / name).read_bytes(), name


def test_a_signal_inside_a_deferred_block_stops_the_run_at_its_end():
    """A checkpoint's renames and the record of its step are one block (run.py's
    _Recorder.checkpoint): a second signal there stops the run once both are done, so run.json
    never names another checkpoint than the one on disk."""
    stops = StopRequests(log=[].append)
    stops.training = True
    stops._handle(signal.SIGTERM, None)  # the first: finish the step, checkpoint, stop
    reached = []
    with pytest.raises(RunInterrupted) as stopped:
        with stops.deferred():
            stops._handle(signal.SIGINT, None)  # the second: at once, but not inside the block
            reached.append("end of block")
    assert reached == ["end of block"] and stopped.value.signal_name == "SIGINT"
    fresh = StopRequests(log=[].append)
    fresh.training = True
    with fresh.deferred():  # a first signal inside a block only asks, as anywhere else
        fresh._handle(signal.SIGTERM, None)
    assert fresh.requested == "SIGTERM"
    with pytest.raises(RunInterrupted):  # outside any block the second one stops at once
        fresh._handle(signal.SIGTERM, None)
