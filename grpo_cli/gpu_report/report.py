"""gpu_report.md and gpu_report.csv: every figure beside its target and its previous value.

Reads the steps' JSON records (one per step, written by the runner) and formats them; no torch.
The targets are issue 16's and, where it sets them, issue 45's (docs/speed.md). A figure's
previous value is its newest value among the reports committed under docs/
(docs/gpu_report_<date>_<gpu>.csv, named beside it), else the first H100 visit's below.
"""

from __future__ import annotations

import csv
import math
from dataclasses import asdict, dataclass
from pathlib import Path

# figure key -> (comparison, target value): issue 16's targets on an H100
TARGETS: dict[str, tuple[str, float]] = {
    "tests_fast.failed": ("<=", 0),
    "tests_gpu.failed": ("<=", 0),
    "bench_25m.ratio": ("<=", 0.30),  # issue 45's list (its text once said 0.25)
    "bench_smollm2.ratio": ("<=", 0.25),
    "rollout.hf_generate.tokens_per_s": (">=", 50_000),
    "rollout.hf_static.tokens_per_s": (">=", 50_000),
    "rollout.hf_static_graphs.tokens_per_s": (">=", 50_000),
    "rollout.train_pass.ms": ("<=", 100),
    # issue 45: the rehearsal's step (R = 8) <= 20 s, its rollout <= 5 s, its probes <= 10 s
    "rollout_nemotron.hf_static.rollout_s": ("<=", 5),
    "rollout_nemotron.hf_static_graphs.rollout_s": ("<=", 5),
    "rehearsal.step_s": ("<=", 20),
    "rehearsal.rollout_s": ("<=", 5),
    "rehearsal.probes_s": ("<=", 10),
}

# The first GPU visit (one H100 80GB, 2026-11-22, code at 5212bb0, ../shared/FINDINGS.md and
# issue 16), used until a report is committed under docs/.
FIRST_VISIT = "H100 2026-11-22, 5212bb0"
FIRST_VISIT_VALUES: dict[str, tuple[float, str]] = {
    "bench_25m.ratio": (0.853, ""),
    "bench_25m.grpo_step_s": (0.358, ""),
    "bench_25m.trl_step_s": (0.441, ""),
    "rollout.hf_generate.tokens_per_s": (1721.0, ""),
    "rank_collapse_bf16.R4.step_s": (0.186, "rollout.backend=hf"),
}


@dataclass
class Figure:
    """One measured number of one step."""

    key: str  # "<step>.<name>", the key of TARGETS and of the previous report
    label: str  # what it is, in words
    value: float
    unit: str = ""
    note: str = ""


def target_text(key: str) -> str:
    if key not in TARGETS:
        return ""
    comparison, value = TARGETS[key]
    return f"{comparison} {value:,g}"


def meets(key: str, value: float) -> str:
    """'yes' / 'no' against the key's target, '' without a target or a value."""
    if key not in TARGETS or value is None or math.isnan(value):
        return ""
    comparison, target = TARGETS[key]
    ok = value <= target if comparison == "<=" else value >= target
    return "yes" if ok else "no"


def format_value(value: float) -> str:
    if value is None or math.isnan(value):
        return "n/a"
    if value == int(value) and abs(value) < 1e15:
        return f"{int(value):,}"
    if abs(value) >= 100:
        return f"{value:,.0f}"
    return f"{value:.3g}"


def previous_values(docs_dir: Path) -> dict[str, tuple[float, str]]:
    """{key: (value, where it was measured)}: each figure's newest value among the committed
    docs/gpu_report_*.csv (in name order, a later report's value replaces an earlier one's; a
    visit that skipped a step leaves the value of the one before), else the first visit's."""
    values = {key: (value, FIRST_VISIT + (f", {note}" if note else ""))
              for key, (value, note) in FIRST_VISIT_VALUES.items()}
    for report in sorted(docs_dir.glob("gpu_report_*.csv")):
        with open(report, newline="") as handle:
            for row in csv.DictReader(handle):
                try:
                    values[row["key"]] = (float(row["value"]), report.name)
                except (KeyError, ValueError):  # environment rows hold text
                    continue
    return values


def figure_rows(records: list[dict], previous: dict[str, tuple[float, str]]) -> list[dict]:
    """One row per figure of every step record, with its target and previous value."""
    rows = []
    for record in records:
        for figure in record.get("figures", []):
            old, where = previous.get(figure["key"], (math.nan, ""))
            rows.append({
                "step": record["name"],
                "key": figure["key"],
                "figure": figure["label"],
                "value": figure["value"],
                "unit": figure["unit"],
                "target": target_text(figure["key"]),
                "meets_target": meets(figure["key"], figure["value"]),
                "previous": old,
                "previous_source": where if not math.isnan(old) else "",
                "note": figure.get("note", ""),
            })
    return rows


def render_markdown(environment: dict[str, str], records: list[dict], rows: list[dict]) -> str:
    lines = ["# GPU report", ""]
    lines += [f"- {name}: {value}" for name, value in environment.items()]
    lines += ["", "## Steps", "", "| step | issue step | status | seconds | command |",
              "| --- | --- | --- | --- | --- |"]
    for record in records:
        status = record["status"] + (f": {record['detail']}" if record.get("detail") else "")
        lines.append(f"| {record['name']} | {record['group']} | {status} | "
                     f"{record.get('seconds', 0):.0f} | `{record['command']}` |")
    lines += ["", "## Figures", "",
              "| step | figure | value | unit | target | meets | previous | note |",
              "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for row in rows:
        previous = ""
        if row["previous_source"]:
            previous = f"{format_value(row['previous'])} ({row['previous_source']})"
        lines.append(f"| {row['step']} | {row['figure']} | {format_value(row['value'])} | {row['unit']} | "
                     f"{row['target']} | {row['meets_target']} | {previous} | {row['note']} |")
    return "\n".join(lines) + "\n"


def write_report(out_dir: Path, environment: dict[str, str], records: list[dict],
                 docs_dir: Path) -> Path:
    """gpu_report.md and gpu_report.csv in `out_dir` (environment rows first in the CSV)."""
    rows = figure_rows(records, previous_values(docs_dir))
    (out_dir / "gpu_report.md").write_text(render_markdown(environment, records, rows))
    fields = list(rows[0]) if rows else list(figure_rows(
        [{"name": "", "figures": [asdict(Figure("", "", math.nan))]}], {})[0])
    with open(out_dir / "gpu_report.csv", "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=fields)
        writer.writeheader()
        for name, value in environment.items():
            writer.writerow({"step": "environment", "key": f"environment.{name}", "figure": name,
                             "value": value})
        writer.writerows(rows)
    return out_dir / "gpu_report.md"
