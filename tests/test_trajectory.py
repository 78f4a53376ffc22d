"""The update's trajectory over kept checkpoints (grpo_cli/probes/trajectory.py, `grpo trajectory`):
closed forms (a path exactly rank-1 and linear; rank-1 but not linear), an independent float64
computation (numpy's SVD of the stacked deltas), the named failure modes (one kept checkpoint, a
weight that never moved, no kept checkpoint) and the file a run directory gets."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
import torch
from typer.testing import CliRunner

from grpo_cli.cli import app
from grpo_cli.config.errors import InputError
from grpo_cli.measures import TRAJECTORY_COLUMNS
from grpo_cli.probes.trajectory import path_measures, trajectory_rows
from grpo_cli.train.trajectory_run import write_trajectory

EPS = np.finfo(np.float64).eps
STEPS = [2, 4, 6, 8]


def random_matrix(seed: int, shape=(5, 3)) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def rows_of(rows: list[dict], layer: str) -> list[dict]:
    return [row for row in rows if row["layer"] == layer]


def test_a_path_exactly_rank_one_and_linear_reads_one_everywhere():
    """D_t = 0.1 t u v^T: every update is a rank-1 matrix, all of them along one matrix, at a
    constant rate per step."""
    u, v = random_matrix(0, (5, 1)), random_matrix(1, (1, 3))
    start = random_matrix(2)
    weights = [{"w": start + 0.1 * step * (u @ v)} for step in STEPS]
    rows = trajectory_rows({"w": start}, STEPS, weights)
    tolerance = 64 * EPS  # float64 round-off of sums over 15 entries and a 4 x 4 eigensolver
    for layer in ("w", "all"):
        for row in rows_of(rows, layer):
            assert row["cosine_to_last"] == pytest.approx(1.0, abs=tolerance)
            assert row["update_norm"] == pytest.approx(0.1 * row["step"] * float((u @ v).norm()), rel=tolerance)
        assert [row["step"] for row in rows_of(rows, layer)] == STEPS
        assert math.isnan(rows_of(rows, layer)[0]["path_rank1_share"])  # one kept step: no path yet
        for row in rows_of(rows, layer)[1:]:
            assert row["path_rank1_share"] == pytest.approx(1.0, abs=tolerance)
            assert row["path_linearity"] == pytest.approx(1.0, abs=tolerance)
    assert all(row["rank1_share"] == pytest.approx(1.0, abs=tolerance) for row in rows_of(rows, "w"))
    assert all(math.isnan(row["rank1_share"]) for row in rows_of(rows, "all"))  # not one matrix


def test_a_rank_one_path_that_accelerates_is_not_linear():
    """D_t = t^2 D: one direction (share 1) whose coordinate grows as t^2, so the line through
    (0, 0) and (t, t^2 |D|) fits with R^2 = corr(t, t^2)^2 over those points (closed form below)."""
    direction = random_matrix(3)
    steps = [1, 2, 3]
    rows = trajectory_rows({"w": torch.zeros(5, 3, dtype=torch.float64)}, steps,
                           [{"w": step**2 * direction} for step in steps])
    last = rows_of(rows, "w")[-1]
    assert last["path_rank1_share"] == pytest.approx(1.0, abs=64 * EPS)
    # points (0, 0), (1, 1), (2, 4), (3, 9): means 1.5, 3.5; Sxy = 15, Sxx = 5, Syy = 49
    assert last["path_linearity"] == pytest.approx(15**2 / (5 * 49), rel=64 * EPS)


def test_path_measures_equal_numpys_svd_of_the_stacked_deltas():
    """Independent float64: stack vec D_s as rows; its first singular value's share of the energy
    is path_rank1_share, and R^2 of the coordinates U[:, 0] s_0 against the steps (origin
    included, numpy's polyfit) is path_linearity; rank1_share is each D_t's own SVD."""
    start = random_matrix(4)
    deltas = [0.3 * step * random_matrix(5) + random_matrix(10 + step) for step in STEPS]
    rows = rows_of(trajectory_rows({"w": start}, STEPS, [{"w": start + d} for d in deltas]), "w")
    stacked = np.stack([d.numpy().reshape(-1) for d in deltas])  # [T, P]
    left, values, _ = np.linalg.svd(stacked, full_matrices=False)
    x = np.array([0.0, *STEPS])
    y = np.concatenate([[0.0], left[:, 0] * values[0]])
    fitted = np.polyval(np.polyfit(x, y, 1), x)
    r_squared = 1 - ((y - fitted) ** 2).sum() / ((y - y.mean()) ** 2).sum()
    assert rows[-1]["path_rank1_share"] == pytest.approx(values[0] ** 2 / (values**2).sum(), rel=1e-12)
    assert rows[-1]["path_linearity"] == pytest.approx(r_squared, rel=1e-10)
    assert 0.5 < rows[-1]["path_rank1_share"] < 0.999 and rows[-1]["path_linearity"] < 0.999  # not trivial
    for row, delta in zip(rows, deltas, strict=True):
        sigma = np.linalg.svd(delta.numpy(), compute_uv=False)
        assert row["rank1_share"] == pytest.approx(sigma[0] ** 2 / (sigma**2).sum(), rel=1e-12)
        cosine = float(delta.reshape(-1) @ deltas[-1].reshape(-1)) / float(delta.norm() * deltas[-1].norm())
        assert row["cosine_to_last"] == pytest.approx(cosine, rel=1e-12)


def test_all_is_the_trajectory_of_every_weight_together():
    """Two weights moving along orthogonal directions at different rates: each alone is rank-1
    and linear, together the path holds two directions (share < 1), in closed form
    lambda = (sum_t (a t)^2, sum_t (b t)^2) over one orthogonal pair of coordinates."""
    a, b = random_matrix(6), random_matrix(7, (2, 2))
    rows = trajectory_rows({"a": 0 * a, "b": 0 * b}, STEPS,
                           [{"a": step * a, "b": step**2 * b} for step in STEPS])
    together = rows_of(rows, "all")[-1]
    gram = sum(torch.outer(torch.tensor(c, dtype=torch.float64), torch.tensor(c, dtype=torch.float64)) * float(m.square().sum())
               for c, m in (([s for s in STEPS], a), ([s**2 for s in STEPS], b)))
    eigenvalues = np.linalg.eigvalsh(gram.numpy())
    assert together["path_rank1_share"] == pytest.approx(eigenvalues[-1] / eigenvalues.sum(), rel=1e-12)
    assert together["update_norm"] == pytest.approx(math.hypot(8 * float(a.norm()), 64 * float(b.norm())), rel=1e-12)


def test_named_failure_modes():
    """One kept checkpoint: the per-step columns, no path. A weight that never moved: shares 0
    (as every spectrum measure), no linearity and no cosine. No checkpoint at all: refused."""
    start = random_matrix(8)
    (one, everything) = trajectory_rows({"w": start}, [5], [{"w": start + random_matrix(9)}])
    assert 0 < one["rank1_share"] < 1 and one["cosine_to_last"] == pytest.approx(1.0)
    assert math.isnan(one["path_rank1_share"]) and math.isnan(one["path_linearity"])
    assert everything["layer"] == "all"
    still = rows_of(trajectory_rows({"w": start}, STEPS, [{"w": start.clone()}] * 4), "w")
    assert all(row["rank1_share"] == 0.0 and row["update_norm"] == 0.0 for row in still)
    assert still[-1]["path_rank1_share"] == 0.0 and math.isnan(still[-1]["path_linearity"])
    assert math.isnan(still[-1]["cosine_to_last"])
    assert all(math.isnan(value) for value in path_measures(torch.ones(1, 1), [3]))  # one point
    with pytest.raises(ValueError, match="at least one kept checkpoint"):
        trajectory_rows({"w": start}, [], [])


def kept_run(tmp_path, steps, *, with_start=True) -> tuple:
    """A run directory with config.yaml and weight snapshots of a two-weight model."""
    run_dir = tmp_path / "run"
    (run_dir / "checkpoints").mkdir(parents=True)
    (run_dir / "config.yaml").write_text("seed: 0\n")
    start = {"model.layers.0.self_attn.q_proj.weight": random_matrix(11, (4, 4)),
             "model.norm.weight": torch.ones(4)}  # 1-D: never a trajectory
    direction = random_matrix(12, (4, 4))
    for step in ([0] if with_start else []) + list(steps):
        model = dict(start)
        model["model.layers.0.self_attn.q_proj.weight"] = start["model.layers.0.self_attn.q_proj.weight"] + step * direction
        torch.save({"next_step": step, "model": model, "value_head": None},
                   run_dir / "checkpoints" / f"step_{step:06d}.pt")
    return run_dir, start


def test_write_trajectory_reads_the_kept_checkpoints_against_step_zero(tmp_path):
    run_dir, _ = kept_run(tmp_path, [10, 20, 30])
    path = write_trajectory(run_dir)
    table = pd.read_csv(path)
    assert path == run_dir / "trajectory.csv" and table.columns.tolist() == list(TRAJECTORY_COLUMNS)
    assert table.layer.tolist() == ["model.layers.0.self_attn.q_proj.weight"] * 3 + ["all"] * 3
    assert table.step.tolist() == [10, 20, 30] * 2  # step 0 is W_0, not a point of the path
    assert table.path_linearity.dropna().to_numpy() == pytest.approx(1.0, abs=64 * EPS)
    assert table.cosine_to_last.to_numpy() == pytest.approx(1.0, abs=64 * EPS)


def test_write_trajectory_takes_w0_from_the_probes_initial_layers(tmp_path):
    run_dir, start = kept_run(tmp_path, [10, 20], with_start=False)
    name = "model.layers.0.self_attn.q_proj.weight"
    torch.save({name: start[name]}, run_dir / "checkpoints" / "initial_layers.pt")
    table = pd.read_csv(write_trajectory(run_dir))
    first = table[(table.layer == name) & (table.step == 10)].iloc[0]
    assert first.update_norm == pytest.approx(10 * float(random_matrix(12, (4, 4)).norm()), rel=1e-12)


def test_trajectory_command_refuses_a_run_without_kept_checkpoints_in_one_line(tmp_path):
    run_dir, _ = kept_run(tmp_path, [], with_start=False)
    with pytest.raises(InputError, match="no kept checkpoints"):
        write_trajectory(run_dir)
    result = CliRunner().invoke(app, ["trajectory", str(run_dir)])
    assert result.exit_code == 1
    assert result.output.strip().count("\n") == 0 and "keep_checkpoints=true" in result.output
    only_start, _ = kept_run(tmp_path / "w0", [])
    with pytest.raises(InputError, match="no kept checkpoint after step 0"):
        write_trajectory(only_start)
    result = CliRunner().invoke(app, ["trajectory", str(kept_run(tmp_path / "ok", [3, 6])[0]),
                                      "--layer-regex", "nothing_matches"])
    assert result.exit_code == 1 and "selects no 2-D weight" in result.output
