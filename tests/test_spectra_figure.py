"""The spectra figure's data (grpo_cli/analysis/plots.py): sigma_k / sigma_1 per matrix, and one
call over a run's steps gives what one call per step gives."""

from __future__ import annotations

import pandas as pd
import pytest

from grpo_cli.analysis.plots import normalised_spectra


def _rows(step, matrix, layer, group, sigmas):
    return [{"step": step, "matrix": matrix, "layer": layer, "group": group, "k": k, "sigma": sigma}
            for k, sigma in enumerate(sigmas)]


def _spectra() -> pd.DataFrame:
    rows = []
    for step, scale in ((0, 1.0), (5, 3.0)):
        rows += _rows(step, "rollout_group", "", "g0", [4 * scale, 2 * scale, 1 * scale])
        rows += _rows(step, "rollout_group", "", "g1", [2.0, 2.0])
        rows += _rows(step, "rollout_group", "", "mean", [9.0, 9.0, 9.0])  # not a group: left out
        rows += _rows(step, "rollout_batch", "", "all", [5.0, 1.0, 0.5, "nan"])
        # layer spectra of unequal length, shortest 2 at step 0 and 3 at step 5
        rows += _rows(step, "layer", "a.weight", "all", [8.0, 4.0, 2.0, 1.0])
        rows += _rows(step, "layer", "b.weight", "all", [1.0, 0.5] + ([0.25] if step == 5 else []))
        rows += _rows(step, "update", "a.weight", "all", [0.0, 0.0])  # a zero matrix: no spectrum
    return pd.DataFrame(rows)


def test_normalised_spectra_divide_by_the_top_singular_value():
    spectrum = normalised_spectra(_spectra()[lambda t: t["step"] == 0])
    values = {(row.matrix, row.index): row.value for row in spectrum.itertuples()}
    # rollout_group: mean over groups g0 [1, .5, .25] and g1 [1, 1] per index
    assert values[("rollout_group", 1)] == 1.0 and values[("rollout_group", 2)] == pytest.approx(0.75)
    assert values[("rollout_group", 3)] == pytest.approx(0.25)
    assert values[("rollout_batch", 3)] == pytest.approx(0.1)
    assert ("rollout_batch", 4) not in values  # the NaN value is left out
    # layer: up to the shortest spectrum (2 values), mean of [1, .5] and [1, .5]
    assert [values[("layer", k)] for k in (1, 2)] == pytest.approx([1.0, 0.5])
    assert ("layer", 3) not in values and not any(m == "update" for m, _ in values)


def test_one_call_over_steps_equals_one_call_per_step():
    table = _spectra()
    together = normalised_spectra(table, by=("step",))
    assert set(together["step"]) == {0, 5}
    assert (together.loc[together["matrix"] == "layer", "index"].max()) == 3  # step 5: 3 values
    for step in (0, 5):
        alone = normalised_spectra(table[table["step"] == step]).reset_index(drop=True)
        picked = together[together["step"] == step].drop(columns="step").reset_index(drop=True)
        pd.testing.assert_frame_equal(picked, alone)
