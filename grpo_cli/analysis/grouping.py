"""Which config keys differ between runs, and how runs are grouped by them.

The group size R (`rollout.group_size`) is the x-axis of the claim and `seed` is the replicate
axis; every other differing key (typically `algorithm.name`, the estimator) defines a *variant*,
and each variant gets its own curves and its own verdict. Bookkeeping keys (paths, devices,
progress bars) never define a variant.
"""

from __future__ import annotations

from dataclasses import dataclass

from grpo_cli.analysis.load import GROUP_SIZE_KEY, SEED_KEY, Run

# keys that can differ without changing the experiment
IGNORED_KEYS = frozenset(
    {
        "results_dir",
        "cache_dir",
        "resume",
        "progress",
        "threads",
        "device",
        "checkpoint_every",
        "task.path",
    }
)
IGNORED_PREFIXES = ("hydra.",)
DISPLAY_NAMES = {"algorithm.name": "estimator", "model.name": "model", "task.name": "task"}
_ABSENT = "<absent>"


@dataclass(frozen=True)
class Grouping:
    differing: list[str]  # every key that differs, R and seed included ("runs differ in: ...")
    variant_keys: list[str]  # differing keys other than R and seed

    def describe(self) -> str:
        return ", ".join(self.differing) if self.differing else "nothing (identical configs)"


def display_name(key: str) -> str:
    return DISPLAY_NAMES.get(key, key)


def _ignored(key: str) -> bool:
    return key in IGNORED_KEYS or key.startswith(IGNORED_PREFIXES)


def _order(key: str) -> tuple[int, str]:
    first = [GROUP_SIZE_KEY, "algorithm.name", SEED_KEY]
    return (first.index(key), key) if key in first else (len(first), key)


def differing_keys(runs: list[Run]) -> list[str]:
    """Config keys whose value is not the same in every run (absent counts as a value)."""
    keys = {key for run in runs for key in run.config}
    differing = [
        key
        for key in keys
        if not _ignored(key) and len({repr(run.config.get(key, _ABSENT)) for run in runs}) > 1
    ]
    # experiment.name is dropped when the other keys already tell the experiments apart
    if "experiment.name" in differing:
        others = [k for k in differing if k not in ("experiment.name", SEED_KEY)]
        combos = {tuple(repr(run.config.get(k)) for k in others) for run in runs}
        with_name = {
            tuple(repr(run.config.get(k)) for k in [*others, "experiment.name"]) for run in runs
        }
        if others and len(combos) == len(with_name):
            differing.remove("experiment.name")
    return sorted(differing, key=_order)


def variant_label(run: Run, variant_keys: list[str]) -> str:
    return ", ".join(f"{display_name(k)}={run.config.get(k, _ABSENT)}" for k in variant_keys)


def group_runs(runs: list[Run], basis: list[Run] | None = None) -> Grouping:
    """Find the keys that differ within `basis` (default: all runs) and label every run with
    its variant (in place). The pipeline passes the analysed runs as basis, so that a failed
    run launched with other settings does not split the runs that are averaged."""
    differing = differing_keys(basis if basis and len(basis) > 1 else runs)
    variant_keys = [k for k in differing if k not in (GROUP_SIZE_KEY, SEED_KEY)]
    for run in runs:
        run.variant = variant_label(run, variant_keys)
    return Grouping(differing=differing, variant_keys=variant_keys)
