"""Fabricate results directories (docs/results.md) with known numbers, for analysis tests.

`write_run` writes one run directory; `write_sweep` writes R x seed runs side by side. Every rank
measure of a whole-matrix or aggregate row equals `rank(group_size, seed, step)` (layer rows are
offset by LAYER_OFFSETS, which average to 0), so summaries can be checked by hand. Per-group
rollout_group rows get the closed-form prediction plus `composition_offset` (or, with
`group_spread`, values spread evenly about the aggregate row, whose mean they equal), and the
prediction over distinct completions `duplicates_gap` below the prediction; as the probe does, estimators
outside grpo/dr_grpo/rloo get no prediction.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from pathlib import Path

import numpy as np
import pandas as pd
import yaml

from grpo_cli.measures import RANK_MEASURES, composition_spectrum, predicted_rank_measures

MATRICES = ("rollout_group", "rollout_batch", "score_group", "group_batch", "layer", "update")
LAYER_OFFSETS = {"model.layers.0.self_attn.q_proj": -0.1, "lm_head": 0.1}
FILES = (
    "config.yaml",
    "run.json",
    "metrics.csv",
    "eval.csv",
    "ranks.csv",
    "spectra.parquet",
    "events.csv",
)

Number = float | Callable[..., float]


def _value(spec: Number, *args) -> float:
    return float(spec(*args)) if callable(spec) else float(spec)


def default_reward(group_size: int, seed: int, step: int, steps: int) -> float:
    return 0.1 + 0.5 * step / max(steps - 1, 1) + 0.02 * np.log2(group_size)


def default_sparsity(group_size: int, seed: int, step: int) -> float:
    return 0.2 + 0.01 * step


def default_hoyer(group_size: int, seed: int, step: int) -> float:
    return 0.3 + 0.005 * step


def default_accuracy(group_size: int, seed: int, step: int, steps: int) -> float:
    return 0.05 + 0.4 * step / max(steps - 1, 1)


def config_tree(
    group_size: int,
    seed: int,
    estimator: str,
    experiment: str,
    steps: int,
    probe_every: int,
    overrides: dict | None = None,
) -> dict:
    """A resolved config in the shape of grpo_cli.config.schema.Config (subset of keys)."""
    tree = {
        "model": {"name": "char-tiny", "source": "char_llama", "hidden_size": 64, "num_layers": 2},
        "task": {"name": "arith", "seed": 1234, "operators": ["+", "-", "*"], "path": None},
        "rollout": {
            "backend": "hf",
            "group_size": group_size,
            "prompts_per_step": 8,
            "temperature": 1.0,
        },
        "algorithm": {"name": estimator},
        "train": {"steps": steps},
        "optim": {"lr": 1e-3, "betas": [0.9, 0.99]},
        "probes": {"every": probe_every, "rank_rtol": 1e-6, "matrices": list(MATRICES)},
        "alarms": {"entropy_floor": 0.5},
        "experiment": {"name": experiment},
        "seed": seed,
        "device": "cpu",
        "results_dir": f"/tmp/results-{seed}",  # differs per run: must not count as a grouping key
        "cache_dir": ".cache/grpo",
    }
    for dotted, value in (overrides or {}).items():
        node = tree
        *parents, leaf = dotted.split(".")
        for parent in parents:
            node = node.setdefault(parent, {})
        node[leaf] = value
    return tree


def _rank_rows(
    matrices: Iterable[str],
    step: int,
    group_size: int,
    values: dict[str, float],
    groups: int,
    median_offset: float,
    composition_offset: float,
    duplicates_gap: float = 0.0,
    predicted: bool = True,
    group_spread: float | None = None,
) -> list[dict]:
    rows = []
    for matrix in matrices:
        value = values[matrix]
        if matrix in ("rollout_group", "score_group"):
            for b in range(groups):
                minority = b % max(group_size // 2, 1) + 1
                pred = predicted_rank_measures(minority, group_size - minority)
                row = {
                    "step": step,
                    "matrix": matrix,
                    "layer": "",
                    "group": f"g{b}",
                    "n_rows": group_size,
                    "minority": minority,
                    "majority": group_size - minority,
                    "distinct": 2,
                    "mean_abs_cosine": 0.5,
                }
                if group_spread is None:
                    row |= {m: pred[m] + composition_offset for m in RANK_MEASURES}
                else:  # symmetric about the aggregate: the groups' mean is the `mean` row
                    row |= dict.fromkeys(RANK_MEASURES, value + group_spread * (b - (groups - 1) / 2))
                if predicted:
                    row |= {f"pred_{m}": pred[m] for m in RANK_MEASURES}
                    row |= {f"pred_distinct_{m}": pred[m] - duplicates_gap for m in RANK_MEASURES}
                rows.append(row)
            for stat, offset in (("mean", 0.0), ("median", median_offset)):
                rows.append(
                    {
                        "step": step,
                        "matrix": matrix,
                        "layer": "",
                        "group": stat,
                        "n_zero_groups": 1,
                        **dict.fromkeys(RANK_MEASURES, value + offset),
                    }
                )
        elif matrix in ("layer", "update"):
            for layer, offset in LAYER_OFFSETS.items():
                rows.append(
                    {
                        "step": step,
                        "matrix": matrix,
                        "layer": layer,
                        "group": "all",
                        "sparsity": 0.1,
                        "hoyer": 0.3,
                        "powerlaw_alpha": 1.5,
                        "powerlaw_r2": 0.9,
                        **dict.fromkeys(RANK_MEASURES, value + offset),
                    }
                )
        else:
            rows.append(
                {
                    "step": step,
                    "matrix": matrix,
                    "layer": "",
                    "group": "all",
                    "n_rows": 8 * group_size,
                    **dict.fromkeys(RANK_MEASURES, value),
                }
            )
    return rows


def _spectra_rows(matrices: Iterable[str], step: int, group_size: int, groups: int) -> list[dict]:
    rows = []
    for matrix in matrices:
        if matrix in ("rollout_group", "score_group"):
            for b in range(groups):
                minority = b % max(group_size // 2, 1) + 1
                sigma = composition_spectrum(minority, group_size - minority)
                rows += [
                    {"matrix": matrix, "layer": "", "group": f"g{b}", "k": k, "sigma": s}
                    for k, s in enumerate(sorted(sigma, reverse=True))
                ]
        elif matrix in ("layer", "update"):
            for i, layer in enumerate(LAYER_OFFSETS):
                decay = 0.5 + 0.1 * i + 0.02 * step
                rows += [
                    {"matrix": matrix, "layer": layer, "group": "all", "k": k, "sigma": decay**k}
                    for k in range(12 + 4 * i)
                ]
        else:
            n = min(8 * group_size, 24)
            rows += [
                {
                    "matrix": matrix,
                    "layer": "",
                    "group": "all",
                    "k": k,
                    "sigma": 1.0 / (1 + k) ** (1 + 0.1 * np.log2(group_size)),
                }
                for k in range(n)
            ]
    return [row | {"step": step} for row in rows]


def write_run(
    root: Path,
    *,
    group_size: int,
    seed: int,
    estimator: str = "grpo",
    experiment: str = "toy",
    status: str = "completed",
    steps: int = 20,
    steps_done: int | None = None,
    probe_every: int = 5,
    rank: Number = 2.0,
    matrix_ranks: dict[str, Number] | None = None,
    matrices: Iterable[str] = MATRICES,
    reward: Callable[..., float] = default_reward,
    accuracy: Callable[..., float] = default_accuracy,
    sparsity: Callable[..., float] = default_sparsity,
    hoyer: Callable[..., float] = default_hoyer,
    credit_uniform: Number = 1.0,
    groups: int = 3,
    median_offset: float = 0.0,
    composition_offset: float = 0.0,
    duplicates_gap: float = 0.0,
    group_spread: float | None = None,
    alarms: Iterable[tuple[int, str, float, str]] = (),
    error: str | None = None,
    skip: Iterable[str] = (),
    name: str | None = None,
    config_overrides: dict | None = None,
) -> Path:
    """Write one run directory; `rank(group_size, seed, step)` sets every rank measure.

    `sparsity`, `hoyer` (probe steps) and `credit_uniform` take (group_size, seed, step) too.

        `matrix_ranks` overrides `rank` for some matrices; only `matrices` are written (fewer
        matrices, fewer figure panels: faster tests); files named in `skip` are not written.
    """
    run = Path(root) / (name or f"R{group_size}-{estimator}-s{seed}")
    run.mkdir(parents=True, exist_ok=True)
    done = steps if steps_done is None else steps_done
    matrices = tuple(matrices)
    skip = set(skip)
    files: dict[str, Callable[[Path], None]] = {}

    tree = config_tree(
        group_size, seed, estimator, experiment, steps, probe_every, config_overrides
    )
    files["config.yaml"] = lambda p: p.write_text(yaml.safe_dump(tree, sort_keys=False))
    info = {
        "status": status,
        "error": error,
        "started_at": "2026-01-01T00:00:00Z",
        "ended_at": None if status == "running" else "2026-01-01T01:00:00Z",
        "last_step": done - 1,
        "stopped_by": None,
        "versions": {"python": "3.11", "torch": "2.4", "transformers": "4.56", "grpo_cli": "0.1.0"},
        "device": "cpu",
        "seed": seed,
        "group_size": group_size,
        "estimator": estimator,
        "model": "char-tiny",
        "task": "arith",
        "gram_params": ".*",
    }
    files["run.json"] = lambda p: p.write_text(json.dumps(info, indent=1))

    step_range = range(done)
    probes = [s for s in step_range if s % probe_every == 0]
    metrics = pd.DataFrame({"step": list(step_range)})
    metrics["reward_mean"] = [reward(group_size, seed, s, steps) for s in step_range]
    metrics["reward_std"] = 0.3
    metrics["accuracy_train"] = metrics["reward_mean"]
    p = metrics["reward_mean"].clip(0, 1)
    metrics["expected_zero_variance_frac_batch"] = p**group_size + (1 - p) ** group_size
    metrics["expected_zero_variance_frac"] = metrics["expected_zero_variance_frac_batch"] + 0.02
    metrics["zero_variance_frac"] = metrics["expected_zero_variance_frac"] + 0.05
    metrics["loss"], metrics["pg_loss"] = 0.1, 0.1
    metrics["kl"] = [0.001 * s for s in step_range]
    metrics["entropy"] = [2.0 - 0.05 * s for s in step_range]
    metrics["grad_sparsity"] = [
        sparsity(group_size, seed, s) if s in probes else np.nan for s in step_range
    ]
    metrics["grad_hoyer"] = [
        hoyer(group_size, seed, s) if s in probes else np.nan for s in step_range
    ]
    metrics["credit_uniform_frac"] = [
        _value(credit_uniform, group_size, seed, s) for s in step_range
    ]
    metrics["grad_norm"] = 1.0
    files["metrics.csv"] = lambda p: metrics.to_csv(p, index=False)

    eval_steps = sorted({*range(0, done, 5), done - 1}) if done else []
    evals = pd.DataFrame(
        {
            "step": eval_steps,
            "accuracy": [accuracy(group_size, seed, s, steps) for s in eval_steps],
            "n": 128,
            "greedy": True,
        }
    )
    files["eval.csv"] = lambda p: evals.to_csv(p, index=False)

    specs = {m: (matrix_ranks or {}).get(m, rank) for m in matrices}
    ranks = pd.DataFrame(
        [
            row
            for s in probes
            for row in _rank_rows(
                matrices,
                s,
                group_size,
                {m: _value(spec, group_size, seed, s) for m, spec in specs.items()},
                groups,
                median_offset,
                composition_offset,
                duplicates_gap,
                estimator in ("grpo", "dr_grpo", "rloo"),
                group_spread,
            )
        ]
    )
    files["ranks.csv"] = lambda p: ranks.to_csv(p, index=False)
    spectra = pd.DataFrame(
        [row for s in probes for row in _spectra_rows(matrices, s, group_size, groups)]
    )
    files["spectra.parquet"] = lambda p: spectra.to_parquet(p, index=False)
    events = pd.DataFrame(list(alarms), columns=["step", "alarm", "value", "message"])
    files["events.csv"] = lambda p: events.to_csv(p, index=False)

    for filename, write in files.items():
        if filename not in skip:
            write(run / filename)
    return run


def write_sweep(
    root: Path,
    group_sizes: Iterable[int] = (2, 4, 8),
    seeds: Iterable[int] = (0, 1),
    estimators: Iterable[str] = ("grpo",),
    **kwargs,
) -> Path:
    """R x seed (x estimator) completed runs under `root`; kwargs go to every `write_run`."""
    root = Path(root)
    for estimator in estimators:
        for group_size in group_sizes:
            for seed in seeds:
                write_run(root, group_size=group_size, seed=seed, estimator=estimator, **kwargs)
    return root


def probe_rank(group_size: int, seed: int, step: int) -> float:
    """`write_probe_sweep`'s default: checkpoint 0 flat at 2; checkpoint 10 +0.5 per doubling of
    R from R = 4."""
    return 2.0 + (0.5 * (group_size.bit_length() - 3) if step == 10 else 0.0) + 0.02 * seed


def write_probe_sweep(
    root: Path,
    group_sizes: Iterable[int] = (2, 4, 8, 16),
    seeds: Iterable[int] = (0, 1),
    rank: Number = probe_rank,
) -> Path:
    """A `grpo probe` directory: every R x seed measured on checkpoints 0 and 10 of one source
    run (run.json kind `probe`), rollout_group only."""
    root = Path(root)
    for size in group_sizes:
        for seed in seeds:
            run = write_run(root, group_size=size, seed=seed, steps=11, probe_every=10, rank=rank,
                            matrices=("rollout_group",), name=f"R{size}-s{seed}")
            record = json.loads((run / "run.json").read_text())
            record |= {"trainer": "grpo-probe", "kind": "probe",
                       "probe": {"source": "runs/R4-grpo-s0", "source_kind": "run",
                                 "checkpoints": {"0": "step_000000.pt", "10": "step_000010.pt"}}}
            (run / "run.json").write_text(json.dumps(record))
    return root
