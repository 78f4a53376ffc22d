"""`grpo analyze` never crashes on failed or torn runs, and flags runs whose files contradict themselves."""

from __future__ import annotations

import pandas as pd
from results_factory import write_run, write_sweep
from typer.testing import CliRunner

from grpo_cli.analysis.load import load_run
from grpo_cli.analysis.pipeline import analyze
from grpo_cli.cli import app


def test_sweep_whose_runs_all_failed_is_a_message_not_a_crash(tmp_path):
    root = tmp_path / "toy"
    for group_size in (2, 4):
        write_run(root, group_size=group_size, seed=0, status="failed", error="boom", steps_done=3)
    result = CliRunner().invoke(app, ["analyze", str(root)])
    assert result.exit_code == 1
    assert "nothing analysed: no run to analyse among 2: R2-grpo-s0 failed (boom)" in result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)
    assert not list(tmp_path.rglob("*.png"))  # no empty figures


def test_a_folder_without_runs_is_a_message_not_a_traceback(tmp_path):
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "notes.txt").write_text("not a run")
    result = CliRunner().invoke(app, ["analyze", str(tmp_path / "empty")])
    assert result.exit_code == 1
    assert "nothing analysed: no run directories" in result.output
    assert str(tmp_path / "empty") in result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)


def tear_last_line(out):
    with open(out / "metrics.csv", "a") as handle:
        handle.write("8,0.12")  # killed while writing step 8: reward_mean cut short, no newline


def contradict(out):
    """What two writers into one directory left: steps 6-9 twice, probe steps 0-4 lost."""
    metrics = pd.read_csv(out / "metrics.csv")
    pd.concat([metrics, metrics[metrics["step"] >= 6]]).to_csv(out / "metrics.csv", index=False)
    spectra = pd.read_parquet(out / "spectra.parquet")
    spectra[~spectra["step"].isin([0, 2, 4])].to_parquet(out / "spectra.parquet", index=False)


def test_torn_last_line_is_dropped_not_read_as_data(tmp_path):
    out = write_run(tmp_path / "toy", group_size=4, seed=0, steps=8, probe_every=2)
    tear_last_line(out)
    run = load_run(out)
    assert run.metrics["step"].tolist() == list(range(8))
    assert "metrics.csv: torn last line dropped" in run.problems
    assert run.contradictions == []


def test_a_runs_tables_carry_no_attrs(tmp_path):
    """pandas deep-copies a frame's `attrs` into every frame derived from it; the file lines of
    ranks.csv's rows, once kept there (one int a row), took half of `grpo analyze`'s time."""
    run = load_run(write_run(tmp_path / "toy", group_size=4, seed=0, steps=8, probe_every=2))
    assert len(run.ranks) > 0
    assert all(table.attrs == {} for table in (run.ranks, run.metrics, run.evals, run.events))


def test_run_whose_files_contradict_themselves_is_flagged_and_left_out(tmp_path):
    root = write_sweep(tmp_path / "toy", group_sizes=(2, 4), seeds=(0, 1), steps=10, probe_every=2)
    contradict(root / "R4-grpo-s0")
    assert load_run(root / "R4-grpo-s0").contradictions == [
        "metrics.csv repeats steps [6, 7, 8, 9]",
        "spectra.parquet lacks probe steps [0, 2, 4] of ranks.csv",
    ]
    assert load_run(root / "R4-grpo-s1").contradictions == []

    result = analyze([root], figures=False)
    assert sorted(run.name for run in result.analysed) == ["R2-grpo-s0", "R2-grpo-s1", "R4-grpo-s1"]
    summary = (root / "analysis" / "summary.md").read_text()
    assert "## Data problems" in summary
    assert "R4-grpo-s0: spectra.parquet lacks probe steps [0, 2, 4] of ranks.csv" in summary


def test_console_names_torn_and_contradicted_runs(tmp_path):
    root = write_sweep(tmp_path / "toy", group_sizes=(2, 4), seeds=(0,), steps=10, probe_every=5,
                       matrices=("rollout_batch",))
    tear_last_line(root / "R2-grpo-s0")
    contradict(root / "R4-grpo-s0")
    result = CliRunner().invoke(app, ["analyze", str(root)])
    assert result.exit_code == 0, result.output
    assert "warning: R2-grpo-s0: metrics.csv: torn last line dropped" in result.output
    assert "data problem: R4-grpo-s0: metrics.csv repeats steps [6, 7, 8, 9] (run left out)" in result.output


def test_missing_and_unordered_steps_are_contradictions(tmp_path):
    out = write_run(tmp_path / "toy", group_size=4, seed=0, steps=6, probe_every=2)
    metrics = pd.read_csv(out / "metrics.csv")
    metrics[metrics["step"] != 3].to_csv(out / "metrics.csv", index=False)
    assert load_run(out).contradictions == ["metrics.csv misses steps [3]"]
    metrics.iloc[::-1].to_csv(out / "metrics.csv", index=False)
    assert load_run(out).contradictions == ["metrics.csv steps are out of order"]


def test_hostile_analysis_inputs_are_one_warning_each_naming_the_file(tmp_path):
    """Each once passed silently, or (an unreadable ranks.csv) stopped the analysis naming no
    file (issue 63): an unreadable ranks.csv, an infinite metrics.csv cell, negative and NaN
    singular values, a parquet of another schema, a metrics.csv with a header alone, a ranks.csv
    of 0 bytes."""
    root = write_sweep(tmp_path / "toy", group_sizes=(2, 4), seeds=(0, 1, 2), steps=10, probe_every=2)
    ranks = root / "R4-grpo-s0" / "ranks.csv"
    ranks.unlink()
    ranks.symlink_to("/proc/self/mem")  # every read fails (EIO), even for root
    metrics = pd.read_csv(root / "R4-grpo-s1" / "metrics.csv")
    metrics.loc[3, "reward_mean"] = float("inf")
    metrics.to_csv(root / "R4-grpo-s1" / "metrics.csv", index=False)
    spectra = pd.read_parquet(root / "R2-grpo-s0" / "spectra.parquet")
    spectra.loc[0, "sigma"], spectra.loc[1, "sigma"] = -1.0, float("nan")
    spectra.to_parquet(root / "R2-grpo-s0" / "spectra.parquet")
    pd.DataFrame({"a": [1, 2]}).to_parquet(root / "R2-grpo-s1" / "spectra.parquet")
    (root / "R2-grpo-s2" / "ranks.csv").write_bytes(b"")
    header = (root / "R4-grpo-s2" / "metrics.csv").read_text().splitlines()[0]
    (root / "R4-grpo-s2" / "metrics.csv").write_text(header + "\n")

    result = CliRunner().invoke(app, ["analyze", str(root)])
    assert result.exit_code == 0, result.output
    assert "Traceback" not in result.output
    for line in [
        "warning: R4-grpo-s0: ranks.csv unreadable ([Errno 5] Input/output error)",
        "warning: R4-grpo-s1: metrics.csv line 5, column reward_mean: inf is not a number (infinite; left out)",
        "warning: R2-grpo-s0: spectra.parquet: 2 singular values NaN, infinite or negative (left out)",
        "data problem: R4-grpo-s2: metrics.csv has no rows, though run.json says completed at step 9 "
        "(run left out)",
        "data problem: R2-grpo-s2: ranks.csv has no rows (0 bytes or a header alone), though the run "
        "probed every 2 steps (run left out)",
    ]:
        assert result.output.count(line) == 1, (line, result.output)
    other_schema = [line for line in result.output.splitlines() if "R2-grpo-s1" in line]
    assert len(other_schema) == 1 and other_schema[0].startswith(  # once "lacks probe steps"
        "data problem: R2-grpo-s1: spectra.parquet unreadable ("), result.output


def test_a_rank_column_with_holes_is_named_not_averaged_silently(tmp_path):
    """A third of erank_entropy NaN once passed silently (issue 63); a column empty throughout is
    a measure not recorded and says nothing."""
    root = write_sweep(tmp_path / "toy", group_sizes=(2,), seeds=(0,), steps=10, probe_every=2)
    path = root / "R2-grpo-s0" / "ranks.csv"
    ranks = pd.read_csv(path)
    holes = ranks.index[::3]
    ranks.loc[holes, "erank_entropy"] = float("nan")
    ranks["stable_rank"] = float("nan")
    ranks.to_csv(path, index=False)
    problems = load_run(root / "R2-grpo-s0").problems
    assert [p for p in problems if "values empty" in p] == [
        f"ranks.csv, column erank_entropy: {len(holes)} of {len(ranks)} values empty (NaN; left out of every mean)"]
