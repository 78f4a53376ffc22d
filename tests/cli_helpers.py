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


def fault_at(step: int, kind: str = "crash") -> tuple[str, str]:
    """Overrides that make a run fail at `step` on purpose (grpo_cli/train/fault.py): `crash`
    (an error before the step), `interrupt` (Ctrl-C before the step) or `nan_loss`; steps before
    it run as usual, and the re-run without them resumes in the same directory."""
    return f"fault.step={step}", f"fault.kind={kind}"
