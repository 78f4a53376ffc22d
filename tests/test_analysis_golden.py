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
    files = sorted(out.glob("*.csv")) + [out / "summary.md", out / "details.md", out / "report.html"]
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


SUMMARY_BYTES = 30_000  # issue 65: the answer a researcher reads in two minutes
LINE_CHARS = 500  # no generated line over this (the docs' bound)


def test_the_golden_summary_is_short_and_its_sentences_and_docs_block_bounded(tmp_path):
    """summary.md on the golden sweep: <= 30 KB, no line over 500 characters, one sentence per
    claim of <= 300; the --write-docs block likewise; each claim's figure title says its verdict."""
    from grpo_cli.analysis import plots_claims
    from grpo_cli.analysis.docs_blocks import claims_markdown
    from grpo_cli.analysis.headline import HEADLINE_LIMIT
    from grpo_cli.analysis.report import claim_sentences
    from grpo_cli.analysis.style import Styles

    root = tmp_path / "sweep"
    result = analyze(build_sweep(root), out=tmp_path / "analysis", figures=False)
    summary = result.files["summary_md"].read_text()
    assert len(summary.encode()) <= SUMMARY_BYTES
    assert max(len(line) for line in summary.splitlines()) <= LINE_CHARS
    sentences = claim_sentences(result)
    assert sorted(sentences) == [1, 2, 3, 4]
    for number, sentence in sentences.items():
        assert 0 < len(sentence) <= HEADLINE_LIMIT, (number, sentence)
        assert sentence in summary
    assert "slope +0.08 [+0.08, +0.08] per doubling over R=4, 8" in sentences[2]
    assert sentences[4].startswith("Of 4 judged pairs") and "2 contradicted read together" in sentences[4]
    # issue 61: the layer gradient's reading stands beside claim 2's verdict, in the answer itself
    from grpo_cli.analysis.headline import layer_beside_headline
    from grpo_cli.analysis.report import zero_sum_variants

    layer = layer_beside_headline(result.verdicts, result.rules, zero_sum_variants(result.analysed))
    assert layer.startswith("Beside it, not in the verdict: layer / stable_rank") and layer in summary
    assert len(layer) <= HEADLINE_LIMIT and "(2b, within +-0.25: supported)" in layer
    assert "Verdicts" not in summary and "> Rule: " not in summary  # the evidence is in details.md
    assert result.files["details_md"].read_text().count("> Rule: ") == 4
    block = claims_markdown(result, "<root>")
    assert max(len(line) for line in block.splitlines()) <= LINE_CHARS
    claim3, claim4 = result.claims[2], result.claims[3]
    figure = plots_claims.claim3_figure(pd.DataFrame(columns=["metric", "value", "run_id", "step"]),
                                        claim3.table, Styles([""]), "toy", claim3.verdict)
    assert f"claim 3 {claim3.verdict}" in figure._suptitle.get_text()
    figure = plots_claims.claim4_figure(claim4.table, result.rules, Styles(
        sorted({r.variant for r in result.analysed})), "toy", claim4.verdict)
    assert f"claim 4 {claim4.verdict}" in figure._suptitle.get_text()
