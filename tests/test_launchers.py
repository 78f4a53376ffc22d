"""Cluster launchers: the submitit launcher really launches (local executor), into the usual layout."""

from __future__ import annotations

import json

import pytest
from cli_helpers import grpo_run, run_dir

pytest.importorskip("hydra_plugins.hydra_submitit_launcher", reason="pip install -e .[dev]")

LAYOUT = ("config.yaml", "run.json", "metrics.csv", "timings.csv", "eval.csv", "ranks.csv",
          "spectra.parquet", "events.csv", "run.log", "checkpoints/latest.pt", ".hydra/config.yaml")


def test_submitit_local_launches_a_sweep_into_the_same_layout(tmp_path, cache_dir):
    result = grpo_run(tmp_path, cache_dir, "hydra/launcher=submitit_local", "rollout.group_size=2,4",
                      "train.steps=1", multirun=True)
    assert result.exit_code == 0, result.output
    for group_size in (2, 4):
        out = run_dir(tmp_path, f"R{group_size}-grpo-s0-train.steps=1")
        for name in LAYOUT:
            assert (out / name).exists(), (out, name)
        record = json.loads((out / "run.json").read_text())
        assert record["status"] == "completed" and record["group_size"] == group_size
    # each member ran as its own submitit job (own process, own log)
    assert len(list((tmp_path / "smoke" / ".submitit").glob("*/*_result.pkl"))) == 2


def test_slurm_preset_composes_to_submitits_slurm_launcher():
    from hydra import compose, initialize_config_dir

    from grpo_cli.config.schema import register_configs
    from grpo_cli.hydra_app import conf_dir, register_resolvers

    register_configs()
    register_resolvers()
    with initialize_config_dir(config_dir=str(conf_dir()), version_base="1.3"):
        cfg = compose(config_name="config", overrides=["hydra/launcher=slurm"],
                      return_hydra_config=True)
    launcher = cfg.hydra.launcher
    assert launcher._target_ == "hydra_plugins.hydra_submitit_launcher.submitit_launcher.SlurmLauncher"
    assert launcher.gpus_per_node == 1 and launcher.timeout_min == 240
