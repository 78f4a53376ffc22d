"""Run `grpo run` in-process on the smoke preset (shared by the CLI tests).

Runs are pinned to `device=cpu`: the fast suite checks CPU behaviour (fp32 weights, bitwise
resume) even where CUDA is visible; tests/test_gpu.py runs the GPU tier."""

from __future__ import annotations

from contextlib import contextmanager

from typer.testing import CliRunner

from grpo_cli.cli import app


def grpo_run(results, cache, *overrides, multirun=False, device="cpu"):
    args = ["run"] + (["-m"] if multirun else [])
    args += ["experiment=smoke", f"results_dir={results}", f"cache_dir={cache}", "progress=false",
             f"device={device}"]
    return CliRunner().invoke(app, args + list(overrides), catch_exceptions=True)


def run_dir(results, name="R4-grpo-s0"):
    return results / "smoke" / name


@contextmanager
def failing_at_step(monkeypatch, step: int, error: BaseException | None = None):
    """Inside the block, GRPOTrainer.step raises `error` (default: a simulated crash) at `step`,
    as a killed or crashing run would; steps before it run as usual."""
    from grpo_cli.train import trainer

    original = trainer.GRPOTrainer.step
    error = error if error is not None else RuntimeError("simulated crash")

    def step_or_fail(self, current, capture=None, **options):
        if current == step:
            raise error
        return original(self, current, capture, **options)

    monkeypatch.setattr(trainer.GRPOTrainer, "step", step_or_fail)
    try:
        yield
    finally:
        monkeypatch.setattr(trainer.GRPOTrainer, "step", original)
