"""The results writer appends to files written by an older version without misaligning rows."""

from __future__ import annotations

import pandas as pd
import pytest

from grpo_cli.results.writer import RANK_COLUMNS, CsvLog, RunResults

# ranks.csv as versions before pred_distinct_* wrote it, plus a column no longer written
OLD_COLUMNS = [c for c in RANK_COLUMNS if not c.startswith("pred_distinct_")] + ["legacy_note"]


def old_ranks_file(path, steps):
    rows = [{c: "" for c in OLD_COLUMNS} | {"step": s, "matrix": "rollout_group", "group": "g0",
            "erank_entropy": 1.5 + s, "pred_erank_entropy": 2.0, "legacy_note": f"old{s}"}
            for s in steps]
    pd.DataFrame(rows, columns=OLD_COLUMNS).to_csv(path, index=False)


def new_row(step):
    return {"step": step, "matrix": "rollout_group", "group": "g0", "erank_entropy": 9.0,
            "pred_erank_entropy": 3.0, "pred_distinct_erank_entropy": 4.0}


@pytest.mark.parametrize("resume", [True, False])
def test_rows_appended_to_an_older_header_land_under_their_own_columns(tmp_path, resume):
    old_ranks_file(tmp_path / "ranks.csv", steps=[0, 5, 10])
    results = RunResults(tmp_path)
    if resume:  # what `grpo run` and the TRL callback do before appending
        results.truncate_from(10)
        results.ensure_files()
    results.ranks.append([new_row(10)])

    frame = pd.read_csv(tmp_path / "ranks.csv")
    assert list(frame.columns) == [*RANK_COLUMNS, "legacy_note"]
    assert frame["step"].tolist() == ([0, 5, 10] if resume else [0, 5, 10, 10])
    old, new = frame.iloc[:2], frame.iloc[-1]
    assert old["erank_entropy"].tolist() == [1.5, 6.5] and old["pred_erank_entropy"].eq(2.0).all()
    assert old["pred_distinct_erank_entropy"].isna().all()
    assert old["legacy_note"].tolist() == ["old0", "old5"]
    assert (new["erank_entropy"], new["pred_erank_entropy"]) == (9.0, 3.0)
    assert new["pred_distinct_erank_entropy"] == 4.0 and pd.isna(new["legacy_note"])


def test_a_file_without_a_step_column_is_named(tmp_path):
    path = tmp_path / "metrics.csv"
    path.write_text("reward\n0.5\n")
    with pytest.raises(ValueError, match="metrics.csv"):
        CsvLog(path, ["step", "reward"]).truncate_from(0)


def test_a_current_header_is_appended_to_without_rewriting(tmp_path):
    log = CsvLog(tmp_path / "eval.csv", ["step", "accuracy"])
    log.append([{"step": 0, "accuracy": 0.5}])
    inode = log.path.stat().st_ino
    again = CsvLog(log.path, ["step", "accuracy"])
    again.append([{"step": 1, "accuracy": 0.75}])
    assert log.path.stat().st_ino == inode
    assert log.path.read_text() == "step,accuracy\n0,0.5\n1,0.75\n"
