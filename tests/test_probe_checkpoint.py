"""`grpo probe`: a training step's probes at fixed weights, per R (grpo_cli/train/probe_checkpoint.py).

The probe is the training step stopped before the optimizer, so at the same weights, prompts and
seed its spectra must equal those a training run records at that step.
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
from cli_helpers import grpo_run
from typer.testing import CliRunner

from grpo_cli.analysis.load import load_run
from grpo_cli.cli import app

FIXED_WEIGHT_MATRICES = {"rollout_group", "rollout_batch", "score_group", "group_batch", "layer"}
SPECTRUM_KEYS = ["step", "matrix", "layer", "group", "k"]


@pytest.fixture(scope="module")
def tiny_model_dir(tmp_path_factory):
    from test_models import save_tiny_llama

    directory = tmp_path_factory.mktemp("tiny_llama")
    save_tiny_llama(directory)
    return directory


def grpo_probe(target, out, *args):
    return CliRunner().invoke(app, ["probe", str(target), "--out", str(out), *args],
                              catch_exceptions=True)


def assert_same_spectra(run_dir, probe_dir, steps):
    trained = pd.read_parquet(run_dir / "spectra.parquet")
    probed = pd.read_parquet(probe_dir / "spectra.parquet")
    trained = trained[trained["step"].isin(steps) & trained["matrix"].isin(FIXED_WEIGHT_MATRICES)]
    assert set(probed["matrix"]) == FIXED_WEIGHT_MATRICES  # update, grad_sum: not at fixed weights
    assert set(trained["matrix"]) == FIXED_WEIGHT_MATRICES
    probed = probed[probed["step"].isin(steps)]
    assert len(trained) == len(probed) > 0
    both = trained.merge(probed, on=SPECTRUM_KEYS, suffixes=("_run", "_probe"))
    assert len(both) == len(trained)
    assert (both["sigma_run"] - both["sigma_probe"]).abs().max() <= 1e-6


def test_probe_of_a_model_directory_equals_a_one_step_run_at_every_r(tmp_path, cache_dir, tiny_model_dir):
    # coin-flip rewards: every group is informative although the random model never answers right
    model = ["model=hf", f"model.path={tiny_model_dir}", "model.name=tiny", "task.reward=random"]
    trained = grpo_run(tmp_path / "runs", cache_dir, *model, "train.steps=1", "probes.every=1",
                       "rollout.group_size=2,4", multirun=True)
    assert trained.exit_code == 0, trained.output
    out = tmp_path / "probe"
    probed = grpo_probe(tiny_model_dir, out, "--group-sizes", "2,4", "experiment=smoke", model[-1],
                        f"cache_dir={cache_dir}", "progress=false", "device=cpu")
    assert probed.exit_code == 0, probed.output
    for size in (2, 4):
        run_dir = next((tmp_path / "runs" / "smoke").glob(f"R{size}-grpo-s0*"))
        probe_dir = out / f"R{size}"
        assert_same_spectra(run_dir, probe_dir, [0])
        record = json.loads((probe_dir / "run.json").read_text())
        assert (record["kind"], record["status"], record["group_size"]) == ("probe", "completed", size)
        metrics = pd.read_csv(probe_dir / "metrics.csv")
        assert metrics["step"].tolist() == [0]
        # the same rollouts: the probe's batch statistics are the training step's
        run_metrics = pd.read_csv(run_dir / "metrics.csv")
        for column in ("reward_mean", "entropy", "completion_len_mean", "loss", "distinct_completions"):
            assert metrics[column].iloc[0] == pytest.approx(run_metrics[column].iloc[0], abs=1e-9)
        assert 1 <= metrics["distinct_completions"].iloc[0] <= size
    analysed = CliRunner().invoke(app, ["analyze", str(out)], catch_exceptions=True)
    assert analysed.exit_code == 0, analysed.output
    assert (out / "analysis" / "summary.csv").is_file()


def test_probe_of_every_kept_checkpoint_equals_the_run_at_those_steps(tmp_path, cache_dir):
    trained = grpo_run(tmp_path, cache_dir, "train.steps=3", "checkpoint_every=1", "probes.every=1",
                       "keep_checkpoints=true", "eval.every=0")
    assert trained.exit_code == 0, trained.output
    run_dir = next((tmp_path / "smoke").glob("R4-grpo-s0*"))
    kept = sorted(path.name for path in (run_dir / "checkpoints").glob("step_*.pt"))
    # step 0: the weights the run started from (W_0), kept so W_t - W_0 needs no model at hand
    assert kept == ["step_000000.pt", "step_000001.pt", "step_000002.pt", "step_000003.pt"]
    out = tmp_path / "probe"
    probed = grpo_probe(run_dir, out, "--group-sizes", "4", "--all-checkpoints")
    assert probed.exit_code == 0, probed.output
    assert sorted(set(pd.read_csv(out / "R4" / "ranks.csv")["step"])) == [0, 1, 2, 3]
    assert load_run(out / "R4").contradictions == []
    # the run probed steps 0-2 at the weights those checkpoints hold (step 3: after training)
    assert_same_spectra(run_dir, out / "R4", [0, 1, 2])
    # one checkpoint file, other prompts: its step only, 2 prompts x R rows
    one = grpo_probe(run_dir / "checkpoints" / "step_000002.pt", tmp_path / "one", "--group-sizes",
                     "2", "--prompts", "2", "--seed", "5")
    assert one.exit_code == 0, one.output
    ranks = pd.read_csv(tmp_path / "one" / "R2" / "ranks.csv")
    assert set(ranks["step"]) == {2}
    assert ranks.loc[ranks["matrix"] == "rollout_batch", "n_rows"].tolist() == [4]
    record = json.loads((tmp_path / "one" / "R2" / "run.json").read_text())
    assert (record["probe"]["source_kind"], record["seed"]) == ("checkpoint", 5)


@pytest.mark.parametrize(
    ("make", "args", "message"),
    [
        (lambda root: root / "nowhere", [], "no such file or directory"),
        (lambda root: root, [], "not a run directory"),
        (lambda root: root, ["--group-sizes", "1,4"], "every R must be >= 2"),
        (lambda root: root, ["--group-sizes", "two"], "give integers separated by commas"),
    ],
)
def test_bad_targets_and_options_are_one_line_errors(tmp_path, make, args, message):
    (tmp_path / "notes.txt").write_text("not a model\n")
    result = grpo_probe(make(tmp_path), tmp_path / "out", *args)
    assert result.exit_code == 2
    assert message in result.output
    assert "Traceback" not in result.output


@pytest.mark.parametrize(("override", "message"), [
    ("probes.evry=3", "probes.evry=3: Key 'evry' not in 'ProbesConfig': did you mean probes.every?"),
    ("optim.lr=fast", "optim.lr=fast: Value 'fast' of type 'str' could not be converted to Float"),
])
def test_a_bad_override_on_a_run_names_the_override_not_the_runs_file(tmp_path, override, message):
    """A run directory's overrides merge into its saved config.yaml: an error there is the
    override's (a misspelled key gets the schema's nearest name), not the file's."""
    from grpo_cli.config.compose import compose_config, to_yaml
    from grpo_cli.config.errors import ConfigError
    from grpo_cli.train.probe_checkpoint import _run_config

    (tmp_path / "config.yaml").write_text(to_yaml(compose_config(["experiment=smoke"]), resolve=True))
    assert _run_config(tmp_path, ["probes.every=3"]).probes.every == 3
    with pytest.raises(ConfigError) as refused:
        _run_config(tmp_path, [override])
    assert str(refused.value) == message


def test_a_bad_override_is_refused_before_any_model_is_built(tmp_path, tiny_model_dir):
    typo = grpo_probe(tiny_model_dir, tmp_path / "out", "rollout.group_sise=3")
    assert typo.exit_code == 2 and "group_sise" in typo.output
    bad_value = grpo_probe(tiny_model_dir, tmp_path / "out", "rollout.temperature=-1")
    assert bad_value.exit_code == 2 and "rollout.temperature" in bad_value.output
    assert not (tmp_path / "out").exists()


# ---- hostile inputs (issue 63): one line each, nothing probed -----------------------------------
def fake_run(root, tiny_model_dir, state) -> Path:
    """A run directory of the tiny model whose checkpoints/latest.pt holds `state` (bytes, or a
    dict saved with torch.save)."""
    import torch

    from grpo_cli.config.compose import compose_config, to_yaml

    run = root / "run"
    (run / "checkpoints").mkdir(parents=True)
    cfg = compose_config(["experiment=smoke", "model=hf", f"model.path={tiny_model_dir}", "model.name=tiny",
                          "task.reward=random", "device=cpu", "progress=false", f"results_dir={root}"])
    (run / "config.yaml").write_text(to_yaml(cfg, resolve=True))
    latest = run / "checkpoints" / "latest.pt"
    if isinstance(state, bytes):
        latest.write_bytes(state)
    else:
        torch.save(state, latest)
    return latest


def lines_of(result) -> list[str]:
    return [line for line in result.output.splitlines() if line.strip() and not line.startswith("[")]


def test_a_damaged_checkpoint_is_input_exit_1_with_its_cause(tmp_path, tiny_model_dir):
    latest = fake_run(tmp_path, tiny_model_dir, {"model": {}, "next_step": 3, "pad": "x" * 4096})
    latest.write_bytes(latest.read_bytes()[:1000])  # cut short, as a killed copy leaves it
    result = grpo_probe(latest, tmp_path / "out")
    assert result.exit_code == 1, result.output  # once exit 2, naming only the exception's type
    lines = lines_of(result)
    assert len(lines) == 1 and lines[0].startswith(
        f"probe error: {latest}: not a readable grpo checkpoint (RuntimeError: "), result.output
    assert len(lines[0]) > len(f"probe error: {latest}: not a readable grpo checkpoint (RuntimeError: )")


def test_a_checkpoint_of_another_model_shape_is_one_line(tmp_path, cache_dir, tiny_model_dir):
    from conftest import tiny_llama

    other = tiny_llama(hidden_size=16, intermediate_size=32, head_dim=4)
    latest = fake_run(tmp_path, tiny_model_dir, {"model": other.state_dict(), "next_step": 3})
    result = grpo_probe(latest, tmp_path / "out", "--group-sizes", "2", f"cache_dir={cache_dir}")
    assert result.exit_code == 1, result.output  # once a 62-line traceback
    lines = lines_of(result)
    assert len(lines) == 1 and lines[0].startswith(f"probe error: {latest}: its weights do not fit "
                                                   "this model (size mismatch for"), result.output


def test_an_unwritable_out_is_one_line_before_any_model(tmp_path, tiny_model_dir):
    blocker = tmp_path / "a_file"
    blocker.write_text("")
    result = grpo_probe(tiny_model_dir, blocker / "out", "experiment=smoke", "device=cpu")
    assert result.exit_code == 2, result.output  # once 59 lines
    assert lines_of(result) == [f"probe error: --out {blocker / 'out'}: cannot write there (Not a directory)"]


def test_a_group_size_too_large_is_refused_before_any_r_is_probed(tmp_path, cache_dir, tiny_model_dir):
    out = tmp_path / "out"
    result = grpo_probe(tiny_model_dir, out, "--group-sizes", "2,100000", "experiment=smoke",
                        "device=cpu", f"cache_dir={cache_dir}", "progress=false")
    assert result.exit_code == 2, result.output
    lines = lines_of(result)
    assert len(lines) == 1 and lines[0].startswith(
        "probe error: rollout.group_size=100000 x rollout.prompts_per_step=4 = 400000 rollouts"), result.output
    assert not (out / "R2").exists()  # once R = 2 was probed first
