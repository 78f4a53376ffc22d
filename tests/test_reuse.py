"""`reuse_from`: a run another experiment completed is copied, not trained again; any setting
that changes results, another device or version, an unfinished source or `resume=false` trains."""

from __future__ import annotations

import json

import pytest
from cli_helpers import grpo_run
from omegaconf import OmegaConf

from grpo_cli.analysis.load import load_run
from grpo_cli.train.resume_guard import differences
from grpo_cli.train.reuse import same_run

COPIED = ("metrics.csv", "eval.csv", "ranks.csv", "spectra.parquet", "timings.csv", "events.csv",
          "checkpoints/latest.pt")
TAKEN = "not trained again"


@pytest.fixture(scope="module")
def source(tmp_path_factory, cache_dir):
    """One completed smoke run in experiment `smoke` of a results directory of its own."""
    results = tmp_path_factory.mktemp("results")
    result = grpo_run(results, cache_dir)
    assert result.exit_code == 0, result.output
    return results, results / "smoke" / "R4-grpo-s0"


def _copy_dir(results, name: str):
    return results / name / "R4-grpo-s0"


def test_the_same_run_under_another_experiment_is_copied_not_trained(source, cache_dir):
    results, trained = source
    result = grpo_run(results, cache_dir, "experiment.name=again", "reuse_from=[smoke]")
    assert result.exit_code == 0, result.output
    assert TAKEN in result.output
    copy = _copy_dir(results, "again")
    for name in COPIED:
        assert (copy / name).read_bytes() == (trained / name).read_bytes(), name
    record, original = (json.loads((path / "run.json").read_text()) for path in (copy, trained))
    assert record["reused_from"] == str(trained) and original["reused_from"] is None
    assert record["experiment"] == "again" and original["experiment"] == "smoke"
    assert record["started_at"] == original["started_at"]  # the source's record: nothing ran here
    assert OmegaConf.load(copy / "config.yaml").experiment.name == "again"
    loaded = load_run(copy)
    assert loaded.status == "completed" and loaded.info["reused_from"] == str(trained)

    # a copy of the copy names the run that trained
    again = grpo_run(results, cache_dir, "experiment.name=third", "reuse_from=[again]")
    assert again.exit_code == 0 and TAKEN in again.output
    assert json.loads((_copy_dir(results, "third") / "run.json").read_text())["reused_from"] == str(trained)


@pytest.mark.parametrize("overrides", [["optim.lr=2e-3"], ["resume=false"]], ids=["lr", "resume_false"])
def test_another_setting_or_resume_false_trains_anew(source, cache_dir, overrides):
    results, _ = source
    name = "other_" + overrides[0].split("=")[0].replace(".", "_")
    result = grpo_run(results, cache_dir, f"experiment.name={name}", "reuse_from=[smoke]", *overrides)
    assert result.exit_code == 0, result.output
    assert TAKEN not in result.output
    record = json.loads(next((results / name).glob("*/run.json")).read_text())
    assert record["status"] == "completed" and record["reused_from"] is None


def _stored(run) -> dict:
    return OmegaConf.to_container(OmegaConf.load(run / "config.yaml"))


@pytest.mark.parametrize("change", ["status", "torch", "device", "seed"])
def test_an_unfinished_or_other_run_is_not_the_same_run(source, tmp_path, change):
    _, trained = source
    record, composed = json.loads((trained / "run.json").read_text()), _stored(trained)
    candidate = tmp_path / "candidate"
    candidate.mkdir()
    (candidate / "config.yaml").write_text((trained / "config.yaml").read_text())
    device = record["device"]
    assert same_run(composed, device, trained)  # unchanged: the same run
    if change == "status":
        record["status"] = "failed"
    elif change == "torch":
        record["versions"]["torch"] += "-other"
    elif change == "device":
        device = "cuda (another card)"
    else:
        composed["seed"] += 1
    (candidate / "run.json").write_text(json.dumps(record))
    assert not same_run(composed, device, candidate)


def test_the_experiment_name_and_where_runs_are_taken_from_change_no_result(source):
    _, trained = source
    stored = _stored(trained)
    composed = {**stored, "experiment": {**stored["experiment"], "name": "other"}, "reuse_from": ["x"]}
    assert [key for key, _, _ in differences(stored, composed)] == ["experiment.name"]  # resume refuses it
    del stored["reuse_from"]  # a run directory written before the key existed still resumes
    assert not differences(stored, {**stored, "reuse_from": ["x"]})
