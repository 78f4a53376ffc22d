"""Every unusable value is refused before any model is built: one line naming the key, exit 2."""

from __future__ import annotations

from pathlib import Path

import pytest
from cli_helpers import grpo_run
from typer.testing import CliRunner

from grpo_cli.cli import app
from grpo_cli.config.compose import compose_config
from grpo_cli.validate import config_problems

CONF = Path(__file__).resolve().parents[1] / "conf"

REFUSED = [
    ("rollout.group_size=0", "rollout.group_size=0: must be >= 1"),
    ("rollout.group_size=-3", "rollout.group_size=-3: must be >= 1"),
    ("rollout.group_size=1", "rollout.group_size=1: must be >= 2 for algorithm=grpo"),
    ("rollout.temperature=0", "rollout.temperature=0.0: must be >= 0.01"),
    ("rollout.temperature=1e-300", "rollout.temperature=1e-300: must be >= 0.01 (below it every rollout"),
    ("threads=100000", "threads=100000: must be in [0, 1024]"),  # once an 85-line panic
    (f"seed={2**64}", f"seed={2**64}: must be in [0, 2**64 - 1]"),  # once an overflow traceback
    ("resume_mismatch=maybe", "resume_mismatch='maybe': must be one of refuse, allow"),
    ("probes.param_regex='(ab'", "probes.param_regex='(ab': not a valid regular expression"),
    ("optim.lr=-1", "optim.lr=-1.0: must be > 0"),
    ("rollout.max_new_tokens=0", "rollout.max_new_tokens=0: must be >= 1"),
    ("probes.matrices=[rollout_group,nonsense]", "probes.matrices="),
    ("algorithm.name=nonsense", "algorithm.name='nonsense': must be one of"),
    ("+rollout.group_sise=4", "rollout.group_sise: not a setting of grpo's schema"),
    ("+foo=1", "foo: not a setting of grpo's schema"),
    ("model.weights=foo", "model.weights='foo': must be one of pretrained, random"),
    ("task.reward=coin", "task.reward='coin': must be one of task, random"),
    ("rollout.draw=gumbel", "rollout.draw='gumbel': must be one of auto, multinomial, inverse_cdf"),
    ("rollout.draw=inverse_cdf", "rollout.backend='hf': must be hf_static with rollout.draw=inverse_cdf"),
    ("fault.kind=segfault", "fault.kind='segfault': must be one of crash, interrupt, nan_loss"),
    ("fault.step=-1", "fault.step=-1: must be >= 0"),
    ("model.autocast_head=true", "model.autocast='none': must be bf16 with model.autocast_head=true"),
    ("probes.layer_spectrum=qr", "probes.layer_spectrum='qr': must be one of svd, gram"),
    ("rollout.compile_decode=true", "rollout.backend='hf': must be hf_static with rollout.compile_decode=true"),
]


def test_fused_adamw_with_bf16_weights_is_refused_before_setup():
    problems = config_problems(compose_config(["experiment=smoke", "optim.fused=true", "model.dtype=bfloat16"]))
    assert problems == ["model.dtype='bfloat16': must be float32 or auto with optim.fused=true "
                        "(bf16 weights use MixedPrecisionAdamW)"]
    assert config_problems(compose_config(["experiment=smoke", "optim.fused=true"])) == []


@pytest.mark.parametrize(("override", "message"), REFUSED)
def test_bad_value_is_named_with_its_range(override, message):
    problems = config_problems(compose_config(["experiment=smoke", override]))
    assert len(problems) == 1 and problems[0].startswith(message)


@pytest.mark.parametrize(("override", "message"), [REFUSED[0], REFUSED[4], REFUSED[9]])
def test_bad_value_is_refused_in_one_line_before_anything_is_built(tmp_path, override, message):
    result = grpo_run(tmp_path, tmp_path / "cache", override)
    assert result.exit_code == 2, result.output
    assert f"config error: {message}" in result.output
    assert "Traceback" not in result.output
    assert not (tmp_path / "smoke").exists()  # no run directory, no model, no warm start
    assert not (tmp_path / "cache").exists()

    config = CliRunner().invoke(app, ["config", "experiment=smoke", override])
    assert config.exit_code == 2
    assert f"config error: {message}" in config.output


def test_sweep_with_a_bad_member_is_refused_before_any_member_runs(tmp_path):
    result = grpo_run(tmp_path, tmp_path / "cache", "rollout.group_size=2,0", "optim.lr=0.1,-1",
                      multirun=True)
    assert result.exit_code == 2, result.output
    assert "config error: rollout.group_size=0: must be >= 1" in result.output
    assert result.output.count("config error: optim.lr=-1.0: must be > 0") == 1  # once, not per member
    assert not (tmp_path / "smoke").exists()  # not even the valid members ran; nothing created
    assert not (tmp_path / "cache").exists()


def test_each_problem_names_its_key_and_range():
    cfg = compose_config(["experiment=smoke", "rollout.group_size=0", "optim.lr=-1",
                          "eval.every=-1", "rollout.top_p=1.5"])
    assert config_problems(cfg) == [  # in the schema's order (each range is its field's metadata)
        "rollout.group_size=0: must be >= 1",
        "rollout.top_p=1.5: must be in (0, 1]",
        "optim.lr=-1.0: must be > 0",
        "eval.every=-1: must be >= 0",
    ]


def test_one_rollout_per_prompt_is_fine_without_a_group_baseline():
    assert config_problems(compose_config(["rollout.group_size=1", "algorithm=reinforce"])) == []
    assert config_problems(compose_config(["rollout.group_size=1", "algorithm=ppo"])) == []


def test_debug_flag_shows_the_traceback(tmp_path, monkeypatch):
    monkeypatch.setenv("GRPO_DEBUG", "1")
    config = CliRunner().invoke(app, ["config", "rollout.group_size=0"])
    assert config.exit_code != 0
    assert type(config.exception).__name__ == "ConfigError"


def test_every_shipped_preset_and_algorithm_passes_the_checks():
    experiments = sorted(p.stem for p in (CONF / "experiment").glob("*.yaml"))
    algorithms = sorted(p.stem for p in (CONF / "algorithm").glob("*.yaml"))
    overrides = [[f"experiment={e}"] for e in experiments]
    overrides += [["experiment=smoke", f"algorithm={a}"] for a in algorithms]
    for override in overrides:
        assert config_problems(compose_config(override)) == [], override


def test_unwritable_results_dir_is_one_line(tmp_path):
    blocker = tmp_path / "a_file"
    blocker.write_text("not a directory")
    result = grpo_run(blocker / "results", tmp_path / "cache")
    assert result.exit_code == 2
    assert "results_dir: cannot write to" in result.output
    assert "Unable to configure handler" not in result.output and "Traceback" not in result.output


def test_run_help_is_grpos_own_usage_with_examples():
    result = CliRunner().invoke(app, ["run", "--help"])
    assert result.exit_code == 0
    assert result.output.startswith("Usage: grpo run")
    assert "grpo run experiment=smoke" in result.output and "--hydra-help" in result.output
    assert "powered by Hydra" not in result.output
    assert "algorithm=dr_grpo|grpo|otb|ppo|process|reinforce|rloo" in result.output


@pytest.mark.parametrize(("override", "message"), [
    ("model.path=/models/my-llama", "model.path='/models/my-llama': must be null with model.source=char_llama"),
    ("task.path=/data/gsm8k", "task.path='/data/gsm8k': must be null with task.name=arith"),
])
def test_a_path_the_run_would_ignore_is_refused(override, message):
    """The tiny preset builds its model and generates its problems: a path given to it would be
    silently ignored (the run trains the local model on arithmetic), so it is refused instead."""
    problems = config_problems(compose_config(["experiment=smoke", override]))
    assert len(problems) == 1 and problems[0].startswith(message), problems


def test_the_same_paths_are_read_where_the_source_reads_them():
    assert config_problems(compose_config(["experiment=smoke", "model=hf", "model.path=/models/x"])) == []
    assert config_problems(compose_config(["experiment=smoke", "task=gsm8k", "task.path=/data/gsm8k"])) == []
    rehearsal = ["experiment=smoke", "model=nemotron_4b", "model.weights=random"]
    assert config_problems(compose_config(rehearsal)) == []


def test_an_empty_task_path_is_refused_not_read_as_the_working_directory():
    problems = config_problems(compose_config(["experiment=smoke", "task=gsm8k", "task.path=''"]))
    assert problems == ["task.path='': must be a directory holding train.jsonl and test.jsonl, or "
                        "null for the datasets hub"]


def test_each_range_is_its_schema_fields_metadata():
    """One owner per range: the schema field's metadata (config/schema.py `ranged`), which
    validate.py walks; a field that may be None is not checked when None."""
    from grpo_cli.validate import schema_ranges

    found = list(schema_ranges())
    ranges = {key: allowed for key, allowed, _ in found}
    assert ranges["optim.lr"].text() == "> 0" and ranges["rollout.top_p"].text() == "in (0, 1]"
    assert ranges["probes.rank_rtol"].text() == "in (0, 1)" and ranges["eval.every"].text() == ">= 0"
    assert ranges["seed"].text() == "in [0, 2**64 - 1] (torch.manual_seed's range)"
    lr, top_p = ranges["optim.lr"], ranges["rollout.top_p"]
    assert [lr.holds(v) for v in (1e-9, 0.0, float("inf"), float("nan"), None, "x")] == [
        True, False, False, False, False, False]
    assert [top_p.holds(v) for v in (0.0, 1e-9, 1.0, 1.0 + 1e-9)] == [False, True, True, False]
    assert {key for key, _, may_be_none in found if may_be_none} == {
        "model.warm_start.seed", "algorithm.loss_constant", "fault.step"}
