"""Claims 2 and 4 on the same weights, over checkpoints: `grpo probe` trees (issue 62).

`make smollm2-probe` probes one pretrained model and checkpoints of independently trained seeds
(each at more than one point of training) at every R on the same prompts, under an outcome
estimator (grpo) and per-token ones (otb, process). At one checkpoint, probe seed and R the
estimators sample the very same rollouts (the probe's draws depend on the weights, the seed and
the step only), so claim 4 is read group by group, with no sampling noise between its sides.

Two units answer two questions, and every interval says which it is:

- **prompt groups on one checkpoint** ("this checkpoint"): a checkpoint's informative groups,
  pooled over its probe batches (probe seeds), are the units of its per-R intervals. The slope
  over R is Welch's interval of a linear combination of the per-R means; the batches at every R
  draw their prompts from one order per probe seed, so two R values can share prompts, which
  makes that interval conservative (shared prompts correlate the means positively).
- **independently trained checkpoints** ("SmolLM2 under GRPO after N steps"): each checkpoint's
  per-R mean is one unit, the slope is the t-interval of the per-checkpoint slopes (paired by
  training seed), claim 4's difference the t-interval of the per-checkpoint mean differences.
  The checkpoints share the one pretrained model they were trained from: conditional on it.

Claim 2 reads the rule book's parts (rank_verdict.over_r_parts: 2b growth within the tolerance,
2c the level within the band); claim 4 falsifier.judge_pair on the rule book's matrix and
deciding rows (credit_compare). The claim map reads claim 2's rule on every candidate matrix x
measure the probes recorded: which read "~2 whatever R" (the paper names neither).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import pandas as pd

from grpo_cli.analysis import bootstrap as bs
from grpo_cli.analysis import credit_compare as cc
from grpo_cli.analysis.falsifier import judge_pair
from grpo_cli.analysis.load import Run
from grpo_cli.analysis.over_r import PerR
from grpo_cli.analysis.rank_verdict import over_r_parts, rank_bounds, rng_for
from grpo_cli.analysis.rules import OUTCOME, PER_TOKEN, Rules, estimator_family, judged_group_sizes
from grpo_cli.analysis.same_checkpoint import is_probe
from grpo_cli.analysis.tables import LAYER_MATRICES, PER_GROUP_MATRICES
from grpo_cli.measures import RANK_MEASURES

PRETRAINED = "pretrained"
GROUPS, CHECKPOINTS = "prompt groups on one checkpoint", "independently trained checkpoints"
UNIT_COLUMNS = ["checkpoint", "training_seed", "step", "variant", "family", "group_size",
                "probe_seed", "matrix", "measure", "unit", "value"]


def checkpoint_label(training_seed: int | None, step: int) -> str:
    """'pretrained' for step 0 (every seed starts from the one model), else 'seed S step N'."""
    return PRETRAINED if step == 0 else f"seed {training_seed} step {step}"


def _source_seed(run: Run) -> int | None:
    probe = run.info.get("probe") or {}
    value = probe.get("source_seed")
    return None if value is None else int(value)


def _run_units(run: Run, rules: Rules) -> pd.DataFrame:
    """One row per unit of one probe run: per-group matrices' deciding groups (credit_compare:
    informative, multi-step where recorded), one row per batch for the whole-batch ones (layer
    matrices: the mean over layers)."""
    ranks, frames = run.ranks, []
    measures = [m for m in RANK_MEASURES if m in ranks]
    for matrix, rows in ranks.groupby("matrix", sort=False):
        if matrix in PER_GROUP_MATRICES:
            rows = rows[rows["group"].astype(str).str.startswith("g")]
            selections = cc.group_selections(rows, rules)
            rows = selections[cc.deciding_stat(set(selections))]
            rows = rows.assign(unit=rows["group"].astype(str))
        else:
            rows = rows[rows["group"].astype(str).isin(["all", ""])]
            if matrix in LAYER_MATRICES:
                rows = rows.groupby("step", as_index=False)[measures].mean()
            rows = rows.assign(unit="batch")
        for measure in measures:
            frames.append(rows[["step", "unit"]].assign(
                matrix=matrix, measure=measure, value=pd.to_numeric(rows[measure], errors="coerce")))
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


def unit_frame(runs: list[Run], rules: Rules) -> pd.DataFrame:
    """Every probe run's units, long (UNIT_COLUMNS): the checkpoint (pretrained, or training
    seed x step), the estimator and its family, R, the probe seed and the value."""
    frames = []
    for run in runs:
        if not is_probe(run) or run.ranks.empty or run.group_size is None:
            continue
        units = _run_units(run, rules)
        if units.empty:
            continue
        seed = _source_seed(run)
        facts = run.estimator_facts
        units = units.assign(
            training_seed=seed, variant=str(facts["name"]), family=estimator_family(facts),
            group_size=run.group_size, probe_seed=run.seed,
            checkpoint=[checkpoint_label(seed, int(s)) for s in units["step"]])
        units["unit"] = units["probe_seed"].astype(str) + "/" + units["unit"].astype(str)
        frames.append(units)
    if not frames:
        return pd.DataFrame(columns=UNIT_COLUMNS)
    return pd.concat(frames, ignore_index=True)[UNIT_COLUMNS].dropna(subset=["value"])


@dataclass(frozen=True)
class Claim2Reading:
    """Claim 2's rule on one checkpoint (or one training step over checkpoints) and one matrix
    x measure: per-R intervals, the slope, the parts and the verdict."""

    subject: str  # a checkpoint label, or "step N over k checkpoints"
    unit: str  # GROUPS | CHECKPOINTS
    matrix: str
    measure: str
    per_r: dict  # R -> PerR
    slope: bs.Interval | None
    parts: tuple  # rank_verdict.Part: 2a, 2b, 2c
    verdict: str


def _claim2(subject: str, unit: str, matrix: str, measure: str, per_r: dict, rules: Rules
            ) -> Claim2Reading:
    rng = rng_for(rules, "same weights", subject, matrix, measure)
    parts, slope_iv, verdict = over_r_parts(per_r, rules, rng,
                                            lambda r: rank_bounds(matrix, "mean", r))
    return Claim2Reading(subject, unit, matrix, measure, per_r, slope_iv, tuple(parts), verdict)


def _group_per_r(part: pd.DataFrame, matrix: str, rules: Rules, key) -> dict[int, PerR]:
    """R -> PerR over the units of one checkpoint (groups, or batches for whole matrices)."""
    out = {}
    for size, rows in part.groupby("group_size"):
        size = int(size)
        rng = rng_for(rules, "same weights", *key, size)
        values = rows["value"].to_numpy(float)
        iv = bs.mean_interval(values, rules.confidence, rng, rules.resamples,
                              rank_bounds(matrix, "mean", size))
        out[size] = PerR(iv, values, None)
    return out


def checkpoint_readings(units: pd.DataFrame, rules: Rules, matrix: str | None = None,
                        measure: str | None = None) -> list[Claim2Reading]:
    """Claim 2 per checkpoint on the outcome estimators' probes, units the prompt groups;
    `matrix` / `measure` default to the rule book's (None for both and `all`: every pair)."""
    picked = units[units["family"] == OUTCOME]
    if matrix is not None:
        picked = picked[(picked["matrix"] == matrix) & (picked["measure"] == measure)]
    out = []
    for (checkpoint, mat, meas), part in picked.groupby(["checkpoint", "matrix", "measure"],
                                                         sort=False):
        per_r = _group_per_r(part, mat, rules, (checkpoint, mat, meas))
        out.append(_claim2(checkpoint, GROUPS, mat, meas, per_r, rules))
    return out


def family_readings(units: pd.DataFrame, rules: Rules) -> list[Claim2Reading]:
    """Claim 2 per training step over the independently trained checkpoints at that step (>= 2),
    on the rule book's matrix and measure: one unit per checkpoint (its mean over groups)."""
    matrix, measure = rules.rank_matrix, rules.rank_measure
    picked = units[(units["family"] == OUTCOME) & (units["matrix"] == matrix)
                   & (units["measure"] == measure) & (units["checkpoint"] != PRETRAINED)]
    out = []
    for step, part in picked.groupby("step"):
        means = part.groupby(["group_size", "training_seed"])["value"].mean()
        seeds = sorted(part["training_seed"].unique())
        if len(seeds) < 2:
            continue
        per_r = {}
        for size, by_seed in means.groupby(level="group_size"):
            by_seed = by_seed.droplevel("group_size")
            if set(by_seed.index) != set(seeds):
                continue  # a checkpoint without this R would unpair the slope
            values = by_seed.loc[seeds].to_numpy(float)
            iv = bs.mean_interval(values, rules.confidence,
                                  rng_for(rules, "same weights", "family", int(step), int(size)),
                                  rules.resamples, rank_bounds(matrix, "mean", int(size)))
            per_r[int(size)] = PerR(iv, values, tuple(seeds))
        subject = f"step {int(step)} over {len(seeds)} checkpoints"
        out.append(_claim2(subject, CHECKPOINTS, matrix, measure, per_r, rules))
    return out


@dataclass(frozen=True)
class Claim4Reading:
    """Claim 4 on the very same rollouts at one R: per-token minus outcome, paired."""

    subject: str
    unit: str
    outcome: str
    per_token: str
    group_size: int
    part: object  # rank_verdict.Part from falsifier.judge_pair
    intervals: tuple  # (outcome, per-token, difference) bs.Interval
    n_units: int


def paired_groups(units: pd.DataFrame, rules: Rules) -> pd.DataFrame:
    """The rule book's matrix x measure, one row per checkpoint x R x unit (probe seed and
    group), one column per estimator that probed it: the same rollouts under each."""
    picked = units[(units["matrix"] == rules.rank_matrix) & (units["measure"] == rules.rank_measure)]
    if picked.empty:
        return pd.DataFrame()
    return picked.pivot_table(index=["checkpoint", "training_seed", "step", "group_size", "unit"],
                              columns="variant", values="value", aggfunc="first",
                              dropna=False).reset_index()


def _judge_units(subject: str, unit: str, base: str, other: str, size: int,
                 pairs: pd.DataFrame, rules: Rules) -> Claim4Reading:
    rng = rng_for(rules, "same weights 4", subject, base, other, size)
    bounds = rank_bounds(rules.rank_matrix, "mean", size)
    ia = bs.mean_interval(pairs[base].to_numpy(float), rules.confidence, rng, rules.resamples, bounds)
    ib = bs.mean_interval(pairs[other].to_numpy(float), rules.confidence, rng, rules.resamples,
                          bounds)
    diff = bs.mean_interval((pairs[other] - pairs[base]).to_numpy(float), rules.confidence, rng,
                            rules.resamples)
    name = f"{other} vs {base} at R={size}, {subject} (same rollouts)"
    return Claim4Reading(subject, unit, base, other, size, judge_pair(name, ia, ib, diff, rules),
                         (ia, ib, diff), len(pairs))


def claim4_readings(units: pd.DataFrame, rules: Rules) -> list[Claim4Reading]:
    """Per checkpoint (units: its groups) and per training step over checkpoints (units: each
    checkpoint's mean paired difference), at every judged R, per outcome x per-token pair."""
    paired = paired_groups(units, rules)
    if paired.empty:
        return []
    families = units.groupby("variant")["family"].first()
    outcome = sorted(v for v, f in families.items() if f == OUTCOME)
    per_token = sorted(v for v, f in families.items() if f == PER_TOKEN)
    out = []
    for base in outcome:
        for other in per_token:
            both = paired.dropna(subset=[base, other])
            for size in judged_group_sizes(sorted(set(both["group_size"])), rules.target):
                at = both[both["group_size"] == size]
                for checkpoint, part in at.groupby("checkpoint", sort=False):
                    out.append(_judge_units(checkpoint, GROUPS, base, other, size, part, rules))
                trained = at[at["checkpoint"] != PRETRAINED]
                for step, part in trained.groupby("step"):
                    per_ckpt = part.groupby("training_seed")[[base, other]].mean()
                    if len(per_ckpt) >= 2:
                        subject = f"step {int(step)} over {len(per_ckpt)} checkpoints"
                        out.append(_judge_units(subject, CHECKPOINTS, base, other, size,
                                                per_ckpt, rules))
    return out


def claim2_table(readings: list[Claim2Reading]) -> pd.DataFrame:
    """One row per reading: subject, unit, matrix, measure, per-R estimate [low, high], n, slope."""
    rows = []
    for reading in readings:
        row = {"subject": reading.subject, "unit": reading.unit, "matrix": reading.matrix,
               "measure": reading.measure, "verdict": reading.verdict}
        for size, per in sorted(reading.per_r.items()):
            iv = per.interval
            row |= {f"R={size}": iv.estimate, f"R={size} low": iv.low, f"R={size} high": iv.high,
                    f"R={size} n": iv.n}
        slope = reading.slope
        row |= {"slope": slope.estimate if slope else math.nan,
                "slope low": slope.low if slope else math.nan,
                "slope high": slope.high if slope else math.nan}
        row |= {f"verdict {p.name}": p.verdict for p in reading.parts}
        rows.append(row)
    return pd.DataFrame(rows)


def claim4_table(readings: list[Claim4Reading]) -> pd.DataFrame:
    rows = []
    for reading in readings:
        row = {"subject": reading.subject, "unit": reading.unit, "outcome": reading.outcome,
               "per-token": reading.per_token, "R": reading.group_size, "n": reading.n_units,
               "verdict": reading.part.verdict}
        for label, iv in zip(("outcome rank", "per-token rank", "difference"), reading.intervals,
                             strict=True):
            row |= {label: iv.estimate, f"{label} low": iv.low, f"{label} high": iv.high}
        rows.append(row)
    return pd.DataFrame(rows)


def claim_map(readings: list[Claim2Reading]) -> pd.DataFrame:
    """Matrix x measure rows, one column per checkpoint: claim 2's verdict there with the slope
    per doubling (the candidates the paper may mean, read by one rule)."""
    if not readings:
        return pd.DataFrame()
    cells = pd.DataFrame([{
        "matrix": r.matrix, "measure": r.measure, "checkpoint": r.subject,
        "reading": (f"{r.verdict} ({r.slope.estimate:+.2f}/doubling)" if r.slope is not None
                    else r.verdict),
        "reads ~2 whatever R": r.verdict == "supported"} for r in readings])
    table = cells.pivot_table(index=["matrix", "measure"], columns="checkpoint",
                              values="reading", aggfunc="first")
    table["~2 at every checkpoint"] = cells.groupby(["matrix", "measure"])[
        "reads ~2 whatever R"].all()
    return table.reset_index()


@dataclass(frozen=True)
class SameWeights:
    """What the same-weights analysis hands the renderer: tables and readings, no text."""

    units: pd.DataFrame
    checkpoints: list[Claim2Reading]  # claim 2, rule book's pair, per checkpoint
    family: list[Claim2Reading]  # claim 2 over trained checkpoints, per training step
    claim4: list[Claim4Reading]
    claim_map: pd.DataFrame
    map_readings: list[Claim2Reading]


def same_weights(runs: list[Run], rules: Rules) -> SameWeights:
    """Every reading of the module docstring, from the probe runs among `runs`."""
    units = unit_frame(runs, rules)
    every_pair = checkpoint_readings(units, rules)
    own = [r for r in every_pair
           if (r.matrix, r.measure) == (rules.rank_matrix, rules.rank_measure)]
    return SameWeights(units, own, family_readings(units, rules), claim4_readings(units, rules),
                       claim_map(every_pair), every_pair)
