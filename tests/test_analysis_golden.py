"""Golden outputs of `grpo analyze` (issue 43): fixed results from the test factory in, and
summary.csv and every side CSV compared value by value, summary.md and report.html (no figures)
byte for byte, with the
files under tests/golden/analysis/. A pure move of analysis/ code leaves them as they are; an
intended change of behaviour rewrites them in its own commit (with its own test), by

    GRPO_UPDATE_GOLDEN=1 .venv/bin/python -m pytest -q tests/test_analysis_golden.py

and the diff of the golden files is then the change, for review.

Scenarios: `sweep` (grpo, ppo and process at R = 2, 4, 8 x 3 seeds; grpo's rank grows a little
with R, the per-token estimators' more, and their per-group rows sit above the closed form, ppo's
by more than claim 4's margin; the loss gradient's token weights
recorded (ppo's vary at R = 8); one incomplete run with absurd ranks, one failed run)
and `probe` (a `grpo probe` directory: two checkpoints, R = 2..16)."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from results_factory import write_probe_sweep, write_run

from grpo_cli.analysis.pipeline import analyze

GOLDEN = Path(__file__).parent / "golden" / "analysis"
UPDATE = os.environ.get("GRPO_UPDATE_GOLDEN") == "1"


def outcome_rank(group_size, seed, step):
    return 2.0 + 0.08 * np.log2(group_size) + 0.03 * seed + 0.002 * step


def per_token_rank(group_size, seed, step):
    return 2.6 + 0.5 * np.log2(group_size) + 0.05 * seed + 0.004 * step


def build_sweep(root: Path) -> list[Path]:
    for estimator, rank, offset in (("grpo", outcome_rank, 0.02), ("ppo", per_token_rank, 1.1),
                                    ("process", per_token_rank, 0.3)):
        for group_size in (2, 4, 8):
            for seed in (0, 1, 2):
                write_run(root, group_size=group_size, seed=seed, estimator=estimator, rank=rank,
                          composition_offset=offset + 0.01 * seed)
    for run_dir in root.iterdir():  # claim 1b: the loss gradient's token weights, as the loop records them
        metrics = pd.read_csv(run_dir / "metrics.csv")
        varied = run_dir.name.startswith("R8-ppo")  # ppo's clipped weights vary at R = 8
        metrics["token_weight_uniform_frac"] = [0.75 if varied and s % 4 == 1 else 1.0 for s in metrics["step"]]
        metrics["token_weight_spread"] = [0.03 if varied and s % 4 == 1 else 0.0 for s in metrics["step"]]
        metrics.to_csv(run_dir / "metrics.csv", index=False)
    write_run(root, group_size=8, seed=3, status="running", rank=50.0, steps_done=12)
    write_run(root, group_size=4, seed=3, status="failed", rank=40.0, steps_done=7,
              error="RuntimeError: CUDA out of memory")
    return [root]


def build_probe(root: Path) -> list[Path]:
    return [write_probe_sweep(root)]


SCENARIOS = {"sweep": build_sweep, "probe": build_probe}


def outputs(out: Path, root: Path) -> dict[str, str]:
    """What the golden files hold: the CSVs, summary.md and report.html, with the run root's path made
    relative (tmp_path differs between runs)."""
    files = sorted(out.glob("*.csv")) + [out / "summary.md", out / "report.html"]
    return {path.name: path.read_text().replace(str(root), "<root>") for path in files}


def compare_csv(name: str, actual: str, expected: str) -> None:
    """Value by value: the same columns and rows, strings equal, numbers to 1e-12 relative."""
    from io import StringIO

    got, want = pd.read_csv(StringIO(actual)), pd.read_csv(StringIO(expected))
    assert list(got.columns) == list(want.columns), name
    pd.testing.assert_frame_equal(got, want, check_exact=False, rtol=1e-12, atol=1e-14, obj=name)


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_analyze_outputs_equal_the_golden_files(tmp_path, scenario):
    root = tmp_path / scenario
    paths = SCENARIOS[scenario](root)
    out = tmp_path / "analysis"
    analyze(paths, out=out, figures=False)
    actual = outputs(out, root)
    golden = GOLDEN / scenario
    if UPDATE:
        golden.mkdir(parents=True, exist_ok=True)
        for stale in golden.iterdir():
            stale.unlink()
        for name, text in actual.items():
            (golden / name).write_text(text)
    expected = {path.name: path.read_text() for path in sorted(golden.iterdir())}
    assert sorted(actual) == sorted(expected), "the analysis wrote other files than the golden set"
    for name, text in actual.items():
        if name.endswith(".csv"):
            compare_csv(name, text, expected[name])
        else:
            assert text == expected[name], f"{name} differs from {golden / name}"
