"""The readings beside the claims (grpo_cli/analysis/update_geometry.py): the top-k energy table
over R and the update's trajectory at the last kept step, from fabricated results with known
numbers, and their section in details.md (none where no file has the columns)."""

from __future__ import annotations

import pandas as pd
import pytest
from results_factory import write_sweep

from grpo_cli.analysis import analyze
from grpo_cli.analysis.load import load_runs
from grpo_cli.analysis.update_geometry import top_energy_table, trajectory_table
from grpo_cli.measures import TRAJECTORY_COLUMNS

GROUP_SIZES = (2, 4, 8)


def add_top_energy(run_dir) -> None:
    """E_k = min(k, R) / R on every row: R orthogonal rows of equal norm."""
    ranks = pd.read_csv(run_dir / "ranks.csv")
    size = int(run_dir.name.split("-")[0][1:])
    for k in (1, 2, 3):
        ranks[f"top{k}_energy_share"] = min(k, size) / size
    ranks.to_csv(run_dir / "ranks.csv", index=False)


def add_trajectory(run_dir, seed: int) -> None:
    """Two weights and `all` at kept steps 10 and 20; the last step's values set by the seed."""
    rows = []
    for step in (10, 20):
        last = step == 20
        for layer, share in (("a", 0.9), ("b", 0.7), ("all", float("nan"))):
            rows.append({"step": step, "layer": layer, "update_norm": 1.0, "rank1_share": share,
                         "cosine_to_last": 1.0, "path_rank1_share": 0.98 + 0.01 * seed if last else 1.0,
                         "path_linearity": 0.9 if last else float("nan")})
    pd.DataFrame(rows, columns=list(TRAJECTORY_COLUMNS)).to_csv(run_dir / "trajectory.csv", index=False)


@pytest.fixture
def sweep(tmp_path):
    root = write_sweep(tmp_path / "sweep", group_sizes=GROUP_SIZES, seeds=(0, 1))
    for run_dir in sorted(p for p in root.iterdir() if p.is_dir()):
        add_top_energy(run_dir)
        add_trajectory(run_dir, int(run_dir.name.rsplit("-s", 1)[1]))
    return root


def test_top_energy_table_reads_each_matrix_against_r(sweep):
    table = top_energy_table(load_runs([sweep]), last_fraction=0.5)
    group = table[table.matrix == "rollout_group"].set_index("group_size")
    assert group.index.tolist() == list(GROUP_SIZES)
    assert group["E_1"].tolist() == pytest.approx([1 / 2, 1 / 4, 1 / 8])
    assert group["1 - E_3"].tolist() == pytest.approx([0.0, 1 / 4, 5 / 8])
    assert (group["n_seeds"] == 2).all()
    assert {"rollout_batch", "layer", "update"} <= set(table.matrix)


def test_trajectory_table_takes_each_runs_last_kept_step(sweep):
    table = trajectory_table(load_runs([sweep])).set_index("group_size")
    assert table["rank1_share"].tolist() == pytest.approx([0.8] * 3)  # median of 0.9 and 0.7
    assert table["all_path_rank1_share"].tolist() == pytest.approx([0.985] * 3)  # seeds 0, 1
    assert table["path_linearity"].tolist() == pytest.approx([0.9] * 3)
    assert (table["last_step"] == 20).all() and (table["weights"] == 2).all()


def test_details_gain_the_section_only_where_the_files_have_it(sweep, tmp_path):
    analyze([sweep], figures=False)
    text = (sweep / "analysis" / "details.md").read_text()
    assert "Beside the claims: energy outside the top directions" in text
    assert "0.125" in text and "0.985" in text  # E_1 at R = 8; the path share, three decimals
    assert "Beside the claims" not in (sweep / "analysis" / "summary.md").read_text()  # not a verdict
    plain = write_sweep(tmp_path / "plain", group_sizes=GROUP_SIZES, seeds=(0,))
    analyze([plain], figures=False)
    assert "Beside the claims" not in (plain / "analysis" / "details.md").read_text()
