"""`grpo analyze` on hand-made results directories with known numbers (tests/results_factory.py)."""

from __future__ import annotations

import math
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest
from results_factory import LAYER_OFFSETS, write_run, write_sweep

from grpo_cli.analysis import analyze
from grpo_cli.analysis.rules import Rules

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
FIGURES = ("claim2", "claim3", "claim4", "spectra", "effective_rank", "rank_vs_R", "accuracy",
           "dynamics", "gradients", "composition", "collapse")
# one matrix of each kind (per-group, whole, per-layer) keeps the 7-measure figures small
MATRICES = ("rollout_group", "rollout_batch", "update")
FAST = ("rollout_batch", "group_batch")  # tests that judge one whole matrix


@pytest.fixture(scope="module")
def flat(tmp_path_factory):
    """R in {2,4,8} x seeds {0,1} with rank 2.0 + 0.1 * seed everywhere, plus a failed run and
    an incomplete run whose absurd ranks would show up in any average that included them."""
    root = tmp_path_factory.mktemp("results") / "toy"
    write_sweep(
        root,
        matrices=MATRICES,
        # two seeds 0.1 apart, which one is higher alternating with R (so the per-seed slopes
        # disagree: a seed offset constant over R would cancel in them exactly)
        rank=lambda r, seed, step: 2.0 + 0.1 * ((seed + r // 4) % 2),
        composition_offset=0.1,
        median_offset=0.3,
        alarms=[(12, "entropy_collapse", 0.4, "entropy below 0.5")],
    )
    write_run(
        root,
        group_size=4,
        seed=2,
        status="failed",
        error="CUDA out of memory",
        rank=100.0,
        steps_done=7,
        matrices=MATRICES,
    )
    write_run(
        root, group_size=8, seed=2, status="running", rank=50.0, steps_done=12, matrices=MATRICES
    )
    return root, analyze([root])


def _rows(table: pd.DataFrame, **where) -> pd.DataFrame:
    for column, value in where.items():
        table = table[table[column] == value]
    return table


def test_import_does_not_pull_in_torch():
    code = (
        "import sys\n"
        "for name in ('torch', 'transformers', 'vllm'):\n"
        "    sys.modules[name] = None  # any import of them now raises ImportError\n"
        "import grpo_cli.analysis as analysis\n"
        "from grpo_cli.analysis import analyze, load, grouping, tables, summary, composition\n"
        "from grpo_cli.analysis import plots, plots_training, report, style, pipeline\n"
        "from grpo_cli.analysis import rules, bootstrap, trend, rank_verdict, plots_claims\n"
        "from grpo_cli import measures\n"
        "assert callable(analysis.analyze)\n"
        "print('ok')\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok"


def test_flat_rank_with_two_seeds_is_never_contradicted(flat):
    """Two seeds 0.1 apart: each R's interval sits inside 2 +- 0.5 for the whole matrices, but
    two seeds whose slopes are -0.1 and +0.1 cannot pin the slope within +-0.25 (t_1 = 6.31):
    inconclusive, not supported."""
    _, result = flat
    verdicts = result.verdicts
    assert set(verdicts["matrix"]) == set(MATRICES)
    assert len(verdicts) == len(MATRICES) * 7
    assert set(verdicts["verdict"]) == {"inconclusive"}
    whole = verdicts[verdicts["matrix"] != "rollout_group"]
    assert (whole["verdict_level"] == "supported").all()
    assert (verdicts["judged"] == "4, 8").all() and (verdicts["capped"] == "2").all()
    assert np.allclose(verdicts["slope"], 0.0, atol=1e-9)
    assert np.allclose(verdicts["max_deviation"], 0.05)


def test_summary_means_exclude_failed_and_incomplete_runs(flat):
    _, result = flat
    rows = _rows(result.summary, matrix="rollout_batch", measure="erank_entropy")
    assert list(rows["group_size"]) == [2, 4, 8]
    assert np.allclose(rows["mean"], 2.05)  # (2.0 + 2.1) / 2; rank 100 or 50 would show
    assert np.allclose(rows["std"], 0.1 / math.sqrt(2))
    assert list(rows["n_seeds"]) == [2, 2, 2]
    assert list(rows["n_incomplete"]) == [0, 0, 0]


def test_layer_rows_are_kept_and_averaged(flat):
    _, result = flat
    rows = _rows(result.summary, matrix="update", measure="stable_rank", group_size=4)
    by_layer = dict(zip(rows["layer"], rows["mean"], strict=True))
    assert set(by_layer) == {*LAYER_OFFSETS, "mean over layers"}
    for layer, offset in LAYER_OFFSETS.items():
        assert by_layer[layer] == pytest.approx(2.05 + offset)
    assert by_layer["mean over layers"] == pytest.approx(2.05)
    verdict = _rows(result.verdicts, matrix="update", measure="stable_rank")
    assert list(verdict["layer"]) == ["mean over layers"]


def test_per_group_matrices_use_mean_and_report_median(flat):
    _, result = flat
    rows = _rows(result.summary, matrix="rollout_group", measure="erank_entropy", group_size=2)
    assert dict(zip(rows["stat"], rows["mean"], strict=True)) == pytest.approx(
        {"mean": 2.05, "median": 2.35}
    )
    assert set(_rows(result.verdicts, matrix="rollout_group")["stat"]) == {"mean"}


def test_composition_departure_and_closed_form(flat):
    _, result = flat
    comp = result.composition
    assert np.allclose(comp["mean_abs_departure"], 0.1)
    # exp-entropy rank of a group with m minority outcomes is 2 sqrt(m (R - m)); the factory
    # cycles m over 1..R/2 across 3 groups: R=4 -> m = 1, 2, 1
    row = _rows(comp, measure="erank_entropy", group_size=4).iloc[0]
    expected = (2 * math.sqrt(3) * 2 + 2 * math.sqrt(4)) / 3
    assert row["mean_predicted"] == pytest.approx(expected)
    assert row["n_groups"] == 2 * 4 * 3  # seeds x probe steps x groups


def test_composition_gap_splits_into_duplicates_and_the_rest(tmp_path):
    write_sweep(tmp_path / "grpo", seeds=(0,), matrices=("rollout_group",),
                composition_offset=-0.5, duplicates_gap=0.3)
    comp = analyze([tmp_path / "grpo"], figures=False).composition
    assert np.allclose(comp["gap_duplicates"], 0.3)  # predicted - predicted over distinct
    assert np.allclose(comp["gap_rest"], 0.2)  # predicted over distinct - measured
    text = (tmp_path / "grpo" / "analysis" / "details.md").read_text()
    assert "duplicates take away 0.30" in text
    # reinforce's groups need not be zero-sum: no prediction, nothing recomputed
    write_sweep(tmp_path / "reinforce", seeds=(0,), estimators=("reinforce",),
                matrices=("rollout_group",))
    assert analyze([tmp_path / "reinforce"], figures=False).composition.empty


def test_accuracy_summary(flat):
    _, result = flat
    acc = result.accuracy.set_index("group_size")
    assert np.allclose(acc["start_mean"], 0.05)
    assert np.allclose(acc["final_mean"], 0.45)  # 0.05 + 0.4 at the last step
    assert list(acc["n_seeds"]) == [2, 2, 2]


def test_files_figures_and_report(flat):
    root, result = flat
    out = root / "analysis"
    assert result.out_dir == out
    for name in FIGURES:
        data = (out / f"{name}.png").read_bytes()
        assert data[:8] == PNG_MAGIC, name
        # no per-token estimator, no gradient statistics here: small figures that say so
        if name not in ("claim4", "gradients"):
            assert len(data) > 20_000, name
    html = (out / "report.html").read_text()
    assert html.count("data:image/png;base64,") == len(FIGURES)
    assert 'src="' not in html.replace('src="data:image/png;base64,', "")  # nothing external
    assert "Runs differ in: rollout.group_size, seed" in html
    assert "CUDA out of memory" in html and "incomplete" in html
    # the answer first: the four verdicts, each beside its figure, before the runs and tables
    assert html.index("Claim 2:") < html.index('alt="claim2"') < html.index("<summary>Runs</summary>")
    assert html.index('alt="claim2"') < html.index("Claim 3:")
    assert "<details><summary>One sentence per matrix x measure" in html


def test_summary_md_prints_rule_and_status(flat):
    root, result = flat
    text = (root / "analysis" / "details.md").read_text()
    assert Rules().rank_text() in text
    assert "1 failed (excluded from every average)" in text
    assert "1 incomplete (excluded)" in text
    assert "| R8-grpo-s2 | incomplete |" in text
    assert "| R4-grpo-s2 | failed |" in text and "CUDA out of memory" in text


def test_summary_csv_is_tidy(flat):
    root, _ = flat
    table = pd.read_csv(root / "analysis" / "summary.csv")
    assert set(table["kind"]) == {"claim", "rank", "verdict", "verdict_matched", "composition", "accuracy"}
    verdicts = table[table["kind"] == "verdict"]
    assert len(verdicts) == len(MATRICES) * 7 and (verdicts["verdict"] == "inconclusive").all()
    rank_rows = table[(table["kind"] == "rank") & (table["stat"] != "median")
                      & table["layer"].isin([np.nan, "mean over layers"])]
    assert rank_rows["low"].notna().all() and (rank_rows["low"] < rank_rows["mean"]).all()
    ranks = table[(table["kind"] == "rank") & (table["matrix"] == "rollout_batch")]
    assert np.allclose(ranks["mean"], 2.05) and (ranks["n_seeds"] == 2).all()


def test_rank_equal_to_r_is_contradicted(tmp_path):
    write_sweep(tmp_path, matrices=FAST, rank=lambda r, seed, step: float(r))
    result = analyze([tmp_path], measure="erank_entropy", figures=False)
    row = _rows(result.verdicts, matrix="rollout_batch").iloc[0]
    assert row["verdict"] == "contradicted"
    assert row["slope"] == pytest.approx(4.0)  # R=2 capped: means 4, 8 against log2 R = 2, 3
    assert row["max_deviation"] == pytest.approx(6.0)
    assert ("R=4 [4.00, 4.00], R=8 [8.00, 8.00] wholly outside [1.5, 2.5] at 95.0%, the Bonferroni "
            "level over the 2 judged R") in row["words"].sentence()
    assert set(result.verdicts["measure"]) == {"erank_entropy"}


def test_trend_alone_contradicts_2a_and_2b_and_threshold_is_configurable(tmp_path):
    means = {2: 1.7, 4: 2.0, 8: 2.3}  # all within 0.5 of 2, slope 0.3 per doubling
    write_sweep(tmp_path, matrices=FAST, rank=lambda r, seed, step: means[r])
    strict = analyze([tmp_path], measure="stable_rank", figures=False)
    row = _rows(strict.verdicts, matrix="group_batch").iloc[0]
    assert row["slope"] == pytest.approx(0.3)
    assert (row["verdict_slope_zero"], row["verdict_growth"], row["verdict_level"]) == (
        "contradicted", "contradicted", "supported")
    assert row["verdict"] == "mixed"
    assert "is +0.30 [+0.30, +0.30] per doubling" in row["words"].sentence()
    loose = analyze([tmp_path], measure="stable_rank", trend_threshold=0.35, figures=False)
    assert (loose.verdicts["verdict_growth"] == "supported").all()
    assert (loose.verdicts["verdict_slope_zero"] == "contradicted").all()  # still not 0
    assert "0.35 rank units per doubling" in (tmp_path / "analysis" / "details.md").read_text()


def test_last_fraction_window(tmp_path):
    # probes at steps 0, 5, 10, 15; rank = step / 10
    write_sweep(
        tmp_path,
        matrices=FAST,
        group_sizes=(2, 4),
        seeds=(0,),
        rank=lambda r, seed, step: step / 10,
    )
    quarter = analyze([tmp_path], measure="erank_entropy", figures=False)
    assert np.allclose(_rows(quarter.summary, matrix="group_batch")["mean"], 1.5)  # step 15
    half = analyze([tmp_path], measure="erank_entropy", last_fraction=0.5, figures=False)
    assert np.allclose(_rows(half.summary, matrix="group_batch")["mean"], 1.25)  # steps 10, 15


def test_include_incomplete_marks_rows(tmp_path):
    write_sweep(tmp_path, matrices=FAST, rank=2.0)
    write_run(
        tmp_path, matrices=FAST, group_size=8, seed=2, status="running", rank=2.6, steps_done=16
    )
    result = analyze([tmp_path], measure="erank_entropy", include_incomplete=True, figures=False)
    row = _rows(result.summary, matrix="rollout_batch", group_size=8).iloc[0]
    assert row["n_seeds"] == 3 and row["n_incomplete"] == 1
    assert row["mean"] == pytest.approx(2.2)
    verdict = _rows(result.verdicts, matrix="rollout_batch").iloc[0]
    assert "Provisional" in verdict["words"].sentence()
    assert "(n=3*)" in (tmp_path / "analysis" / "details.md").read_text()


def test_sweep_still_running_is_analysed(tmp_path):
    for r in (2, 4):
        write_run(
            tmp_path,
            matrices=FAST,
            group_size=r,
            seed=0,
            status="running",
            steps_done=11,
            alarms=[(8, "zero_variance", 0.95, "zero-variance groups above 0.9")],
        )
    write_run(
        tmp_path,
        group_size=8,
        seed=0,
        status="running",
        steps_done=3,
        skip=("ranks.csv", "spectra.parquet", "events.csv", "eval.csv"),
    )
    (tmp_path / "R16-grpo-s0").mkdir()  # just launched: a torn run.json and nothing else
    (tmp_path / "R16-grpo-s0" / "run.json").write_text('{"status": "running", "group_')
    result = analyze([tmp_path], measure="erank_entropy", align="reward")  # progress x-axis
    assert any("no run has completed yet" in note for note in result.notes)
    assert set(_rows(result.summary, matrix="group_batch")["group_size"]) == {2, 4}
    # R = 2 and 4 only: R = 2 is capped, so the slope cannot be judged (issue 42: was judged
    # on R = 2 and 4, inconclusive for want of a second seed)
    assert (result.verdicts["verdict"] == "not judged").all()
    assert "cannot judge beyond the cap" in result.verdicts["words"].iloc[0].sentence()
    names = {run.name: run for run in result.runs}
    assert "ranks.csv missing" in names["R8-grpo-s0"].problems
    assert names["R16-grpo-s0"].status == "incomplete"
    assert any("R16-grpo-s0" in note for note in result.notes)  # R unknown: left out
    for name in FIGURES:
        assert (tmp_path / "analysis" / f"{name}.png").read_bytes()[:8] == PNG_MAGIC


def test_estimators_are_grouped_and_judged_separately(tmp_path):
    rank = {"grpo": lambda r, seed, step: 2.0, "ppo": lambda r, seed, step: float(r)}
    for estimator, spec in rank.items():
        write_sweep(
            tmp_path / f"sweep-{estimator}",
            matrices=FAST,
            estimators=(estimator,),
            rank=spec,
            experiment=f"exp-{estimator}",
        )
    out = tmp_path / "combined"
    result = analyze(
        [tmp_path / "sweep-grpo", tmp_path / "sweep-ppo"],
        out=out,
        measure="erank_entropy",
        figures=False,
    )
    # experiment.name differs too, but is implied by algorithm.name, so it is not a variant key
    assert result.grouping.differing == ["rollout.group_size", "algorithm.name", "seed"]
    by_variant = _rows(result.verdicts, matrix="rollout_batch").set_index("variant")["verdict"]
    assert by_variant.to_dict() == {"estimator=grpo": "supported", "estimator=ppo": "contradicted"}
    assert (out / "summary.csv").exists() and not (tmp_path / "sweep-grpo" / "analysis").exists()
    table = pd.read_csv(out / "summary.csv")
    assert set(table["estimator"].dropna()) == {"grpo", "ppo"}


def test_matched_progress_compares_equal_reward(tmp_path):
    """Rank follows training reward, and larger R learns faster: by step the rank grows with R,
    at matched reward it does not."""
    rates = {2: 0.2, 4: 0.5, 8: 0.8}
    steps = 20

    def reward(r, seed, step, n):
        return rates[r] * step / (n - 1)

    def rolled(r, step):  # the rolling mean (5 steps) of the linear reward, as analyze sees it
        return rates[r] * (step - min(step, 4) / 2) / (steps - 1)

    write_sweep(
        tmp_path,
        matrices=FAST,
        steps=steps,
        probe_every=1,
        reward=reward,
        rank=lambda r, seed, step: 2.0 + 3.0 * rolled(r, step),
    )
    result = analyze([tmp_path], measure="erank_entropy", align="reward", figures=False)
    by_step = _rows(result.verdicts, matrix="rollout_batch").iloc[0]
    matched = _rows(result.matched, matrix="rollout_batch").iloc[0]
    assert by_step["verdict"] == "contradicted" and by_step["slope"] > 0.5
    assert matched["reading"] == "inside" and abs(matched["slope"]) < 0.1
    assert matched["common_bins"].startswith(("1 ", "2 ", "3 "))


def test_bad_arguments(tmp_path):
    write_sweep(tmp_path, matrices=FAST, group_sizes=(2,), seeds=(0,))
    with pytest.raises(ValueError, match="align"):
        analyze([tmp_path], align="epoch", figures=False)
    with pytest.raises(ValueError, match="unknown measure"):
        analyze([tmp_path], measure="rank", figures=False)
    with pytest.raises(FileNotFoundError):
        analyze([tmp_path / "nowhere"], figures=False)
    single = analyze([tmp_path], measure="stable_rank", figures=False)
    assert (single.verdicts["verdict"] == "not judged").all()
    with pytest.raises(ValueError, match="confidence"):
        analyze([tmp_path], confidence=1.0, figures=False)


def test_zero_matrices_are_left_out(tmp_path):
    # a zero matrix (every measure 0: no gradient signal) at step 0 has no rank
    write_sweep(
        tmp_path,
        matrices=FAST,
        group_sizes=(2, 4),
        seeds=(0,),
        rank=lambda r, seed, step: 0.0 if step == 0 else 2.0,
    )
    result = analyze([tmp_path], measure="erank_entropy", last_fraction=1.0, figures=False)
    assert np.allclose(_rows(result.summary, matrix="rollout_batch")["mean"], 2.0)  # not 1.5
    assert any("zero matrices" in note for note in result.notes)


def test_accuracy_alignment_and_spectra_steps(tmp_path):
    from grpo_cli.analysis.plots import default_steps

    assert default_steps([[0, 5, 10, 15], [0, 5, 10]]) == [0, 5, 10]  # shared steps only
    assert default_steps([[0, 2, 4, 6, 8]]) == [0, 4, 8]
    assert default_steps([[], []]) == []
    write_sweep(tmp_path, matrices=FAST, group_sizes=(4, 8), seeds=(0,))  # R > 2: judged
    result = analyze([tmp_path], measure="erank_entropy", align="accuracy", figures=False)
    assert result.matched_progress == "accuracy"
    assert (result.matched["reading"] == "inside").all()
