"""`grpo analyze --same-weights`: the readings of analysis/same_weights.py, rendered.

Writes, into the output directory: `same_weights.md` (the answer first: claim 2 and claim 4 per
checkpoint and over the trained checkpoints, one sentence each, then the claim map), the CSVs
behind it (`same_weights_claim2.csv`, `same_weights_claim4.csv`, `claim_map.csv`,
`same_weights_units.csv`) and `same_weights.png` (the rank against R per checkpoint with its
interval). Every number is computed in same_weights.py; this module only formats.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from grpo_cli.analysis.parts import Part
from grpo_cli.analysis.render import Bullets, Heading, Paragraph, Table, render_markdown
from grpo_cli.analysis.rules import Rules
from grpo_cli.analysis.same_weights import (
    CHECKPOINTS,
    GROUPS,
    PRETRAINED,
    Claim2Reading,
    Claim4Reading,
    SameWeights,
    claim2_table,
    claim4_table,
)
from grpo_cli.analysis.style import new_figure, r_color, save

UNIT_WORDS = {GROUPS: "units: prompt groups on this checkpoint (answers 'this checkpoint')",
              CHECKPOINTS: "units: independently trained checkpoints (answers 'SmolLM2 under "
                           "GRPO after this many steps', conditional on the one pretrained model)"}


def _part(reading: Claim2Reading, name: str) -> Part | None:
    return next((p for p in reading.parts if p.name == name), None)


def claim2_sentence(reading: Claim2Reading, rules: Rules) -> str:
    """One sentence: the verdict, the per-R ranks, the slope with its interval, the unit."""
    sizes = ", ".join(f"R={r} {per.interval.text(2)} (n={per.interval.n})"
                      for r, per in sorted(reading.per_r.items()))
    slope = (f"; slope {reading.slope.text(2, sign=True)} per doubling over the judged R"
             if reading.slope is not None else "")
    boundary = ""
    growth, level = _part(reading, "2b"), _part(reading, "2c")
    if reading.verdict == "inconclusive":
        straddles = [p.name for p in (growth, level) if p is not None and p.verdict == "inconclusive"]
        boundary = (f"; {' and '.join(straddles)} straddle their boundary (+-{rules.growth_tolerance:g} "
                    f"per doubling, {rules.target:g} +- {rules.band:g}): the truth may sit on it")
    return (f"{reading.subject}, {reading.matrix} / {reading.measure}: claim 2 "
            f"{reading.verdict}; {sizes}{slope}{boundary} ({UNIT_WORDS[reading.unit]}).")


def claim4_sentence(reading: Claim4Reading) -> str:
    ia, ib, diff = reading.intervals
    return (f"{reading.subject}, R={reading.group_size}: {reading.per_token} minus "
            f"{reading.outcome} on the same rollouts {diff.text(2, sign=True)} "
            f"({reading.per_token} {ib.text(2)}, {reading.outcome} {ia.text(2)}, n={reading.n_units}): "
            f"claim 4 {reading.part.verdict} ({UNIT_WORDS[reading.unit]}).")


def _ordered(readings: list) -> list:
    """Pretrained first, then trained checkpoints by step and seed, then readings over them."""
    def key(reading) -> tuple:
        subject = reading.subject
        return (subject != PRETRAINED, reading.unit == CHECKPOINTS, subject)
    return sorted(readings, key=key)


def markdown(result: SameWeights, rules: Rules, source: str) -> str:
    """same_weights.md: claim 2 and claim 4 readings, the unit of each, then the claim map."""
    units = result.units
    header = (f"_`grpo analyze {source} --same-weights`: {units['checkpoint'].nunique()} "
              f"checkpoints, R = {', '.join(map(str, sorted(units['group_size'].unique())))}, "
              f"estimators {', '.join(sorted(units['variant'].unique()))}, probe seeds "
              f"{', '.join(map(str, sorted(units['probe_seed'].unique())))}; "
              f"{rules.confidence:.0%} intervals; claim 2 on {rules.rank_matrix} / "
              f"{rules.rank_measure} (band {rules.target:g} +- {rules.band:g}, growth "
              f"+-{rules.growth_tolerance:g} per doubling), claim 4 margin {rules.margin:g}._")
    blocks = [Heading("Claims 2 and 4 on the same weights", 1), Paragraph(header),
              Heading("Claim 2: rank ~2 whatever R", 2),
              Bullets([claim2_sentence(r, rules) for r in _ordered(result.checkpoints + result.family)])]
    if result.claim4:
        blocks += [Heading("Claim 4: per-token credit on the very same rollouts", 2),
                   Bullets([claim4_sentence(r) for r in _ordered(result.claim4)])]
    if not result.claim_map.empty:
        blocks += [Heading("Claim map: which matrix x measure reads ~2 whatever R", 2),
                   Paragraph("Claim 2's rule (2b and 2c) on every candidate the probes recorded, "
                             "per checkpoint, units prompt groups (whole-batch matrices: "
                             "batches); the paper names neither matrix nor measure."),
                   Table(result.claim_map)]
    return render_markdown(blocks)


def docs_block(result: SameWeights, rules: Rules, source: str) -> str:
    """The generated block for docs (--write-docs): claim 2 and 4 tables in short cells."""
    two = claim2_table(_ordered(result.checkpoints + result.family))
    keep = ["subject", "unit", "verdict"] + [c for c in two if c.startswith("R=") and
                                             not c.endswith(("low", "high", " n"))]
    short = two[keep].copy() if not two.empty else two
    if not two.empty:
        for column in keep[3:]:
            short[column] = [_cell(row, column) for row in two.to_dict("records")]
        short["slope / doubling"] = [_cell(row, "slope") for row in two.to_dict("records")]
        short["unit"] = short["unit"].map({GROUPS: "prompt groups", CHECKPOINTS: "checkpoints"})
    four = claim4_table(_ordered(result.claim4))
    if not four.empty:
        four = pd.DataFrame({
            "subject": four["subject"], "R": four["R"], "pair": four["per-token"] + " - " + four["outcome"],
            "difference": [_cell(row, "difference", sign=True) for row in four.to_dict("records")],
            "n": four["n"], "verdict": four["verdict"]})
    header = Paragraph(f"_Generated by `grpo analyze {source} --same-weights --write-docs`; "
                       f"{rules.confidence:.0%} intervals; sentences and the claim map: "
                       "same_weights.md._")
    blocks = [header, Paragraph("Claim 2:"), Table(short)]
    if not four.empty:
        blocks += [Paragraph("Claim 4 (same rollouts):"), Table(four)]
    return render_markdown(blocks).strip()


def _cell(row: dict, column: str, sign: bool = False) -> str:
    form = "{:+.2f}" if sign or column == "slope" else "{:.2f}"
    value, low, high = row.get(column), row.get(f"{column} low"), row.get(f"{column} high")
    if value is None or not np.isfinite(value):
        return "-"
    if low is None or not (np.isfinite(low) and np.isfinite(high)):
        return form.format(value)
    return f"{form.format(value)} [{form.format(low)}, {form.format(high)}]"


def figure(result: SameWeights, rules: Rules, path: Path) -> Path:
    """The rank against R per checkpoint, interval bars, the band around 2 dashed."""
    readings = _ordered(result.checkpoints + result.family)
    grid = new_figure(1, max(1, len(readings)), width=2.6, height=2.6)
    axes = grid.axes[0]
    for ax, reading in zip(axes, readings, strict=False):
        sizes = sorted(reading.per_r)
        means = [reading.per_r[r].interval.estimate for r in sizes]
        ax.plot(sizes, means, color="0.3", lw=1, marker="o")
        for size in sizes:
            iv = reading.per_r[size].interval
            if iv.finite:
                ax.vlines(size, iv.low, iv.high, colors=r_color(size), lw=3)
        ax.axhspan(rules.target - rules.band, rules.target + rules.band, color="0.85", zorder=0)
        ax.axhline(rules.target, color="0.4", ls="--", lw=0.8)
        ax.set_xscale("log", base=2)
        ax.set_xticks(sizes, [str(s) for s in sizes])
        ax.set_title(f"{reading.subject}\nclaim 2 {reading.verdict}", fontsize=8)
        ax.set_xlabel("R")
    axes[0].set_ylabel(f"{rules.rank_matrix} {rules.rank_measure}")
    return save(grid.finish(f"Claim 2 on the same weights: {rules.rank_matrix} / "
                            f"{rules.rank_measure} against R (grey: {rules.target:g} +- "
                            f"{rules.band:g})"), path)


def write(result: SameWeights, rules: Rules, stage: Path, source: str) -> dict[str, Path]:
    """Every output file into `stage` (the caller renames them into place)."""
    out = {"same_weights.md": stage / "same_weights.md"}
    out["same_weights.md"].write_text(markdown(result, rules, source))
    tables = {"same_weights_claim2.csv": claim2_table(result.map_readings + result.family),
              "same_weights_claim4.csv": claim4_table(result.claim4),
              "claim_map.csv": result.claim_map, "same_weights_units.csv": result.units}
    for name, table in tables.items():
        table.to_csv(stage / name, index=False)
        out[name] = stage / name
    if result.checkpoints:
        out["same_weights.png"] = figure(result, rules, stage / "same_weights.png")
    return out


def analyze_same_weights(paths: list[Path], out: Path | None, rules: Rules,
                         docs: tuple[Path, str] | None = None) -> tuple[Path, SameWeights]:
    """Load the probe runs under `paths`, read them (same_weights.same_weights), write the
    outputs to `out` (default <first>/analysis) through a staged directory, and with `docs`
    (page, tag) rewrite that page's generated block. NoUsableRuns without probe runs."""
    from grpo_cli.analysis.docs_blocks import DocsBlockError, replace_block
    from grpo_cli.analysis.load import load_runs
    from grpo_cli.analysis.pipeline import NoUsableRuns, staged_output
    from grpo_cli.analysis.same_weights import same_weights

    paths = [Path(p) for p in paths]
    runs = load_runs(paths)
    result = same_weights(runs, rules)
    if result.units.empty:
        raise NoUsableRuns("no `grpo probe` run with probe rows under "
                           + ", ".join(map(str, paths)) + " (--same-weights reads probes only)")
    source = " ".join(str(p) for p in paths)
    out_dir = Path(out) if out is not None else paths[0] / "analysis"
    with staged_output(out_dir, below=paths[0]) as stage:
        write(result, rules, stage, source)
    if docs is not None:
        page, tag = docs
        if not Path(page).is_file():
            raise DocsBlockError(f"{page}: no such file")
        try:
            text = replace_block(Path(page).read_text(), tag, docs_block(result, rules, source))
        except DocsBlockError as error:
            raise DocsBlockError(f"{page}: {error}") from None
        Path(page).write_text(text)
    return out_dir, result
