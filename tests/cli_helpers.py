"""Run `grpo run` in-process on the smoke preset (shared by the CLI tests).

Runs are pinned to `device=cpu`: the fast suite checks CPU behaviour (fp32 weights, bitwise
resume) even where CUDA is visible; tests/test_gpu.py runs the GPU tier."""

from __future__ import annotations

from typer.testing import CliRunner

from grpo_cli.cli import app


def grpo_run(results, cache, *overrides, multirun=False, device="cpu"):
    args = ["run"] + (["-m"] if multirun else [])
    args += ["experiment=smoke", f"results_dir={results}", f"cache_dir={cache}", "progress=false",
             f"device={device}"]
    return CliRunner().invoke(app, args + list(overrides), catch_exceptions=True)


def run_dir(results, name="R4-grpo-s0"):
    return results / "smoke" / name
