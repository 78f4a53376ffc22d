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


def test_local_gpus_gives_each_sweep_member_its_own_device(tmp_path, cache_dir):
    """Two members, two (pretend) GPUs: submitit hands both members CUDA_VISIBLE_DEVICES=0,1 and
    each narrows it to a GPU of its own before it trains (its run.log says which)."""
    result = grpo_run(tmp_path, cache_dir, "hydra/launcher=local_gpus", "hydra.launcher.gpus_per_node=2",
                      "rollout.group_size=2,4", "train.steps=1", multirun=True)
    assert result.exit_code == 0, result.output
    seen = {}
    for group_size in (2, 4):
        out = run_dir(tmp_path, f"R{group_size}-grpo-s0-train.steps=1")
        assert json.loads((out / "run.json").read_text())["status"] == "completed"
        lines = [line for line in (out / "run.log").read_text().splitlines() if "CUDA_VISIBLE_DEVICES=" in line]
        assert len(lines) == 1, lines
        seen[group_size] = lines[0].split("CUDA_VISIBLE_DEVICES=")[1].split()[0]
    assert sorted(seen.values()) == ["0", "1"]  # distinct, one each


def test_device_slots_are_distinct_while_held(tmp_path):
    from grpo_cli.runtime.gpu_slots import DeviceSlot, visible_devices

    devices = visible_devices("0, 3")
    assert devices == ["0", "3"] and visible_devices("") == [] and visible_devices(None) == []
    first = DeviceSlot(devices, tmp_path, first=1)
    assert first.acquire() == "3"  # member 1 of 2: devices[1]
    second = DeviceSlot(devices, tmp_path, first=3)  # prefers "3" too (3 % 2 == 1): held, so "0"
    assert second.acquire() == "0"
    first.release()
    third = DeviceSlot(devices, tmp_path, first=1)
    assert third.acquire() == "3"  # released: free again
