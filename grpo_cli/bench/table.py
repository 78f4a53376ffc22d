"""What `grpo bench` prints and writes: phase tables, machine load, CSV rows (no timing here)."""

from __future__ import annotations

import os
import platform
import statistics

import torch


def median(rows: list[dict], key: str) -> float:
    values = [row[key] for row in rows if key in row]
    return statistics.median(values) if values else float("nan")


def load_average() -> str:
    try:
        return " ".join(f"{value:.2f}" for value in os.getloadavg())
    except OSError:  # pragma: no cover
        return "n/a"


def describe(setup) -> str:
    cfg = setup.cfg
    params = sum(p.numel() for p in setup.model.parameters())
    return (
        f"model {cfg.model.name} ({params / 1e6:.2f}M params), backend {cfg.rollout.backend}, "
        f"B={cfg.rollout.prompts_per_step} x R={cfg.rollout.group_size}, "
        f"max_new_tokens={cfg.rollout.max_new_tokens}, micro_batch={cfg.train.micro_batch_size}, "
        f"device {setup.device}, threads {torch.get_num_threads()}, torch {torch.__version__}, "
        f"{platform.processor() or platform.machine()}"
    )


def print_phase_table(console, rows: list[dict], title: str, phases: tuple[str, ...]) -> None:
    """Median seconds and share of the step per phase; phases that never ran are left out."""
    from rich.table import Table

    table = Table(title=title)
    table.add_column("phase")
    table.add_column("median s", justify="right")
    table.add_column("share", justify="right")
    total = median(rows, "step_s")
    for phase in phases:
        if not any(row.get(phase) for row in rows):
            continue
        value = median(rows, phase)
        table.add_row(phase, f"{value:.4f}", f"{value / total:.0%}" if total else "")
    table.add_row("step", f"{total:.4f}", "100%", style="bold")
    table.add_row("step CPU time", f"{median(rows, 'cpu_s'):.4f}", "")
    table.add_row("tokens/s", f"{median(rows, 'tokens_per_s'):.0f}", "")
    table.add_row("completion tokens/step", f"{median(rows, 'tokens'):.0f}", "")
    table.add_row("peak memory MB", f"{max(row['peak_mb'] for row in rows):.0f}", "")
    console.print(table)


def write_rows(path: str, rows: list[dict], meta: dict) -> None:
    import pandas as pd

    frame = pd.DataFrame(rows)
    for key, value in meta.items():
        frame[key] = value
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    header = not os.path.exists(path)
    frame.to_csv(path, mode="a", header=header, index=False)
