"""Careless or hostile inputs answered in one line naming the file, key or column, with exit 2
for settings and 1 for data (issue 41, finding 5)."""

from __future__ import annotations

import json

import pandas as pd
from cli_helpers import grpo_run
from results_factory import write_sweep
from typer.testing import CliRunner

from grpo_cli.cli import app


def printed(result) -> list[str]:
    return [line for line in result.output.splitlines() if line.strip()]


# ---- grpo run: settings ----------------------------------------------------------------------------
def test_experiment_name_that_leaves_results_dir_is_refused(tmp_path):
    results = tmp_path / "a" / "b" / "results"
    for multirun in (False, True):
        result = grpo_run(results, tmp_path / "cache", "experiment.name=../..", "seed=0,1" if multirun else "seed=0",
                          multirun=multirun)
        assert result.exit_code == 2, result.output
        assert "experiment.name='../..': must be a relative name under results_dir" in result.output
        assert not (tmp_path / "a").exists()  # nothing created, inside or outside


def test_a_sweep_over_a_key_left_out_of_run_names_is_refused(tmp_path):
    """threads=1,2 once ran twice into one directory (R4-grpo-s0), the second resuming the first."""
    result = grpo_run(tmp_path, tmp_path / "cache", "threads=1,2", multirun=True)
    assert result.exit_code == 2, result.output
    assert printed(result) == [
        f"config error: threads: 2 sweep members would share one run directory "
        f"({tmp_path / 'smoke' / 'R4-grpo-s0'}), since run names leave threads out (settings that do "
        "not change results: hydra.job.config.override_dirname.exclude_keys in conf/config.yaml); "
        "run each value as its own command with its own experiment.name"]
    assert not (tmp_path / "smoke").exists()


def test_a_type_error_in_an_override_is_one_line_and_exit_2(tmp_path):
    result = grpo_run(tmp_path, tmp_path / "cache", "rollout.group_size=abc")
    assert result.exit_code == 2, result.output
    assert printed(result) == ["config error: Error merging override rollout.group_size=abc: "
                               "Value 'abc' of type 'str' could not be converted to Integer"]
    unknown = grpo_run(tmp_path, tmp_path / "cache", "experiment=nosuch")
    assert unknown.exit_code == 2 and len(printed(unknown)) == 1, unknown.output
    assert "Could not find 'experiment/nosuch'" in unknown.output and "smoke" in unknown.output


def test_a_config_group_option_outside_conf_is_refused(tmp_path):
    """experiment=../../x once loaded a YAML from outside conf/ (issue 63)."""
    outside = tmp_path / "evil.yaml"
    outside.write_text("# @package _global_\nexperiment:\n  name: evil\n")
    relative = "../" * 12 + str(outside.with_suffix(""))[1:]  # conf/experiment/../../... -> /tmp/...
    for multirun, value in ((False, relative), (True, f"smoke,{relative}")):
        result = grpo_run(tmp_path, tmp_path / "cache", f"experiment={value}", multirun=multirun)
        assert result.exit_code == 2, result.output
        assert printed(result) == [f"config error: experiment={value!r}: a config group option names "
                                   "a file under conf/experiment/ (no '..' or absolute path)"]
    assert not (tmp_path / "evil").exists() and not (tmp_path / "smoke").exists()


def test_a_run_directory_outside_results_dir_is_refused(tmp_path):
    """hydra.run.dir=/elsewhere was once honoured: results written outside results_dir (issue 63)."""
    elsewhere = tmp_path / "elsewhere"
    result = grpo_run(tmp_path / "results", tmp_path / "cache", f"hydra.run.dir={elsewhere}")
    assert result.exit_code == 2, result.output
    assert printed(result) == [f"config error: hydra.run.dir={elsewhere}: must be under results_dir="
                               f"{tmp_path / 'results'} (grpo run writes nothing outside results_dir)"]
    assert not elsewhere.exists()


def test_a_deleted_working_directory_is_one_line(tmp_path):
    import subprocess
    import sys
    from pathlib import Path

    repo = Path(__file__).resolve().parents[1]
    gone = tmp_path / "gone"
    gone.mkdir()
    script = (f"cd {gone} && rmdir {gone} && PYTHONPATH={repo} {sys.executable} -m grpo_cli.cli run "
              f"experiment=smoke results_dir={tmp_path / 'results'}")
    done = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=300)
    assert done.returncode == 1, done.stderr  # once a bare FileNotFoundError from Hydra's os.getcwd
    assert [line for line in (done.stdout + done.stderr).splitlines() if line.strip()] == [
        "error: the working directory no longer exists (deleted?); cd into an existing directory and "
        "run the command again"]


# ---- grpo run: model directories --------------------------------------------------------------------
def test_an_empty_model_directory_is_named_not_a_tokenizer_hint(tmp_path):
    empty = tmp_path / "model"
    empty.mkdir()
    result = grpo_run(tmp_path / "results", tmp_path / "cache", "model=hf", f"model.path={empty}")
    assert result.exit_code == 1, result.output
    lines = printed(result)
    assert len(lines) == 1 and f"{empty} has no model files (no config.json, no weights" in lines[0], result.output
    assert "sentencepiece" not in result.output


def test_damaged_weights_are_one_line_naming_the_file(tmp_path):
    from conftest import tiny_llama

    from grpo_cli.models.char_tokenizer import build_char_tokenizer

    model_dir = tmp_path / "model"
    tokenizer = build_char_tokenizer()
    tiny_llama(tokenizer=tokenizer).save_pretrained(model_dir)
    tokenizer.save_pretrained(model_dir)
    weights = model_dir / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:1000])  # cut short, as a partial download leaves it
    result = grpo_run(tmp_path / "results", tmp_path / "cache", "model=hf", f"model.path={model_dir}")
    assert result.exit_code == 1, result.output
    lines = printed(result)
    assert len(lines) == 1 and f"{model_dir}: model.safetensors could not be read (SafetensorError" in lines[0]
    assert "Traceback" not in result.output


# ---- grpo analyze --------------------------------------------------------------------------------
def analyze(root):
    return CliRunner().invoke(app, ["analyze", str(root)])


def test_infinite_ranks_and_steps_are_one_warning_each_not_a_crash(tmp_path):
    root = write_sweep(tmp_path / "toy", group_sizes=(2, 4), seeds=(0, 1), steps=10, probe_every=2)
    path = root / "R4-grpo-s0" / "ranks.csv"
    ranks = pd.read_csv(path).astype({"erank_entropy": object, "step": object})
    ranks["erank_entropy"] = "inf"  # every value: the axis limits once became inf ("error: Axis limits")
    ranks.loc[0, "step"] = "inf"  # once "error: Cannot convert non-finite values (NA or inf) to integer"
    ranks.to_csv(path, index=False)
    result = analyze(root)
    assert result.exit_code == 0, result.output
    assert "warning: R4-grpo-s0: ranks.csv line 2, column step: 'inf' is not a number (row left out)" in result.output
    assert ("warning: R4-grpo-s0: ranks.csv line 3, column erank_entropy: inf is not a number "  # line 2 left out
            "(infinite; left out)") in result.output


def test_text_last_step_in_run_json_is_one_warning_not_a_crash(tmp_path):
    root = write_sweep(tmp_path / "toy", group_sizes=(2, 4), seeds=(0, 1), steps=10, probe_every=2)
    path = root / "R4-grpo-s0" / "run.json"
    path.write_text(json.dumps(json.loads(path.read_text()) | {"last_step": "nine"}))
    result = analyze(root)
    assert result.exit_code == 0, result.output  # once a numpy UFuncTypeError after 10 figures
    assert "warning: R4-grpo-s0: run.json, field last_step: 'nine' is not a number (left out)" in result.output


# ---- no code from a model directory (issue 63) ---------------------------------------------------
def evil_model_dir(root) -> tuple:
    """A model directory whose config.json names an unknown model_type and maps it to a planted
    configuration_evil.py, which writes `marker` if it is ever imported."""
    model_dir, marker = root / "evil", root / "marker"
    model_dir.mkdir()
    (model_dir / "configuration_evil.py").write_text(
        f"from pathlib import Path\nPath({str(marker)!r}).write_text('ran')\n"
        "from transformers import PretrainedConfig\n\n\n"
        "class EvilConfig(PretrainedConfig):\n    model_type = 'evil'\n")
    auto_map = {"AutoConfig": "configuration_evil.EvilConfig",
                "AutoModelForCausalLM": "configuration_evil.EvilConfig"}
    (model_dir / "config.json").write_text(json.dumps({"model_type": "evil", "auto_map": auto_map}))
    (model_dir / "model.safetensors").write_bytes(b"\0" * 64)  # past the check for weight files
    return model_dir, marker


def test_grpo_run_never_runs_code_from_a_model_directory_even_when_told_yes(tmp_path):
    model_dir, marker = evil_model_dir(tmp_path)
    result = CliRunner().invoke(app, ["run", "experiment=smoke", f"results_dir={tmp_path / 'results'}",
                                      f"cache_dir={tmp_path / 'cache'}", "progress=false", "device=cpu",
                                      "model=hf", f"model.path={model_dir}"], input="y\n")
    assert not marker.exists()  # transformers once asked "run the custom code? [y/N]" and ran it
    assert result.exit_code == 1, result.output
    lines = printed(result)
    assert len(lines) == 1 and str(model_dir) in lines[0] and "custom code" in lines[0], result.output
    assert "[y/N]" not in result.output


def test_grpo_probe_never_runs_code_from_a_model_directory_even_when_told_yes(tmp_path):
    model_dir, marker = evil_model_dir(tmp_path)
    result = CliRunner().invoke(app, ["probe", str(model_dir), "--group-sizes", "2", "--out",
                                      str(tmp_path / "probe"), "experiment=smoke", "device=cpu",
                                      f"results_dir={tmp_path / 'results'}", f"cache_dir={tmp_path / 'cache'}",
                                      "progress=false"], input="y\n")
    assert not marker.exists()
    assert result.exit_code == 1, result.output
    lines = [line for line in printed(result) if not line.startswith("[")]
    assert len(lines) == 1 and str(model_dir) in lines[0] and "custom code" in lines[0], result.output


def test_a_model_directory_without_a_tokenizer_names_the_tokenizer_files(tmp_path):
    model_dir = tmp_path / "model"
    model_dir.mkdir()
    (model_dir / "config.json").write_text(json.dumps({"model_type": "llama"}))
    (model_dir / "model.safetensors").write_bytes(b"\0" * 64)
    result = grpo_run(tmp_path / "results", tmp_path / "cache", "model=hf", f"model.path={model_dir}")
    assert result.exit_code == 1, result.output
    lines = printed(result)
    assert len(lines) == 1, result.output  # once "install sentencepiece or tiktoken"
    assert f"{model_dir} has no model files (no tokenizer (tokenizer.json, tokenizer.model" in lines[0]


def misshapen_model_dir(root):
    """The tiny Llama's directory with config.json's intermediate_size doubled: its six MLP
    weights ([32, 64] and [64, 32] in model.safetensors) no longer fit the model it describes."""
    from test_models import save_tiny_llama

    model_dir = root / "misshapen"
    save_tiny_llama(model_dir)
    config = json.loads((model_dir / "config.json").read_text())
    (model_dir / "config.json").write_text(json.dumps(config | {"intermediate_size": 128}))
    return model_dir


def mismatch_line(model_dir) -> str:
    return (f"model.path={str(model_dir)!r}: its weights do not fit the model its config.json "
            "describes (model.layers.0.mlp.down_proj.weight: [32, 64] in the weight files, "
            "[32, 128] in the model; 6 weights differ)")


def test_grpo_run_on_weights_that_do_not_fit_their_config_is_one_line(tmp_path):
    """transformers' 17-line load report (a table of keys) once came first, then a line calling
    the file damaged. In its own process: transformers logs to the stderr it found at import."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    model_dir = misshapen_model_dir(tmp_path)
    repo = Path(__file__).resolve().parents[1]
    command = [sys.executable, "-m", "grpo_cli.cli", "run", "experiment=smoke", "model=hf",
               f"model.path={model_dir}", f"results_dir={tmp_path / 'results'}",
               f"cache_dir={tmp_path / 'cache'}", "progress=false", "device=cpu"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300, cwd=repo,
                          env={**os.environ, "PYTHONPATH": str(repo), "OMP_NUM_THREADS": "1"})
    assert done.returncode == 1, done.stdout + done.stderr
    lines = [line for line in (done.stdout + done.stderr).splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].endswith(mismatch_line(model_dir)), lines
    (status,) = (tmp_path / "results" / "smoke").glob("*/run.json")  # named by model.path
    assert json.loads(status.read_text())["error"] == f"ModelLoadError: {mismatch_line(model_dir)}"


def test_grpo_probe_on_weights_that_do_not_fit_their_config_is_one_line(tmp_path):
    model_dir = misshapen_model_dir(tmp_path)
    result = CliRunner().invoke(app, ["probe", str(model_dir), "--group-sizes", "2", "--out",
                                      str(tmp_path / "probe"), "experiment=smoke", "device=cpu",
                                      f"cache_dir={tmp_path / 'cache'}", "progress=false"])
    assert result.exit_code == 1, result.output
    lines = [line for line in printed(result) if not line.startswith("[")]
    assert lines == [f"probe error: {mismatch_line(model_dir)}"], result.output


def test_a_loaded_model_directory_with_keys_missing_still_shows_transformers_report(tmp_path):
    """Only a size mismatch is replaced by one line: a report of missing or unexpected keys
    (weights transformers initialises anew) is logged as before."""
    import logging

    import torch
    from safetensors.torch import load_file, save_file
    from test_models import save_tiny_llama

    from grpo_cli.models.loading import load_pretrained

    model_dir = tmp_path / "model"
    save_tiny_llama(model_dir)
    weights = load_file(model_dir / "model.safetensors")
    del weights["model.norm.weight"]
    save_file(weights, model_dir / "model.safetensors", metadata={"format": "pt"})
    seen = []

    class Seen(logging.Handler):
        def emit(self, record):
            seen.append(record.getMessage())

    logger, handler = logging.getLogger("transformers.modeling_utils"), Seen()
    logger.addHandler(handler)
    try:
        load_pretrained(str(model_dir), torch.device("cpu"), torch.float32)
    finally:
        logger.removeHandler(handler)
    assert [message for message in seen if "LOAD REPORT" in message and "model.norm.weight" in message]


def test_analyze_refuses_an_output_directory_that_is_a_link(tmp_path):
    """analysis/ planted as a link to another directory once received all 18 outputs (issue 63)."""
    root = write_sweep(tmp_path / "toy", group_sizes=(2, 4), seeds=(0, 1), steps=10, probe_every=2)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (root / "analysis").symlink_to(elsewhere, target_is_directory=True)
    result = analyze(root)
    assert result.exit_code == 2, result.output
    assert printed(result) == [f"error: {root / 'analysis'}: a symbolic link; grpo analyze writes its "
                               "outputs only into a real directory (give --out another path)"]
    assert list(elsewhere.iterdir()) == []
    assert sorted(path.name for path in root.iterdir() if path.name.startswith(".")) == []

    nested = tmp_path / "nested"
    nested.mkdir()
    (root / "reports").symlink_to(nested, target_is_directory=True)
    deep = CliRunner().invoke(app, ["analyze", str(root), "--out", str(root / "reports" / "a")])
    assert deep.exit_code == 2 and f"{root / 'reports'}: a symbolic link" in deep.output, deep.output
    assert list(nested.iterdir()) == []


def test_analyze_builds_its_outputs_beside_the_target_and_renames_them_in(tmp_path):
    root = write_sweep(tmp_path / "toy", group_sizes=(2, 4), seeds=(0, 1), steps=10, probe_every=2)
    (root / "analysis").mkdir()
    (root / "analysis" / "notes.txt").write_text("mine\n")
    result = analyze(root)
    assert result.exit_code == 0, result.output
    written = {path.name for path in (root / "analysis").iterdir()}
    assert {"notes.txt", "summary.csv", "summary.md", "report.html"} <= written
    assert not [path for path in root.iterdir() if path.name.startswith(".analysis.")]  # no stage left


def test_ctrl_c_stops_grpo_analyze_with_exit_130_and_nothing_written(tmp_path):
    import os
    import signal
    import subprocess
    import sys
    import time
    from pathlib import Path

    root = write_sweep(tmp_path / "toy", group_sizes=(2, 4), seeds=(0, 1), steps=10, probe_every=2)
    repo = Path(__file__).resolve().parents[1]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(repo), os.environ.get("PYTHONPATH", "")])}
    # a terminal's Ctrl-C: SIGINT at its default disposition in the child. A pytest-xdist worker
    # ignores SIGINT, and a child inherits an ignored signal (Python then never raises
    # KeyboardInterrupt), which made this test pass alone and fail under `make test`
    process = subprocess.Popen([sys.executable, "-m", "grpo_cli.cli", "analyze", str(root)], env=env,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                               preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        deadline = time.monotonic() + 240
        while not any(root.glob(".analysis.*")):  # drawing the figures into its stage
            assert process.poll() is None and time.monotonic() < deadline, process.stdout.read()
            time.sleep(0.02)
        process.send_signal(signal.SIGINT)
        output = process.communicate(timeout=60)[0]
    finally:
        process.kill()
    assert process.returncode == 130, output  # once exit 0
    assert "interrupted: no output written" in output and "Traceback" not in output
    assert not any(root.glob(".analysis.*")) and not (root / "analysis").exists()


def test_a_ctrl_c_swallowed_by_a_finalizer_still_stops_the_commit(tmp_path):
    # CI saw it: SIGINT landed in a matplotlib weakref callback, Python printed "Exception
    # ignored ... KeyboardInterrupt", and the analysis renamed its outputs in and exited 0
    import signal

    import pytest

    from grpo_cli.analysis.pipeline import staged_output

    before = signal.signal(signal.SIGINT, signal.default_int_handler)  # an xdist worker ignores it
    try:
        out = tmp_path / "analysis"
        with pytest.raises(KeyboardInterrupt):
            with staged_output(out, below=tmp_path) as stage:
                (stage / "summary.csv").write_text("x\n")
                try:  # what a finalizer does with the KeyboardInterrupt raised inside it
                    signal.raise_signal(signal.SIGINT)
                except KeyboardInterrupt:
                    pass
        assert not out.exists() and list(tmp_path.iterdir()) == []
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # handler given back
    finally:
        signal.signal(signal.SIGINT, before)
