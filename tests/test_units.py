"""Issue 60: the analysis knows its unit. Which initial model each run recorded (run.json
`initial_model`, read by load.Run.initial_model) decides whether a reading's seeds are
independent replicates of the experiment or RL seeds on one shared model."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
from results_factory import write_probe_sweep, write_sweep

from grpo_cli.analysis import units
from grpo_cli.analysis.load import Run


def _run(seed: int, info: dict | None = None, source: str = "char_llama", variant: str = "") -> Run:
    empty = pd.DataFrame()
    run = Run(Path(f"R4-s{seed}"), "completed", None, info or {},
              {"seed": seed, "model.source": source, "rollout.group_size": 4}, empty, empty,
              empty, empty, None)
    run.variant = variant
    return run


def _warm(seed: int, key: str, shared: bool) -> dict:
    return {"initial_model": {"kind": "warm_start", "key": key, "seed": seed, "shared": shared}}


def test_legacy_results_read_as_one_shared_model():
    """No `initial_model`: char_llama is the old design (one warm start for every seed), any
    other source one pretrained model; a probe directory shares its checkpoint."""
    warm = _run(0).initial_model
    assert (warm["kind"], warm["shared"], warm["legacy"]) == ("warm_start", True, True)
    assert _run(0, source="hf").initial_model["kind"] == "pretrained"
    probe = _run(0, {"kind": "probe", "probe": {"source": "runs/R4-s0"}}).initial_model
    assert (probe["kind"], probe["path"], probe["shared"]) == ("checkpoint", "runs/R4-s0", True)
    unit = units.unit_of([_run(s) for s in range(4)])
    assert unit.kind == units.SHARED_MODEL and unit.legacy and unit.runs == 4
    assert unit.clause == "conditional on one warm start"
    assert "old design" in unit.sentence()


def test_each_seed_its_own_warm_start_is_independent():
    runs = [_run(s, _warm(s, f"{s:016x}", False)) for s in range(3)]
    unit = units.unit_of(runs)
    assert unit.kind == units.INDEPENDENT and not unit.conditional and unit.clause == ""
    assert unit.words == "independent seeds (each its own warm start)"
    assert "speak for the experiment" in unit.sentence()


def test_a_pinned_warm_start_or_a_repeated_key_is_shared():
    """shared=true (model.warm_start.seed set), or two seeds that recorded one key."""
    pinned = units.unit_of([_run(s, _warm(s, "ab" * 8, True)) for s in range(2)])
    assert pinned.kind == units.SHARED_MODEL and pinned.where == "ab" * 8
    assert pinned.words == "RL seeds on one shared warm start (conditional on it)"
    repeated = units.unit_of([_run(s, _warm(s, "cd" * 8, False)) for s in range(2)])
    assert repeated.kind == units.SHARED_MODEL
    # one seed at several R (the same key, the same seed) stays independent
    same_seed = [_run(0, _warm(0, "ef" * 8, False)), _run(0, _warm(0, "ef" * 8, False))]
    assert units.unit_of(same_seed).kind == units.INDEPENDENT


def test_pretrained_model_and_mixtures():
    pretrained = {"initial_model": {"kind": "pretrained", "source": "hf", "path": "/m/smollm",
                                    "shared": True}}
    unit = units.unit_of([_run(s, pretrained) for s in range(2)])
    assert unit.words == "RL seeds on one shared pretrained model (conditional on it)"
    assert "(/m/smollm)" in unit.sentence() and not unit.legacy
    # one shared run makes the whole reading conditional
    mixed = [_run(0, _warm(0, "01" * 8, False)), _run(1, pretrained)]
    assert units.unit_of(mixed).kind == units.SHARED_MODEL
    assert units.unit_of([]) is None
    random = [_run(s, {"initial_model": {"kind": "random", "seed": s, "shared": False}})
              for s in range(2)]
    assert units.unit_of(random).words == "independent seeds (each its own random initialisation)"


def test_units_by_variant():
    runs = [_run(0, variant="a"), _run(1, _warm(1, "12" * 8, False), variant="b")]
    found = units.units_by_variant(runs)
    assert found["a"].kind == units.SHARED_MODEL and found["b"].kind == units.INDEPENDENT


def test_analyze_says_the_unit_in_the_claims_and_the_verdict_table(tmp_path):
    """The fixtures (no initial_model) are the old design: the claims and the verdict table
    say their intervals are conditional on one warm start; probe directories on one checkpoint."""
    from grpo_cli.analysis.pipeline import analyze
    from grpo_cli.analysis.report import verdict_table

    result = analyze([write_sweep(tmp_path / "sweep", seeds=(0, 1))], figures=False)
    claim2 = result.claims[1]
    assert claim2.unit.clause == "conditional on one warm start"
    summary = result.files["details_md"].read_text()
    assert "conditional on one warm start" in summary and "Unit: RL seeds on one shared" in summary
    table = verdict_table(result, result.verdicts)
    assert set(table["unit"]) == {"RL seeds on one shared warm start (conditional on it)"}
    frame = pd.read_csv(result.files["summary_csv"])
    shared = "RL seeds on one shared warm start (conditional on it)"
    assert set(frame.loc[frame["kind"] == "verdict", "unit"]) == {shared}
    assert frame.loc[frame["kind"] == "claim", "unit"].tolist() == ["-", shared, shared, "-"]
    probes = analyze([write_probe_sweep(tmp_path / "probe")], figures=False)
    assert probes.claims[1].unit.kind == units.PROMPT_GROUPS
