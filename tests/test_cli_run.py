"""`grpo run` end to end on the smoke preset: the results contract, resume, determinism, failures."""

from __future__ import annotations

import json
import os

import pandas as pd
import pytest
import torch
from cli_helpers import fault_at, grpo_run, run_dir
from typer.testing import CliRunner

from grpo_cli.cli import app

CONTRACT = [
    "config.yaml",
    "run.json",
    "metrics.csv",
    "eval.csv",
    "spectra.parquet",
    "ranks.csv",
    "events.csv",
    "timings.csv",
    "checkpoints/latest.pt",
]


def test_smoke_run_writes_contract_and_trains_every_parameter(tmp_path, cache_dir):
    result = grpo_run(tmp_path, cache_dir)
    assert result.exit_code == 0, result.output
    out = run_dir(tmp_path)
    for name in CONTRACT:
        assert (out / name).exists(), name
    record = json.loads((out / "run.json").read_text())
    assert record["status"] == "completed"
    assert record["versions"]["torch"] == torch.__version__
    assert record["rollout_resolved"] == {"backend": "hf"}
    metrics = pd.read_csv(out / "metrics.csv")
    assert metrics["step"].tolist() == [0, 1, 2, 3]
    first = metrics.iloc[0]  # no problem seen before step 0: per-prompt = batch-rate value
    assert first["expected_zero_variance_frac"] == first["expected_zero_variance_frac_batch"]
    assert pd.read_csv(out / "eval.csv")["step"].tolist() == [0, 2, 4]
    ranks = pd.read_csv(out / "ranks.csv")
    assert {"rollout_group", "rollout_batch", "score_group", "group_batch", "layer", "update"} <= set(
        ranks["matrix"]
    )
    spectra = pd.read_parquet(out / "spectra.parquet")
    assert list(spectra.columns) == ["step", "matrix", "layer", "group", "k", "sigma"]
    from grpo_cli.measures import RANK_MEASURES

    measured = ranks[~ranks["group"].isin(["mean", "median"])]
    assert not measured[list(RANK_MEASURES)].isna().any().any()  # zero matrices read 0, not NaN
    groups = ranks[(ranks["matrix"] == "rollout_group") & ranks["group"].str.startswith("g")]
    assert len(groups) and groups["pred_erank_entropy"].notna().all()  # grpo: zero-sum groups
    assert (groups["pred_distinct_numerical_rank"] == groups["distinct"]).all()

    warm = next((cache_dir / "warm_start").glob("*/model.safetensors")).parent
    from transformers import AutoModelForCausalLM

    before = AutoModelForCausalLM.from_pretrained(warm).state_dict()
    after = torch.load(out / "checkpoints/latest.pt", weights_only=False, map_location="cpu")["model"]
    unchanged = [name for name, tensor in before.items() if torch.equal(tensor, after[name])]
    assert unchanged == []


def test_same_seed_gives_identical_metrics(tmp_path, cache_dir):
    """The second run also takes deterministic=true: on CPU it must change nothing (and no op
    of the run may lack a deterministic kernel, which would raise)."""
    assert grpo_run(tmp_path / "a", cache_dir).exit_code == 0
    try:
        result = grpo_run(tmp_path / "b", cache_dir, "deterministic=true")
        assert torch.are_deterministic_algorithms_enabled()
    finally:
        torch.use_deterministic_algorithms(False)  # a process-wide switch: off for later tests
    assert result.exit_code == 0, result.output
    first = (run_dir(tmp_path / "a") / "metrics.csv").read_text()
    assert first == (run_dir(tmp_path / "b") / "metrics.csv").read_text()
    assert first.count("\n") == 5


@pytest.mark.parametrize(
    "overrides", [[], ["model.dtype=bfloat16", "model.master_weights=probed"]], ids=["fp32", "bf16"]
)
def test_resume_after_crash_matches_uninterrupted_run(tmp_path, cache_dir, overrides):
    """bf16 with probed masters: fp32 masters for the probed weights, stochastic rounding for
    the rest; both (masters, rounding generators) and grad_sum must survive the checkpoint."""
    name = "-".join(["R4-grpo-s0", ",".join(overrides)]) if overrides else "R4-grpo-s0"
    assert grpo_run(tmp_path / "full", cache_dir, *overrides).exit_code == 0

    crashed = grpo_run(tmp_path / "resumed", cache_dir, *overrides, *fault_at(3))
    assert crashed.exit_code != 0
    out = run_dir(tmp_path / "resumed", name)
    record = json.loads((out / "run.json").read_text())
    assert record["status"] == "failed" and "InjectedFault: fault.kind=crash at step 3" in record["error"]
    assert pd.read_csv(out / "metrics.csv")["step"].tolist() == [0, 1, 2]  # still readable

    assert grpo_run(tmp_path / "resumed", cache_dir, *overrides).exit_code == 0
    record = json.loads((out / "run.json").read_text())
    assert record["status"] == "completed" and record["resumed_from"] == 2
    full = run_dir(tmp_path / "full", name)
    for name in ("metrics.csv", "eval.csv", "ranks.csv"):
        assert (out / name).read_text() == (full / name).read_text(), name


def test_nan_loss_fails_with_clear_message(tmp_path, cache_dir):
    result = grpo_run(tmp_path, cache_dir, *fault_at(0, "nan_loss"))
    assert result.exit_code == 1
    assert "step 0: loss is nan" in result.output
    assert "Traceback" not in result.output  # a training outcome, not a bug: its line says it all
    record = json.loads((run_dir(tmp_path) / "run.json").read_text())
    assert record["status"] == "failed"
    assert "NonFiniteLossError" in record["error"] and "step 0: loss is nan" in record["error"]
    assert record["error"].endswith("[fault.step=0 fault.kind=nan_loss was set: a failure on purpose]")


def test_weights_blown_up_by_the_update_are_named_not_a_sampling_traceback(tmp_path, cache_dir):
    """optim.lr=1e30 passes validation (> 0) but step 0's update makes the logits overflow, so
    step 1 cannot sample: the run fails naming the cause, the step and the setting to change,
    and step 0's row stays readable."""
    result = grpo_run(tmp_path, cache_dir, "optim.lr=1e30")
    assert result.exit_code != 0
    out = next((tmp_path / "smoke").glob("R4-grpo-s0*"))
    record = json.loads((out / "run.json").read_text())
    assert record["status"] == "failed"
    assert "NonFiniteLossError" in record["error"] and "step 1" in record["error"]
    assert "non-finite probabilities" in record["error"] and "optim.lr" in record["error"]
    assert pd.read_csv(out / "metrics.csv")["step"].tolist() == [0]


def test_failed_sweep_member_does_not_stop_the_others(tmp_path, cache_dir):
    """optim.lr=1e30 passes validation, then its first update blows the weights up and step 1
    cannot sample: that member fails, the other completes, and the sweep exits 1."""
    result = grpo_run(tmp_path, cache_dir, "optim.lr=1e-3,1e30", multirun=True)
    assert result.exit_code == 1
    names = {"R4-grpo-s0-optim.lr=0.001": "completed", "R4-grpo-s0-optim.lr=1e+30": "failed"}  # Hydra's spelling
    status = {name: json.loads((run_dir(tmp_path, name) / "run.json").read_text())["status"] for name in names}
    assert status == names


def test_a_sweep_whose_members_all_failed_exits_1_beside_an_unreadable_run_json(tmp_path, cache_dir):
    """An unreadable run.json elsewhere in the sweep directory once crashed the end-of-sweep
    summary, which Hydra turned into a warning: no status table, exit 0. Now the table lists
    every member and the sweep exits 1."""
    stray = tmp_path / "smoke" / "someone-elses-run"
    stray.mkdir(parents=True)
    (stray / "run.json").write_text("{not json")
    os.utime(stray / "run.json", (1e9, 1e9))  # written long before this sweep
    result = grpo_run(tmp_path, cache_dir, "seed=3,4", "optim.lr=1e30", multirun=True)
    assert result.exit_code == 1, result.output
    for name in ("R4-grpo-s3-optim.lr=1e+30", "R4-grpo-s4-optim.lr=1e+30"):
        assert any(f"] {name}" in line and " failed  (NonFiniteLossError" in line
                   for line in result.output.splitlines()), result.output
    assert "2 of 2 runs did not complete" in result.output


def test_sweep_rows_name_an_unreadable_run_json_written_during_the_sweep(tmp_path):
    from grpo_cli.hydra_app import record_member, sweep_rows

    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "run.json").write_text("[1, 2]")  # valid JSON, not an object
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "run.json").write_text('{"status": "completed"}')
    record_member(tmp_path, "c", "refused", "rollout.group_size=0: must be >= 1")
    rows = {name: (status, error) for name, status, error in sweep_rows(tmp_path, started="")}
    assert rows["a"][0] == "unreadable" and str(tmp_path / "a" / "run.json") in rows["a"][1]
    assert rows["b"] == ("completed", None)
    assert rows["c"] == ("refused", "rollout.group_size=0: must be >= 1")
    assert sweep_rows(tmp_path, started="9999") == []  # nothing written since


def test_typo_in_config_key_names_the_key(tmp_path, cache_dir):
    result = grpo_run(tmp_path, cache_dir, "rollout.group_sise=4")
    assert result.exit_code != 0
    assert "group_sise" in result.output
    assert "did you mean rollout.group_size?" in result.output
    assert "+rollout.group_sise" not in result.output  # Hydra's advice; the schema refuses it

    config = CliRunner().invoke(app, ["config", "optim.lr=fast"])
    assert config.exit_code == 2
    assert "optim.lr" in config.output and "did you mean" not in config.output
    config = CliRunner().invoke(app, ["config", "probes.evry=3"])
    assert config.exit_code == 2
    assert "did you mean probes.every?" in config.output


@pytest.mark.parametrize(("override", "hint"), [
    ("rollout.grup_size=4", "did you mean rollout.group_size?"),
    ("rolout.group_size=4", "did you mean rollout.group_size?"),  # the top level's key, and the rest
    ("model.hidden=8", "did you mean model.hidden_size?"),
    ("rollout.zzzz=3", "rollout has no key 'zzzz' (`grpo config` lists every key)"),
    ("zzzz=3", "the top level has no key 'zzzz'"),
    ("optim.lr=fast", None),  # a bad value, not an unknown key
    ("experiment=smok", None),  # a missing option: Hydra lists the options
])
def test_an_unknown_key_gets_the_schemas_nearest_names(override, hint):
    from grpo_cli.config.compose import compose_config
    from grpo_cli.config.errors import unknown_key_hint

    with pytest.raises(Exception) as caught:
        compose_config([override])
    found = unknown_key_hint(caught.value)
    if hint is None:
        assert found is None
    else:
        assert found is not None and found.startswith(hint)


def test_missing_model_path_is_a_clear_error(tmp_path, cache_dir):
    result = grpo_run(tmp_path, cache_dir, "model=hf", "model.path=/nonexistent/model")
    assert result.exit_code != 0
    record = json.loads(next(tmp_path.glob("smoke/*/run.json")).read_text())
    assert record["status"] == "failed"
    assert "/nonexistent/model" in record["error"]


@pytest.mark.skipif(torch.cuda.is_available(), reason="the point is a machine without CUDA")
def test_device_cuda_without_cuda_is_one_config_error_line(tmp_path, cache_dir):
    result = grpo_run(tmp_path, cache_dir, "device=cuda")
    assert result.exit_code == 2
    assert "device=cuda: torch sees no CUDA device here; use device=cpu or auto" in result.output
    assert "Traceback" not in result.output
    record = json.loads(next(tmp_path.glob("smoke/*/run.json")).read_text())
    assert record["status"] == "failed" and "device=cuda" in record["error"]


def test_vllm_backend_without_vllm_is_one_config_error_line_before_any_weights(tmp_path, cache_dir):
    import importlib.util

    if importlib.util.find_spec("vllm") is not None:
        pytest.skip("vllm is installed here (make test-vllm's environment runs the backend itself)")
    result = grpo_run(tmp_path, cache_dir, "rollout=vllm")
    assert result.exit_code == 2
    assert "rollout.backend=vllm: the vLLM rollout backend needs vllm: `pip install grpo-cli[vllm]`" in result.output
    assert "Traceback" not in result.output and "Loading weights" not in result.output


def test_joblib_launcher_runs_a_sweep_in_parallel(tmp_path, cache_dir):
    grpo_run(tmp_path / "warm", cache_dir, "train.steps=1")  # build the cache once
    result = grpo_run(
        tmp_path, cache_dir, "hydra/launcher=local_parallel", "rollout.group_size=2,4",
        "train.steps=2", multirun=True,
    )
    assert result.exit_code == 0, result.output
    for name in ("R2-grpo-s0-train.steps=2", "R4-grpo-s0-train.steps=2"):
        record = json.loads((run_dir(tmp_path, name) / "run.json").read_text())
        assert record["status"] == "completed", name


def test_run_names_stay_short_and_distinct():
    from grpo_cli.config.resolvers import MAX_RUN_NAME, run_name

    assert run_name(4, "grpo", 0) == "R4-grpo-s0"
    assert run_name(4, "rloo", 1, "optim.lr=0.1") == "R4-rloo-s1-optim.lr=0.1"
    first = run_name(8, "grpo", 0, "model.path=/" + "a" * 300)
    second = run_name(8, "grpo", 0, "model.path=/" + "a" * 299 + "b")
    assert len(first) <= MAX_RUN_NAME and first != second


def test_warm_start_cache_key_follows_what_changes_the_weights():
    from grpo_cli.config.compose import compose_config
    from grpo_cli.models.warm_start import warm_start_key, warm_start_seed

    def key(*overrides):
        cfg = compose_config(["experiment=smoke", *overrides])
        return warm_start_key(cfg.model, cfg.task, warm_start_seed(cfg.model, cfg.seed))

    assert key() == key("task.train_size=999")  # shared by every train size
    assert key() != key("seed=3")  # each seed its own warm start: seeds are independent replicates
    assert key("seed=3") == key("seed=3", "rollout.group_size=8", "algorithm=ppo")  # paired within a seed
    assert key("seed=3") == key("model.warm_start.seed=3")  # pinning seed 3 is the same model
    assert key("seed=1", "model.warm_start.seed=0") == key("seed=2", "model.warm_start.seed=0")
    assert key() != key("task.eval_size=32")  # held-out problems are excluded from training draws
    assert key() != key("model.warm_start.steps=10")


def test_run_json_records_which_warm_start_a_run_used(tmp_path, cache_dir):
    """initial_model: the warm start of the run's seed by default (not shared), the pinned one
    when model.warm_start.seed is set (shared by every seed); different seeds, different keys."""
    for seed, pinned in ((0, None), (1, None), (1, 0)):
        extra = [] if pinned is None else [f"model.warm_start.seed={pinned}"]
        result = grpo_run(tmp_path, cache_dir, "train.steps=1", f"seed={seed}", *extra)
        assert result.exit_code == 0, result.output
    records = {path.parent.name: json.loads(path.read_text())["initial_model"]
               for path in (tmp_path / "smoke").glob("*/run.json")}
    own = {name: rec for name, rec in records.items() if "warm_start.seed" not in name}
    pinned = next(rec for name, rec in records.items() if "warm_start.seed" in name)
    assert sorted(rec["seed"] for rec in own.values()) == [0, 1]
    assert not any(rec["shared"] for rec in own.values())
    assert len({rec["key"] for rec in own.values()}) == 2
    assert pinned["shared"] and pinned["seed"] == 0
    assert pinned["key"] == next(rec["key"] for rec in own.values() if rec["seed"] == 0)


def test_probes_off_runs_no_probe_although_the_preset_sets_every(tmp_path, cache_dir):
    result = grpo_run(tmp_path, cache_dir, "probes=off", "train.steps=1")  # smoke: probes.every=2
    assert result.exit_code == 0, result.output
    out = run_dir(tmp_path, "R4-grpo-s0-probes=off,train.steps=1")
    assert pd.read_csv(out / "ranks.csv").empty
    assert (pd.read_csv(out / "timings.csv")["time_probes"].fillna(0) == 0).all()


def test_sparsity_every_step_leaves_training_as_it_was(tmp_path, cache_dir):
    """probes.sparsity_every=1 (the default) puts grad_sparsity / grad_hoyer on every metrics row,
    not only the probe steps', and measuring it changes nothing else: with sparsity_every=0 the
    same run has them on its probe steps only, equal there, and every other column identical."""
    import glob

    import pandas as pd

    steps = ["train.steps=4", "probes.every=3", "eval.every=0"]
    assert grpo_run(tmp_path / "each", cache_dir, *steps).exit_code == 0
    assert grpo_run(tmp_path / "probe", cache_dir, *steps, "probes.sparsity_every=0").exit_code == 0
    each, probe = (pd.read_csv(glob.glob(str(tmp_path / name / "smoke" / "*" / "metrics.csv"))[0])
                   for name in ("each", "probe"))
    assert each["grad_sparsity"].notna().all() and each["grad_hoyer"].notna().all()
    assert list(probe.loc[probe["grad_sparsity"].notna(), "step"]) == [0, 3]
    on_probe = each["step"].isin([0, 3])
    pd.testing.assert_frame_equal(each.loc[on_probe, ["grad_sparsity", "grad_hoyer"]].reset_index(drop=True),
                                  probe.loc[on_probe, ["grad_sparsity", "grad_hoyer"]].reset_index(drop=True))
    timing = [c for c in each.columns if "time" in c or c.endswith("_s") or c.endswith("_ms")]
    same = [c for c in each.columns if c not in ("grad_sparsity", "grad_hoyer", *timing)]
    pd.testing.assert_frame_equal(each[same], probe[same])
