"""`grpo probe` directories in `grpo analyze` (grpo_cli/analysis/same_checkpoint.py): each
checkpoint's R values are read as a same-weights comparison."""

from __future__ import annotations

import pytest
from results_factory import write_probe_sweep, write_run

from grpo_cli.analysis.load import load_runs
from grpo_cli.analysis.pipeline import analyze
from grpo_cli.analysis.rules import Rules
from grpo_cli.analysis.same_checkpoint import checkpoint_table, is_probe
from grpo_cli.analysis.tables import rank_table


@pytest.fixture
def probe_dir(tmp_path):
    return write_probe_sweep(tmp_path / "probe")


def test_each_checkpoint_gets_its_own_reading_on_the_uncapped_r(probe_dir):
    runs = load_runs([probe_dir])
    for run in runs:
        run.variant = ""
    assert all(is_probe(run) for run in runs)
    table = checkpoint_table(runs, rank_table(runs, ["erank_entropy"]), Rules()).set_index("checkpoint step")
    assert table.loc[0, "judged R"] == "4,8,16"  # R=2 is capped
    assert table.loc[0, "slope / doubling"] == pytest.approx(0.0, abs=1e-12)
    assert table.loc[10, "slope / doubling"] == pytest.approx(0.5)
    assert table.loc[10, "R=16"] == pytest.approx(3.01)  # 2 + 2 x 0.5, seeds 0 and 1
    assert table.loc[10, "max dev. from 2"] == pytest.approx(1.01)
    assert set(table["seeds"]) == {2}
    # seeds 0 and 1 differ by a constant: their per-seed slopes agree, the interval has no width
    assert table.loc[10, "slope low"] == pytest.approx(0.5)
    assert table.loc[10, "slope high"] == pytest.approx(0.5)


def test_analyze_calls_them_same_checkpoint_comparisons(probe_dir):
    result = analyze([probe_dir], measure="erank_entropy", figures=False)
    summary = result.files["details_md"].read_text().split("## Runs")[0]
    assert "Claim 2 on the same checkpoint (grpo probe)" in summary
    assert "Same checkpoint: every R of runs/R4-grpo-s0 was sampled from the same weights" in summary
    # two seeds with equal per-seed slopes: a zero-width seed-level interval
    assert "step 10: slope +0.50 [+0.50, +0.50] per doubling over R=4,8,16" in summary


def test_training_runs_have_no_same_checkpoint_table(tmp_path):
    write_run(tmp_path / "sweep", group_size=4, seed=0, matrices=("rollout_group",))
    runs = load_runs([tmp_path / "sweep"])
    assert not is_probe(runs[0])
    assert checkpoint_table(runs, rank_table(runs, ["erank_entropy"]), Rules()).empty


def test_same_checkpoint_slope_interval_is_the_t_interval_of_per_seed_slopes():
    """Per-seed slopes 0.4, 0.5, 0.6 over R = 4, 8: mean 0.5 +- t_2 0.1 / sqrt(3)."""
    import math

    import pandas as pd

    from grpo_cli.analysis.rules import Rules
    from grpo_cli.analysis.same_checkpoint import _slope_interval

    part = pd.DataFrame({"seed": [0, 0, 1, 1, 2, 2], "group_size": [4, 8] * 3, "step": 10,
                         "run_id": [f"R{r}-s{s}" for s in range(3) for r in (4, 8)],
                         "value": [2.0, 2.4, 2.0, 2.5, 2.0, 2.6]})
    rules = Rules(confidence=0.9)
    low, high = _slope_interval(part, [4, 8], rules)
    half = 2.9200 * 0.1 / math.sqrt(3)
    assert (low, high) == pytest.approx((0.5 - half, 0.5 + half), abs=1e-4)
    assert all(map(math.isnan, _slope_interval(part[part["seed"] == 0], [4, 8], rules)))
