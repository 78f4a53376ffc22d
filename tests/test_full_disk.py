"""A full disk (issue 41): the run ends `failed` in run.json, leaves no temporary file, and its
last line names the file, the space it needs and the space free (MiB below 1 GiB), exit 1.

The disk is a real one, a small tmpfs mounted for the test (skipped where mounting is not
allowed, e.g. without root), or the ENOSPC of `fault.kind=disk_full` (grpo_cli/train/fault.py)."""

from __future__ import annotations

import errno
import json
import subprocess
from pathlib import Path

import pytest
from cli_helpers import fault_at, grpo_run, run_dir

from grpo_cli.results.writer import STATUS_RESERVE, RunResults


@pytest.fixture
def small_disk(tmp_path):
    """A tmpfs of 1280 KiB at tmp_path/disk: room for a smoke run's files and initial layers,
    not for its first checkpoint (~1.9 MB)."""
    mount = tmp_path / "disk"
    mount.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1280k", "tmpfs", str(mount)],
                          capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
    yield mount
    subprocess.run(["umount", "--lazy", str(mount)], check=True)  # the run's log may stay open


def fill(directory: Path) -> Path:
    """Write a file in `directory` until its disk has no room left; return it."""
    ballast = directory / "ballast"
    with open(ballast, "wb", buffering=0) as handle:
        try:
            while True:
                handle.write(b"\1" * 4096)
        except OSError as error:
            assert error.errno == errno.ENOSPC
    return ballast


def status(results: RunResults) -> dict:
    return json.loads((results.run_dir / "run.json").read_text())


def test_status_file_is_written_on_a_full_disk_from_its_reserve(small_disk):
    """The reserve kept while the run goes takes the write that finds the disk full; a `running`
    one still raises (the run must stop), its final status then fits in the room freed."""
    results = RunResults(small_disk / "run")
    results.write_status({"status": "running", "last_step": 0})
    assert (results.run_dir / STATUS_RESERVE).is_file()
    fill(small_disk)
    with pytest.raises(OSError):  # the disk is full indeed
        (small_disk / "other.json").write_text("{}" * 4096)

    with pytest.raises(OSError) as full:
        results.write_status({"status": "running", "last_step": 1})
    assert full.value.errno == errno.ENOSPC and status(results)["last_step"] == 1
    results.write_status({"status": "failed", "last_step": 1, "error": "disk full"})
    assert status(results)["status"] == "failed"
    assert sorted(path.name for path in results.run_dir.iterdir()) == ["checkpoints", "run.json"]


def test_without_room_the_status_write_fails_and_leaves_no_temporary(small_disk):
    results = RunResults(small_disk / "run")
    (results.run_dir / "run.json").write_text('{"status": "running"}\n')
    fill(small_disk)
    with pytest.raises(OSError) as error:  # no reserve was kept: nothing to fall back on
        results.write_status({"status": "failed"})
    assert error.value.errno == errno.ENOSPC
    assert not (results.run_dir / "run.json.tmp").exists()


def test_tables_rewritten_on_a_full_disk_leave_no_temporary(small_disk):
    results = RunResults(small_disk / "run")
    results.ensure_files()
    results.metrics.append([{"step": 0, "loss": 1.0}])
    fill(small_disk)
    with pytest.raises(OSError):
        results.spectra.append([{"step": 0, "matrix": "m", "layer": "l", "group": "0", "k": 0,
                                 "sigma": 1.0}] * 5000)
    with pytest.raises(OSError):
        results.metrics.truncate_from(0)  # rewritten through a temporary
    assert not list(results.run_dir.glob("*.tmp"))


def test_a_run_on_a_full_disk_ends_failed_with_the_free_space_as_its_last_line(small_disk, cache_dir):
    result = grpo_run(small_disk, cache_dir)  # smoke: first checkpoint after step 2
    assert result.exit_code == 1, result.output
    assert "Traceback" not in result.output
    out = run_dir(small_disk)
    latest = out / "checkpoints" / "latest.pt"
    record = json.loads((out / "run.json").read_text())
    assert record["status"] == "failed" and record["last_step"] == 1
    last = [line for line in result.output.splitlines() if line.strip()][-1]
    assert f"failed: FileWriteError: could not write the checkpoint {latest}: it needs about " in last
    needed, free = last.split("it needs about ")[1].split(" free ")[0].split(" and its disk had ")
    assert needed.endswith(" MiB") and 1.5 <= float(needed.split()[0]) <= 3  # not "0.00 GiB"
    assert free.endswith(" KiB") and 100 < int(free.split()[0]) < 1280  # what the checkpoint found
    assert last.endswith("(results_dir=...); a run keeps two checkpoints")
    assert record["error"] in last
    assert not list(out.rglob("*.tmp")) and not (out / STATUS_RESERVE).exists()


def test_an_enospc_anywhere_ends_failed_naming_the_directory_and_its_free_space(tmp_path, cache_dir):
    result = grpo_run(tmp_path, cache_dir, *fault_at(1, "disk_full"))
    assert result.exit_code == 1, result.output
    assert "Traceback" not in result.output
    out = run_dir(tmp_path)
    record = json.loads((out / "run.json").read_text())
    assert record["status"] == "failed" and record["last_step"] == 0
    last = [line for line in result.output.splitlines() if line.strip()][-1]
    assert f"failed: FileWriteError: could not write {out}: its disk is full (" in last
    assert " free; OSError: No space left on device (fault.kind=disk_full at step 1)); " in last
    assert last.endswith("free space or write the results elsewhere (results_dir=...)")
    assert record["error"].startswith(last.split("failed: ", 1)[1])
    assert record["error"].endswith("[fault.step=1 fault.kind=disk_full was set: a failure on purpose]")
    assert not list(out.rglob("*.tmp")) and not (out / STATUS_RESERVE).exists()
