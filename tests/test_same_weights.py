"""analysis/same_weights.py: claims 2 and 4 over `grpo probe` trees, each interval in its unit.

Probe runs are written by hand (ranks.csv rows with known per-group values), so every number the
readings give has a closed form: the mean of the units, the t-interval of those units, the
least-squares slope per doubling of R.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd
import pytest
from typer.testing import CliRunner

from grpo_cli.analysis.bootstrap import t_quantile
from grpo_cli.analysis.load import load_runs
from grpo_cli.analysis.rules import Rules
from grpo_cli.analysis.same_weights import CHECKPOINTS, GROUPS, PRETRAINED, same_weights
from grpo_cli.cli import app
from tests.results_factory import write_run

FACTS = {"grpo": {"name": "grpo", "credit": "outcome", "zero_sum_group": True},
         "otb": {"name": "otb", "credit": "per_token", "zero_sum_group": False}}


def write_probe(root, label: str, estimator: str, batch: int, size: int, step: int,
                source_seed: int, values: list[float], batch_value: float = 3.0):
    """One probe run (one R, one probe seed) of one checkpoint: per-group rollout_group rows
    with `values` (every group informative) and one rollout_batch row."""
    run = write_run(root / label / f"{estimator}-b{batch}", group_size=size, seed=100 + batch,
                    estimator=estimator, steps=step + 1, probe_every=max(step, 1),
                    matrices=("rollout_group",), name=f"R{size}")
    rows = [{"step": step, "matrix": "rollout_group", "layer": "", "group": f"g{g}",
             "minority": 1, "majority": size - 1, "erank_entropy": value}
            for g, value in enumerate(values)]
    rows.append({"step": step, "matrix": "rollout_batch", "layer": "", "group": "all",
                 "minority": math.nan, "majority": math.nan, "erank_entropy": batch_value})
    pd.DataFrame(rows).to_csv(run / "ranks.csv", index=False)
    record = json.loads((run / "run.json").read_text())
    record |= {"trainer": "grpo-probe", "kind": "probe", "estimator_facts": FACTS[estimator],
               "probe": {"source": f"train/s{source_seed}/step_{step:06d}.pt",
                         "source_kind": "checkpoint", "source_seed": source_seed}}
    (run / "run.json").write_text(json.dumps(record))
    return run


def per_r(reading, size):
    return reading.per_r[size].interval


def test_one_checkpoint_pools_its_groups_over_batches_as_units(tmp_path):
    """Two batches of 3 groups at R = 4: the per-R interval is the t-interval of the 6 groups."""
    values = {0: [1.0, 2.0, 3.0], 1: [2.5, 3.5, 1.5]}
    for batch, vals in values.items():
        for size in (4, 8):
            write_probe(tmp_path, "s0-step10", "grpo", batch, size, 10, 0,
                        vals if size == 4 else [v + 1 for v in vals])
    result = same_weights(load_runs([tmp_path]), Rules())
    (reading,) = result.checkpoints
    assert (reading.subject, reading.unit) == ("seed 0 step 10", GROUPS)
    pooled = np.array(values[0] + values[1])
    iv = per_r(reading, 4)
    half = t_quantile(0.95, 5) * pooled.std(ddof=1) / math.sqrt(6)
    assert iv.n == 6
    assert iv.estimate == pytest.approx(pooled.mean(), abs=1e-12)
    assert (iv.low, iv.high) == pytest.approx((pooled.mean() - half, pooled.mean() + half), abs=1e-9)
    # R = 8 is one higher in every group: the slope is exactly +1 per doubling
    assert reading.slope.estimate == pytest.approx(1.0, abs=1e-12)


def test_rank_r_minus_one_is_contradicted_and_flat_two_supported(tmp_path):
    """Per-group rank R - 1 (independent rows): slope over R = 4, 8, 16 of 3, 7, 15 is +6 per
    doubling; a flat 2 with a small spread reads supported."""
    rng = np.random.default_rng(0)
    for size in (2, 4, 8, 16):
        for batch in (0, 1):
            write_probe(tmp_path, "pretrained", "grpo", batch, size, 0, 0,
                        list(size - 1 + rng.normal(0, 0.05, 8)))
            write_probe(tmp_path, "s0-step10", "grpo", batch, size, 10, 0,
                        list(2.0 + rng.normal(0, 0.05, 8)))
    result = same_weights(load_runs([tmp_path]), Rules())
    by_subject = {r.subject: r for r in result.checkpoints}
    assert by_subject[PRETRAINED].verdict == "contradicted"
    assert by_subject[PRETRAINED].slope.estimate == pytest.approx(6.0, abs=0.1)
    assert by_subject["seed 0 step 10"].verdict == "supported"
    claim_map = result.claim_map.set_index(["matrix", "measure"])
    assert bool(claim_map.loc[("rollout_group", "erank_entropy"), "~2 at every checkpoint"]) is False


def test_trained_checkpoints_are_the_units_over_training_seeds(tmp_path):
    """Three training seeds whose groups agree tightly within a checkpoint but whose checkpoints
    differ: the reading over checkpoints has n = 3 and the spread of the three means."""
    level = {0: 2.0, 1: 3.0, 2: 4.0}
    for seed, base in level.items():
        for size in (8, 16):
            write_probe(tmp_path, f"s{seed}-step10", "grpo", 0, size, 10, seed,
                        [base + 0.5 * (size == 16) + d for d in (-0.01, 0.0, 0.01)])
    result = same_weights(load_runs([tmp_path]), Rules())
    (family,) = result.family
    assert (family.subject, family.unit) == ("step 10 over 3 checkpoints", CHECKPOINTS)
    iv = per_r(family, 8)
    means = np.array([2.0, 3.0, 4.0])
    half = t_quantile(0.95, 2) * means.std(ddof=1) / math.sqrt(3)
    assert iv.n == 3
    assert (iv.low, iv.high) == pytest.approx((3.0 - half, 3.0 + half), abs=1e-9)
    # every checkpoint grows by exactly 0.5: the paired per-checkpoint slopes have no spread
    assert family.slope.estimate == pytest.approx(0.5, abs=1e-9)
    assert family.slope.high - family.slope.low == pytest.approx(0.0, abs=1e-9)
    # within one checkpoint the groups' spread is tiny: far narrower than over checkpoints
    within = per_r(next(r for r in result.checkpoints if r.subject == "seed 0 step 10"), 8)
    assert within.high - within.low < (iv.high - iv.low) / 50


def test_claim4_pairs_the_same_rollouts_group_by_group(tmp_path):
    """otb = grpo + 1 in every group while the groups themselves spread widely: the paired
    difference is exactly 1 with no width (an unpaired interval would be wide)."""
    grpo = [0.5, 1.0, 2.5, 3.5, 0.2, 3.0]
    for size in (4, 8):
        write_probe(tmp_path, "pretrained", "grpo", 0, size, 0, 0, grpo)
        write_probe(tmp_path, "pretrained", "otb", 0, size, 0, 0, [v + 1.0 for v in grpo])
    result = same_weights(load_runs([tmp_path]), Rules())
    readings = {r.group_size: r for r in result.claim4}
    assert set(readings) == {4, 8}
    ia, ib, diff = readings[4].intervals
    assert diff.estimate == pytest.approx(1.0, abs=1e-12)
    assert diff.high - diff.low == pytest.approx(0.0, abs=1e-12)
    assert ib.high - ib.low > 1.5  # the per-token rank itself straddles the bar 2.5
    assert readings[4].part.verdict == "inconclusive"
    assert readings[4].n_units == len(grpo)


def test_cli_writes_the_same_weights_outputs_and_refuses_results_without_probes(tmp_path):
    for size in (4, 8):
        for batch in (0, 1):
            write_probe(tmp_path / "probe", "pretrained", "grpo", batch, size, 0, 0,
                        [2.0, 2.1, 1.9, 2.05])
    runner = CliRunner()
    done = runner.invoke(app, ["analyze", str(tmp_path / "probe"), "--same-weights"])
    assert done.exit_code == 0, done.output
    out = tmp_path / "probe" / "analysis"
    text = (out / "same_weights.md").read_text()
    assert "pretrained, rollout_group / erank_entropy: claim 2" in text
    assert "prompt groups on this checkpoint" in text
    assert {"same_weights_claim2.csv", "claim_map.csv", "same_weights.png"} <= {
        p.name for p in out.iterdir()}
    write_run(tmp_path / "train", group_size=4, seed=0)
    refused = runner.invoke(app, ["analyze", str(tmp_path / "train"), "--same-weights"])
    assert refused.exit_code == 1
    assert "no `grpo probe` run" in refused.output
