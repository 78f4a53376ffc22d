"""Nothing runs from a file a run reads (issue 41): checkpoints are tensors and plain data, read
with `weights_only=True`; a planted pickle is refused in one line naming it, under `grpo probe`
and on resume, and never executes (checked by the file it would create). A damaged
`initial_layers.pt` or `run.json` is one line naming the file, exit 1."""

from __future__ import annotations

import json
import os
import shlex
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from cli_helpers import fault_at, grpo_run, run_dir
from typer.testing import CliRunner

from grpo_cli.cli import app


class Planted:
    """What a hostile checkpoint holds: unpickling it runs a shell command."""

    def __init__(self, marker: Path):
        self.command = f"touch {shlex.quote(str(marker))}"

    def __reduce__(self):
        return os.system, (self.command,)


def plant(path: Path, marker: Path) -> Path:
    """A file shaped like a grpo checkpoint whose `model` runs `touch marker` when unpickled."""
    torch.save({"next_step": 2, "model": Planted(marker)}, path)
    return path


SAVE_EVERY_STEP = ("checkpoint_every=1", "keep_checkpoints=true")  # not part of the run's name


def lines(output: str) -> list[str]:
    return [line for line in output.splitlines() if line.strip()]


@pytest.fixture(scope="module")
def crashed(tmp_path_factory, cache_dir):
    """A smoke run that crashed at step 3: latest.pt continues at step 3, previous.pt at 2, and
    the weights of steps 1-3 kept as step_<N>.pt."""
    results = tmp_path_factory.mktemp("crashed")
    result = grpo_run(results, cache_dir, *SAVE_EVERY_STEP, *fault_at(3))
    assert result.exit_code != 0, result.output
    return run_dir(results)


def copy_run(source: Path, root: Path) -> Path:
    """A copy of a run directory at the same place under `root` (so a re-run finds it)."""
    import shutil

    target = root / "smoke" / source.name
    shutil.copytree(source, target)
    return target


def test_the_planted_file_runs_its_command_when_unpickled(tmp_path):
    """The control: without weights_only the planted file does what the tests below forbid."""
    marker = tmp_path / "ran"
    torch.load(plant(tmp_path / "planted.pt", marker), weights_only=False)
    assert marker.exists()


def test_probe_of_a_planted_checkpoint_file_refuses_it_unread(tmp_path, crashed):
    marker = tmp_path / "ran"
    planted = plant(copy_run(crashed, tmp_path) / "checkpoints" / "shared.pt", marker)
    result = CliRunner().invoke(app, ["probe", str(planted), "--out", str(tmp_path / "out")],
                                catch_exceptions=True)
    assert not marker.exists()
    assert result.exit_code == 1, result.output
    assert lines(result.output) == [
        f"probe error: {planted}: refused: it holds pickled objects beyond tensors and plain "
        "data, which could run code as it loads (Trying to load unsupported GLOBAL posix.system "
        "whose module posix is blocked.); grpo-cli writes none, so this file was not written by "
        "grpo-cli or was altered"]
    assert not (tmp_path / "out").exists()  # refused before anything was built


def test_grpo_debug_shows_the_refusal_with_its_traceback(tmp_path, crashed, monkeypatch):
    from grpo_cli.train.checkpoint import UnsafeCheckpointError

    marker = tmp_path / "ran"
    planted = plant(copy_run(crashed, tmp_path) / "checkpoints" / "shared.pt", marker)
    monkeypatch.setenv("GRPO_DEBUG", "1")
    result = CliRunner().invoke(app, ["probe", str(planted), "--out", str(tmp_path / "out")],
                                catch_exceptions=True)
    assert isinstance(result.exception, UnsafeCheckpointError) and str(planted) in str(result.exception)
    assert not marker.exists()


def test_probe_of_every_checkpoint_refuses_a_planted_one_unread(tmp_path, crashed):
    out = copy_run(crashed, tmp_path)
    marker = tmp_path / "ran"
    planted = plant(out / "checkpoints" / "step_000001.pt", marker)
    result = CliRunner().invoke(app, ["probe", str(out), "--all-checkpoints", "--out",
                                      str(tmp_path / "probe")], catch_exceptions=True)
    assert not marker.exists()
    assert result.exit_code == 1, result.output
    assert lines(result.output)[-1].startswith(f"probe error: {planted}: refused: it holds pickled")
    assert "Traceback" not in result.output


def test_resume_refuses_a_planted_latest_checkpoint_naming_it(tmp_path, crashed, cache_dir):
    """The planted latest.pt is not passed over as 'unreadable' to previous.pt: the run stops
    and names it; moved away, the run resumes from previous.pt."""
    out = copy_run(crashed, tmp_path)
    marker = tmp_path / "ran"
    latest = plant(out / "checkpoints" / "latest.pt", marker)
    result = grpo_run(tmp_path, cache_dir, *SAVE_EVERY_STEP)
    assert not marker.exists()
    assert result.exit_code == 1, result.output
    assert "Traceback" not in result.output and "checkpoint unreadable" not in result.output
    last = lines(result.output)[-1]
    assert f"failed: UnsafeCheckpointError: {latest}: refused: it holds pickled objects" in last
    assert last.endswith("move it away to resume from an earlier checkpoint, or start over with "
                         "resume=false")
    record = json.loads((out / "run.json").read_text())
    assert record["status"] == "failed" and str(latest) in record["error"]
    assert latest.exists() and not (out / "checkpoints" / "latest.pt.corrupt").exists()

    latest.rename(tmp_path / "quarantined.pt")
    resumed = grpo_run(tmp_path, cache_dir, *SAVE_EVERY_STEP)
    assert resumed.exit_code == 0, resumed.output
    record = json.loads((out / "run.json").read_text())
    assert record["status"] == "completed" and record["resumed_from"] == 2  # previous.pt
    assert not marker.exists()


def test_a_written_checkpoint_is_tensors_and_plain_data(tmp_path):
    """Everything save_checkpoint writes loads with weights_only=True, bf16 optimizer state
    (rounding generators as tensors, fp32 masters) and counters included."""
    from grpo_cli.algorithm.optim import MixedPrecisionAdamW
    from grpo_cli.train.alarms import AlarmMonitor
    from grpo_cli.train.checkpoint import read_checkpoint, save_checkpoint
    from grpo_cli.train.problem_success import ProblemSuccess

    model = torch.nn.Linear(8, 4).to(torch.bfloat16)
    optimizer = MixedPrecisionAdamW(model.parameters(), lr=1e-3, master_params=[model.weight])
    for param in model.parameters():
        param.grad = torch.ones_like(param)
    optimizer.step()
    success = ProblemSuccess()
    success.update([3], [[1.0, 0.0]])
    trainer = SimpleNamespace(model=model, optimizer=optimizer, value_head=None,
                              problem_success=success)
    path = tmp_path / "latest.pt"
    save_checkpoint(path, 5, trainer, AlarmMonitor())
    state = read_checkpoint(path)
    assert state["next_step"] == 5
    assert set(state["optimizer"]["rounding_generators"]) == {"cpu"}
    assert isinstance(state["optimizer"]["rounding_generators"]["cpu"], torch.Tensor)
    assert state["optimizer"]["state"][0]["master"].dtype == torch.float32
    assert state["problem_success"]["counts"] == {3: (1.0, 2)}


def test_a_damaged_initial_layers_file_is_one_line_naming_it(tmp_path, crashed, cache_dir):
    out = copy_run(crashed, tmp_path)
    initial = out / "checkpoints" / "initial_layers.pt"
    assert initial.exists()
    initial.write_bytes(initial.read_bytes()[:500])
    result = grpo_run(tmp_path, cache_dir, *SAVE_EVERY_STEP)
    assert result.exit_code == 1, result.output
    assert "Traceback" not in result.output
    last = lines(result.output)[-1]
    assert (f"failed: InputError: {initial}: unreadable (RuntimeError: PytorchStreamReader failed "
            "reading zip archive: failed finding central directory); delete it") in last
    assert last.endswith("delete it and re-run to save it again from the model's initial weights")
    assert json.loads((out / "run.json").read_text())["status"] == "failed"


@pytest.mark.parametrize(("text", "reason"), [
    ('{"status": "running",', "not a run status (Expecting "),
    ('["completed"]', "not a run status (a JSON list, not an object)"),
])
def test_a_run_json_that_is_not_an_object_is_one_line_naming_it(tmp_path, crashed, cache_dir,
                                                                text, reason):
    out = copy_run(crashed, tmp_path)
    status = out / "run.json"
    status.write_text(text)
    result = grpo_run(tmp_path, cache_dir, *SAVE_EVERY_STEP)
    assert result.exit_code == 1, result.output
    assert "Traceback" not in result.output
    last = lines(result.output)[-1]
    assert f"{status}: {reason}" in last
    assert last.endswith("delete it to resume from the run's checkpoints")
    assert status.read_text() == text  # left for the user to inspect


def test_a_bf16_run_with_stochastic_rounding_resumes_as_if_uninterrupted(tmp_path, cache_dir):
    """The rounding generators' states (tensors in the checkpoint) restore the same draws: a bf16
    run without masters, crashed at step 3 and resumed under weights_only, writes the files the
    uninterrupted run wrote."""
    bf16 = ("model.dtype=bfloat16", "model.master_weights=none")
    name = "R4-grpo-s0-model.dtype=bfloat16,model.master_weights=none"
    assert grpo_run(tmp_path / "full", cache_dir, *bf16).exit_code == 0
    assert grpo_run(tmp_path / "cut", cache_dir, *bf16, *fault_at(3)).exit_code != 0
    resumed = grpo_run(tmp_path / "cut", cache_dir, *bf16)
    assert resumed.exit_code == 0, resumed.output
    full, cut = run_dir(tmp_path / "full", name), run_dir(tmp_path / "cut", name)
    assert json.loads((cut / "run.json").read_text())["resumed_from"] == 2
    for table in ("metrics.csv", "eval.csv", "ranks.csv", "events.csv"):
        assert (cut / table).read_bytes() == (full / table).read_bytes(), table


def test_every_reader_of_torch_files_refuses_a_planted_pickle_unread(tmp_path):
    """runtime/files.load_plain is the one reader: checkpoints, weight snapshots, the probes'
    initial layers and running sums, and the TRL callback's probe state (which has no CLI to
    answer in one line, so it raises the same named error inside the user's script)."""
    from grpo_cli.runtime.files import UnsafeCheckpointError, load_plain

    marker = tmp_path / "ran"
    planted = tmp_path / "probe_state.pt"
    torch.save({"sums": Planted(marker)}, planted)
    with pytest.raises(UnsafeCheckpointError, match=rf"^{planted}: refused: it holds pickled objects"):
        load_plain(planted)
    assert not marker.exists()
    plain = tmp_path / "plain.pt"
    torch.save({"step": 3, "sums": {"a": torch.ones(2)}, "names": ["x"]}, plain)
    assert load_plain(plain)["sums"]["a"].tolist() == [1.0, 1.0]
