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
