"""`grpo bench`: flags, and phase rows from the training loop's own timers."""

from __future__ import annotations

import pandas as pd
import pytest
from step_parity import TINY

from grpo_cli.bench.step_bench import flag_overrides, parse_bench_args, run_bench
from grpo_cli.results.rows import PHASES


def test_parse_bench_args_splits_flags_from_overrides():
    options = parse_bench_args(
        ["--model-size", "25m", "rollout.max_new_tokens=64", "--autocast=bf16", "--shared-prompt-forward"]
    )
    assert options.model_size == "25m" and options.autocast == "bf16"
    assert options.shared_prompt_forward
    assert options.overrides == ["rollout.max_new_tokens=64"]
    assert flag_overrides(options) == [
        "train.shared_prompt_forward=true", "model.autocast=bf16", "rollout.compile_decode=false"
    ]
    # no flag: grpo run's default (shared prompts); --no-shared-prompt-forward turns it off
    assert "train.shared_prompt_forward=true" in flag_overrides(parse_bench_args([]))
    assert "train.shared_prompt_forward=false" in flag_overrides(parse_bench_args(["--no-shared-prompt-forward"]))
    with pytest.raises(ValueError, match="unknown bench option"):
        parse_bench_args(["--fast"])
    with pytest.raises(ValueError, match="unknown bench option"):
        parse_bench_args(["--sorted-micro-batches", "8"])  # the prototype was removed
    with pytest.raises(ValueError, match="--shared-prefix was renamed --shared-prompt-forward"):
        parse_bench_args(["--shared-prefix"])


@pytest.mark.parametrize(("args", "line"), [
    (["--model-size", "huge"], "config error: --model-size 'huge' is not one of tiny, 5m, 25m, smollm2"),
    (["--fast"], "config error: unknown bench option '--fast'"),
    (["rollout.grup_size=4"], "did you mean rollout.group_size?"),
    (["rollout.group_size=0"], "config error: rollout.group_size=0: must be >= 1"),
    (["--model-size", "25m", "optim.lr=-1"], "config error: optim.lr=-1.0: must be > 0"),
    (["--steps", "0"], "--steps"),
])
def test_bench_refuses_bad_arguments_in_one_line_before_building_anything(args, line):
    from typer.testing import CliRunner

    from grpo_cli.cli import app

    result = CliRunner().invoke(app, ["bench", *args])
    assert result.exit_code == 2
    assert line in result.output
    assert "Traceback" not in result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)


def test_bench_configs_pass_the_value_checks_with_their_fixed_policy_lr():
    """The fixed-policy sizes' lr 0 passes (it is the bench's design); a run would refuse it."""
    from grpo_cli.bench.step_bench import prepare_bench
    from grpo_cli.config.errors import ConfigError
    from grpo_cli.validate import validate_bench_config, validate_config

    for size in ("tiny", "5m", "25m", "smollm2"):
        for vs_trl in (False, True):
            validate_bench_config(prepare_bench(["--model-size", size], vs_trl=vs_trl)[1])
    fixed = prepare_bench(["--model-size", "25m"])[1]
    assert fixed.optim.lr == 0
    with pytest.raises(ConfigError, match="optim.lr"):
        validate_config(fixed)


def test_run_bench_times_phases_and_writes_rows(tmp_path):
    out = tmp_path / "bench.csv"
    args = TINY + [f"cache_dir={tmp_path}", "rollout.backend=hf_static", "--shared-prompt-forward",
                   "--out", str(out)]
    rows = run_bench(args, steps=2)
    assert [row["step"] for row in rows] == [1, 2]
    for row in rows:
        assert row["tokens"] > 0 and row["step_s"] > 0 and row["tokens_per_s"] > 0
        assert row["rollout"] > 0 and row["forward"] > 0 and row["backward"] > 0
        assert row["optimizer"] > 0 and row["probes"] == 0 and row["eval"] == 0
        assert sum(row[phase] for phase in PHASES) == pytest.approx(row["step_s"])
    frame = pd.read_csv(out)
    assert len(frame) == 2 and {"label", "load_start", "cpu_s"} <= set(frame.columns)


@pytest.mark.slow
def test_run_bench_against_trl(tmp_path, capfd):
    pytest.importorskip("trl")
    rows = run_bench(TINY + [f"cache_dir={tmp_path}"], steps=1, vs_trl=True)
    assert "Loading weights" not in capfd.readouterr().err  # progress=false, TRL's model too
    sides = sorted(row["side"] for row in rows)
    assert sides == ["grpo-cli", "trl"]
    assert all(row["ratio"] > 0 and row["tokens"] > 0 for row in rows)
    trl = next(row for row in rows if row["side"] == "trl")
    assert trl["rollout"] > 0 and trl["forward"] > 0 and trl["backward"] > 0 and trl["optimizer"] > 0


def test_the_summary_names_issue_45s_target_where_there_is_one():
    """The tiny model and SmolLM2 on a CPU, the 25M model on CUDA; no target elsewhere."""
    from rich.console import Console

    from grpo_cli.bench.trl_bench import RATIO_TARGETS, summarize_pairs

    rows = [{"step_s": 0.1, "cpu_s": 0.1, "tokens_per_s": 100.0, "tokens": 10}]
    printed = {}
    for target in (RATIO_TARGETS[("cpu", "tiny")], None):
        console = Console(record=True, width=200)
        summarize_pairs(console, rows, rows, [0.4], [0.4], target)
        printed[target] = console.export_text()
    assert "median step-time ratio 0.400 (issue 45's target <= 0.33)" in printed[0.33]
    assert "target" not in printed[None]
    assert RATIO_TARGETS == {("cpu", "smollm2"): 0.30, ("cpu", "tiny"): 0.33, ("cuda", "25m"): 0.30}


@pytest.mark.parametrize("size", ["tiny", "5m", "25m", "smollm2"])
def test_every_model_size_composes_and_builds_its_task(size):
    from grpo_cli.bench.builder import MODEL_SIZES
    from grpo_cli.bench.step_bench import compose_bench_config
    from grpo_cli.tasks import build_task

    assert size in MODEL_SIZES
    cfg = compose_bench_config(parse_bench_args(["--model-size", size]))
    assert len(build_task(cfg.task).train) > 0  # e.g. enough distinct problems for eval_size
    if size == "smollm2":
        assert (cfg.model.name, cfg.model.dtype, cfg.optim.lr) == ("smollm2_135m", "float32", 0.0)
        assert cfg.task.use_chat_template and cfg.probes.enabled is False
