"""Dry-run checks: does a step's command compose, without running it?

Each check raises `StepBroken` with one line naming what is wrong, or returns a short summary of
what it checked. Hydra overrides go through the project's own compose function and value checks
(`grpo config` does the same); bench flags through the bench's own argument parser; scripts run
with `--dry-run` (they parse their arguments and stop before importing torch).
"""

from __future__ import annotations

import subprocess
import tomllib
from pathlib import Path


class StepBroken(Exception):
    """A step's command would not run as written (one line: what and where)."""


def check_overrides(override_sets: list[list[str]]) -> str:
    """Compose and value-check each set of Hydra overrides, as `grpo run` would."""
    from grpo_cli.config.compose import compose_config
    from grpo_cli.validate import validate_config

    for overrides in override_sets:
        try:
            validate_config(compose_config(overrides))
        except Exception as error:  # compose and value errors name the key
            raise StepBroken(f"{' '.join(overrides)}: {str(error).splitlines()[0]}") from None
    return f"{len(override_sets)} config(s) composed and validated"


def check_bench(args: list[str], vs_trl: bool) -> str:
    """Parse `grpo bench` arguments, compose and value-check its config, as `grpo bench` does
    before it builds anything (`validate_bench_config`: lr 0 allowed)."""
    from grpo_cli.bench.step_bench import prepare_bench
    from grpo_cli.validate import validate_bench_config

    try:
        validate_bench_config(prepare_bench(args, vs_trl=vs_trl)[1])
    except Exception as error:
        raise StepBroken(f"grpo bench {' '.join(args)}: {str(error).splitlines()[0]}") from None
    return "bench flags parsed, config composed and validated"


def check_script(python: str, script: Path, args: list[str], cwd: Path) -> str:
    """Run `script ARGS --dry-run`: its own parser checks every flag."""
    if not (cwd / script).exists():
        raise StepBroken(f"{script}: no such script")
    done = subprocess.run([python, str(script), *args, "--dry-run"], cwd=cwd, capture_output=True,
                          text=True, timeout=120)
    if done.returncode != 0:
        lines = (done.stderr or done.stdout).strip().splitlines() or [f"exit code {done.returncode}"]
        raise StepBroken(f"{script} --dry-run: {lines[-1]}")
    return done.stdout.strip().splitlines()[-1] if done.stdout.strip() else "arguments parsed"


def check_tests(paths: list[Path], marker: str | None, pyproject: Path) -> str:
    """The test paths exist and the marker is registered in pyproject.toml."""
    missing = [str(path) for path in paths if not path.exists()]
    if missing:
        raise StepBroken(f"no such test path: {', '.join(missing)}")
    if marker:
        markers = tomllib.loads(pyproject.read_text())["tool"]["pytest"]["ini_options"]["markers"]
        if not any(line.split(":")[0].strip() == marker for line in markers):
            raise StepBroken(f"pytest marker {marker!r} is not registered in {pyproject.name}")
    return "test paths exist" + (f", marker {marker!r} registered" if marker else "")
