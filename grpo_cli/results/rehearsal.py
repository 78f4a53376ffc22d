"""rehearsal.md / rehearsal.csv: what a rehearsal run measured next to docs/gpu_memory_plan.md.

Written at the end of a run with random weights or coin-flip rewards (`experiment=
paper_rehearsal`): the peak CUDA memory of each phase (timings.csv's `peak_<phase>_mb`, torch
allocations only) and the step time, beside the plan's arithmetic for the paper preset (B = 8,
R = 8, 512 new tokens, micro-batch 2, bf16, vLLM at u = 0.3, one 80 GB GPU). The per-phase plan
figures live here (PLAN_GIB, PLAN_STEP_S), each naming the section of docs/gpu_memory_plan.md that
derives it; that document's section 8 table shows them, and tests/test_rehearsal.py checks the
table against these numbers and each total against its terms. Reads results only (pandas), like
the analysis.
"""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd

GIB_PER_MB = 1 / 1024

# phase -> (GiB of torch allocations the plan expects, where the figure comes from)
PLAN_GIB = {
    "rollout": (56.4, "training state 32.6 (weights, gradients, AdamW 31.2 + probed fp32 masters "
                      "0.9 + grad_sum 0.45; sections 2, 5 A) + vLLM at u = 0.3 23.8 (section 3); "
                      "step 0 has no gradients, AdamW state or masters yet: 31.6"),
    "train": (57.7, "32.6 + 23.8 + one micro-batch of 2: checkpointed blocks 0.4 + one logits "
                    "chunk 0.9 (section 4)"),
    "probes": (62.4, "32.6 + 23.8 + one probe chunk of 2 rollouts, ~6 (section 6)"),
    "optimizer": (56.9, "32.6 + 23.8 + float32 temporaries of one 64 MiB slice (section 2)"),
}
PLAN_STEP_S = "20 to 25 s at R = 8 (section 7: rollout ~10 s, training 5 to 10 s), plus a probe"
TIME_ROWS = {  # row label -> the timings.csv columns it adds up
    "rollout": ("time_rollout",),
    "training (forward, backward, optimizer, update)": (
        "time_forward", "time_backward", "time_optimizer", "time_update"),
    "weights to the sampler": ("time_sync_weights",),
    "probes": ("time_probes",),
    "whole step": ("time_step",),
}
PHASE_LABELS = {
    "rollout": "rollout (vLLM or HF sampling)",
    "train": "training micro-batch (forward + backward)",
    "probes": "probes",
    "optimizer": "optimizer (clip + AdamW step)",
}


def _gib(value) -> float:
    return float(value) * GIB_PER_MB if value is not None and not pd.isna(value) else math.nan


def _fmt(value: float, digits: int = 1) -> str:
    return "n/a" if math.isnan(value) else f"{value:.{digits}f}"


def rehearsal_table(timings: pd.DataFrame) -> pd.DataFrame:
    """One row per phase plus the whole step: measured peaks (GiB; max over steps and step 0)
    and the plan's figure."""
    rows = []
    first = timings[timings["step"] == timings["step"].min()]
    for phase, (plan, terms) in PLAN_GIB.items():
        column = f"peak_{phase}_mb"
        values = timings[column] if column in timings else pd.Series(dtype=float)
        rows.append({
            "phase": PHASE_LABELS[phase],
            "measured_gib_max": _gib(values.max()) if len(values) else math.nan,
            "measured_gib_step0": _gib(first[column].iloc[0]) if column in first and len(first) else math.nan,
            "plan_gib": plan,
            "plan_terms": terms,
        })
    rows.append({
        "phase": "whole step (peak_memory_mb)",
        "measured_gib_max": _gib(timings["peak_memory_mb"].max()),
        "measured_gib_step0": _gib(first["peak_memory_mb"].iloc[0]) if len(first) else math.nan,
        "plan_gib": max(plan for plan, _ in PLAN_GIB.values()),
        "plan_terms": "the largest phase; 79.2 GiB visible on an 80 GB H100, ~2.5 of it for the "
                      "CUDA context and fragmentation (section 5)",
    })
    return pd.DataFrame(rows)


def render(run_dir: Path, info: dict, config: dict) -> str:
    timings = pd.read_csv(run_dir / "timings.csv")
    table = rehearsal_table(timings)
    later = timings[timings["step"] > timings["step"].min()]
    typical = later if len(later) else timings
    cuda = str(info.get("device", "")).startswith("cuda")
    rollout, train, model = config["rollout"], config["train"], config["model"]
    lines = [
        f"# Rehearsal of {config['experiment']['name']}: measured vs docs/gpu_memory_plan.md",
        "",
        "REHEARSAL, NOT SCIENCE: model.weights="
        f"{model.get('weights')}, task.reward={config['task'].get('reward')}. These numbers say "
        "whether the preset fits and how long it takes, nothing about GRPO.",
        "",
        f"Device {info.get('device')}, rollout backend {rollout['backend']}, model {model['name']} "
        f"({model.get('dtype')}), B = {rollout['prompts_per_step']}, R = {rollout['group_size']}, "
        f"max_new_tokens = {rollout['max_new_tokens']}, micro-batch {train['micro_batch_size']}, "
        f"logits_chunk_mb {train.get('logits_chunk_mb')}, {len(timings)} steps.",
        "",
        "Peak memory: torch allocations (`torch.cuda.max_memory_allocated`) within each phase, "
        "which includes everything already allocated when the phase began. "
        + ("" if cuda else "Not measurable per phase on CPU (n/a); the whole-step figure is the "
           "process's peak RSS. "),
        "",
        "| phase | measured GiB (max over steps) | step 0 | plan GiB | plan's terms |",
        "| --- | --- | --- | --- | --- |",
    ]
    for row in table.itertuples():
        lines.append(f"| {row.phase} | {_fmt(row.measured_gib_max)} | {_fmt(row.measured_gib_step0)} "
                     f"| {row.plan_gib:.1f} | {row.plan_terms} |")
    lines += [
        "",
        "| time (s) | median over steps after the first | step 0 | plan |",
        "| --- | --- | --- | --- |",
    ]
    for label, columns in TIME_ROWS.items():
        seconds = timings[[c for c in columns if c in timings]].sum(axis=1)  # [steps]
        typical_seconds = seconds[typical.index]
        lines.append(f"| {label} | {_fmt(typical_seconds.median(), 2)} | "
                     f"{_fmt(float(seconds.iloc[0]), 2)} | "
                     f"{PLAN_STEP_S if label == 'whole step' else ''} |")
    lines += [
        "",
        f"Completion lengths: mean {_fmt(_metric(run_dir, 'completion_len_mean'), 0)} tokens "
        "(a random policy rarely samples a stop token, so completions run to max_new_tokens: "
        "the worst case for memory).",
        "",
    ]
    return "\n".join(lines)


def _metric(run_dir: Path, column: str) -> float:
    try:
        return float(pd.read_csv(run_dir / "metrics.csv")[column].mean())
    except (OSError, KeyError, ValueError):
        return math.nan


def write_rehearsal_report(run_dir: Path, info: dict, config: dict) -> str:
    """Write rehearsal.md and rehearsal.csv into the run directory; return the markdown."""
    run_dir = Path(run_dir)
    text = render(run_dir, info, config)
    (run_dir / "rehearsal.md").write_text(text)
    rehearsal_table(pd.read_csv(run_dir / "timings.csv")).to_csv(run_dir / "rehearsal.csv", index=False)
    return text
