"""Figures from what each step leaves behind: pytest's summary line, run directories
(timings.csv, eval.csv, rehearsal.csv), `grpo bench --out` and `bench_rollout.py --out` CSVs.

Each reader takes the step's name and its files and returns `Figure`s; a missing file gives no
figure (the step's status already says it failed). Reads files only: pandas, no torch.
"""

from __future__ import annotations

import math
import re
from pathlib import Path

import pandas as pd

from grpo_cli.gpu_report.report import Figure

PYTEST_COUNTS = re.compile(r"(\d+) (passed|failed|skipped|errors?|deselected)")


def pytest_figures(step: str, log_text: str) -> list[Figure]:
    """passed / failed / skipped / errors from the last summary line pytest printed."""
    summaries = [line for line in log_text.splitlines()
                 if PYTEST_COUNTS.search(line) and (" in " in line or line.startswith("="))]
    if not summaries:
        return []
    counts = {"passed": 0, "failed": 0, "skipped": 0, "error": 0}
    for number, kind in PYTEST_COUNTS.findall(summaries[-1]):
        kind = "error" if kind.startswith("error") else kind
        if kind in counts:
            counts[kind] += int(number)
    counts["failed"] += counts.pop("error")
    return [Figure(f"{step}.{kind}", f"tests {kind} (errors count as failed)" if kind == "failed"
                   else f"tests {kind}", float(count)) for kind, count in counts.items()]


def run_directories(root: Path) -> list[Path]:
    """Every run directory under `root` (those holding a timings.csv), sorted."""
    return sorted(path.parent for path in root.glob("**/timings.csv"))


def run_label(run_dir: Path) -> str:
    """'R4' from a run directory named R4-grpo-s0..., else the directory's name."""
    match = re.match(r"R(\d+)-", run_dir.name)
    return f"R{match.group(1)}" if match else run_dir.name


def probe_steps(run_dir: Path) -> set[int]:
    """Steps that wrote ranks.csv rows. Plain steps record a tiny time_probes too (the grad_sum
    observer), so time_probes > 0 does not tell them apart."""
    ranks = run_dir / "ranks.csv"
    return set(pd.read_csv(ranks, usecols=["step"])["step"]) if ranks.exists() else set()


def probe_step_costs(timings: pd.DataFrame, is_probe: pd.Series) -> tuple[list[float], list[float]]:
    """(whole-step cost, probes-phase cost) of each probe step of a run (`timings`: its
    timings.csv; `is_probe`: which rows are probe steps, `probe_steps`), as fractions of its median
    probe-free step; empty lists without both kinds of step (or without the phase columns).

    A probe step's whole-step cost is its time outside the rollout and the held-out evaluation
    beyond the run's median probe-free, evaluation-free step after step 0 (the same parts), over
    that step's whole time (issue 23's measure). The probes phase alone understates fused probe
    steps (`train.backward_live_rows`, `probes.fused_gram=always`): their rows' own prompt
    forwards and the probe hooks run inside the training forward and backward."""
    if not {"time_step", "time_rollout", "time_eval", "time_probes"} <= set(timings):
        return [], []
    outside = timings["time_step"] - timings["time_rollout"] - timings["time_eval"]
    plain = ~is_probe & (timings["time_eval"] <= 0) & (timings["step"] > timings["step"].min())
    if not plain.any() or not is_probe.any():
        return [], []
    base_step = float(timings.loc[plain, "time_step"].median())
    base_outside = float(outside[plain].median())
    whole = ((outside[is_probe] - base_outside) / base_step).tolist()
    phase = (timings.loc[is_probe, "time_probes"] / base_step).tolist()
    return whole, phase


def run_figures(step: str, root: Path, expected_steps: int | None = None) -> list[Figure]:
    """Per run: median plain step time after step 0, median probes time on probe steps, the
    median probe step's whole-step cost (`probe_step_costs`), peak memory, steps done, last
    held-out accuracy."""
    figures = []
    for run_dir in run_directories(root):
        label = run_label(run_dir)
        timings = pd.read_csv(run_dir / "timings.csv")
        is_probe = timings["step"].isin(probe_steps(run_dir))
        plain = timings[~is_probe & (timings["step"] > timings["step"].min())]
        prefix = f"{step}.{label}"
        if len(plain):
            figures.append(Figure(f"{prefix}.step_s", f"{label}: median step time, plain steps after step 0",
                                  float(plain["time_step"].median()), "s", f"{len(plain)} steps"))
        if is_probe.any() and "time_probes" in timings:
            probed = timings[is_probe]
            figures.append(Figure(f"{prefix}.probes_s", f"{label}: median probes time, probe steps",
                                  float(probed["time_probes"].median()), "s", f"{len(probed)} probe steps"))
        whole, _ = probe_step_costs(timings, is_probe)
        if whole:
            figures.append(Figure(f"{prefix}.probe_cost", f"{label}: median probe step's cost beyond "
                                  "the probe-free step, outside rollout and eval",
                                  100 * float(pd.Series(whole).median()), "%",
                                  f"worst {100 * max(whole):.0f}% of {len(whole)}"))
        if "peak_memory_mb" in timings:
            figures.append(Figure(f"{prefix}.peak_mb", f"{label}: peak memory (peak_memory_mb)",
                                  float(timings["peak_memory_mb"].max()), "MB"))
        figures.append(Figure(f"{prefix}.steps", f"{label}: steps done", float(len(timings)), "",
                              f"of {expected_steps}" if expected_steps else ""))
        eval_path = run_dir / "eval.csv"
        if eval_path.exists():
            evals = pd.read_csv(eval_path)
            if len(evals) and "accuracy" in evals:
                figures.append(Figure(f"{prefix}.accuracy", f"{label}: held-out accuracy, last eval",
                                      float(evals["accuracy"].iloc[-1]), "",
                                      f"step {int(evals['step'].iloc[-1])}" if "step" in evals else ""))
    return figures


def bench_figures(step: str, csv_path: Path) -> list[Figure]:
    """Median step time of each side, grpo-cli's tokens/s and the median per-pair ratio."""
    if not csv_path.exists():
        return []
    frame = pd.read_csv(csv_path)
    grpo, trl = frame[frame["side"] == "grpo-cli"], frame[frame["side"] == "trl"]
    figures = [
        Figure(f"{step}.grpo_step_s", "grpo-cli median step time", float(grpo["step_s"].median()), "s"),
        Figure(f"{step}.grpo_tokens_per_s", "grpo-cli completion tokens/s",
               float(grpo["tokens_per_s"].median()), "tok/s"),
    ]
    if len(trl):
        figures.append(Figure(f"{step}.trl_step_s", "TRL median step time",
                              float(trl["step_s"].median()), "s"))
        figures.append(Figure(f"{step}.ratio", "step time ratio grpo-cli / TRL (median of pairs)",
                              float(grpo["ratio"].median()), "", f"{len(grpo)} pairs"))
    return figures


def rollout_figures(step: str, csv_path: Path) -> list[Figure]:
    """Tokens/s and seconds a rollout per backend; the training pass in milliseconds."""
    if not csv_path.exists():
        return []
    figures = []
    for row in pd.read_csv(csv_path).to_dict("records"):
        shape = f"{row['prompts']}x{row['group_size']} rows, {row['max_new_tokens']} new tokens, {row['dtype']}"
        if row["backend"] == "train_pass":
            figures.append(Figure(f"{step}.train_pass.ms", "training pass (forward, backward, "
                                  "clip, AdamW), median", 1000 * float(row["seconds_per_repeat"]),
                                  "ms", f"{row['model']}, {shape}"))
        else:
            figures.append(Figure(f"{step}.{row['backend']}.tokens_per_s", f"{row['backend']} rollout",
                                  float(row["tokens_per_s"]), "tok/s", f"{row['model']}, {shape}"))
            figures.append(Figure(f"{step}.{row['backend']}.rollout_s", f"{row['backend']} rollout, "
                                  "seconds a rollout", float(row["seconds_per_repeat"]), "s",
                                  f"{row['model']}, {shape}"))
    return figures


def layer_spectra_figures(step: str, csv_path: Path) -> list[Figure]:
    """Seconds of a probe step's layer spectra per route (scripts/bench_layer_spectra.py's total
    rows); a route the time limit cut has none."""
    if not csv_path.exists():
        return []
    return [Figure(f"{step}.{row['method']}.probe_step_s", f"{row['method']}: a probe step's layer "
                   f"spectra ({int(row['count'])} float64 decompositions)", float(row["seconds"]), "s",
                   f"{row['shapes']}, {row['device']}")
            for row in pd.read_csv(csv_path).to_dict("records") if int(row["rows"]) == 0]


def rehearsal_figures(step: str, root: Path) -> list[Figure]:
    """Peak GiB per phase beside the plan (docs/gpu_memory_plan.md section 8) and step time."""
    figures = []
    for run_dir in run_directories(root):
        table = run_dir / "rehearsal.csv"
        if table.exists():
            for row in pd.read_csv(table).to_dict("records"):
                name = re.sub(r"[^a-z0-9]+", "_", row["phase"].split(" (")[0].lower()).strip("_")
                value = row["measured_gib_max"]
                figures.append(Figure(f"{step}.{name}.peak_gib", f"peak GiB: {row['phase']}",
                                      float(value) if not pd.isna(value) else math.nan, "GiB",
                                      f"plan {row['plan_gib']} GiB"))
        timings = pd.read_csv(run_dir / "timings.csv")
        later = timings[timings["step"] > timings["step"].min()]
        later = later if len(later) else timings
        figures.append(Figure(f"{step}.step_s", "median step time after step 0",
                              float(later["time_step"].median()), "s",
                              "plan: 20 to 25 s at R = 8 with vLLM, plus a probe"))
        for phase in ("rollout", "probes"):  # issue 45's phase targets; probes: probe steps only
            column = later[f"time_{phase}"] if f"time_{phase}" in later else pd.Series(dtype=float)
            column = column[column > 0] if phase == "probes" else column
            figures.append(Figure(f"{step}.{phase}_s", f"median {phase} phase after step 0"
                                  + (" (probe steps)" if phase == "probes" else ""),
                                  float(column.median()) if len(column) else math.nan, "s"))
    return figures
