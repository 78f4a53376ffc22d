"""Which config keys differ between runs, and how runs are grouped by them.

The group size R (`rollout.group_size`) is the x-axis of the claim and `seed` is the replicate
axis; every other differing key (typically `algorithm.name`, the estimator) defines a *variant*,
and each variant gets its own curves and its own verdict. Bookkeeping keys (paths, devices,
progress bars) never define a variant. Keys that change with R by design (`follows_r`, e.g.
`rollout.prompts_per_step` = 32 / R for a fixed budget of rollouts per step) belong to the R
axis instead: each must take one value per R, or the grouping is refused naming the key.
"""

from __future__ import annotations

from dataclasses import dataclass, field

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
        "keep_checkpoints",
        "task.path",
        "probes.gram_row_chunk",  # rollouts per Gram pass: memory only, the Gram is exact either way
        "probes.sparsity_every",  # where sparsity is measured, not what training does (absent before it)
    }
)
IGNORED_PREFIXES = ("hydra.",)
DISPLAY_NAMES = {"algorithm.name": "estimator", "model.name": "model", "task.name": "task"}
_ABSENT = "<absent>"


@dataclass(frozen=True)
class Grouping:
    differing: list[str]  # every key that differs, R and seed included ("runs differ in: ...")
    variant_keys: list[str]  # differing keys other than R, seed and those that follow R
    follows_r: dict[str, dict[int, object]] = field(default_factory=dict)  # key -> {R: value}

    def describe(self) -> str:
        if not self.differing:
            return "nothing (identical configs)"
        return ", ".join(self._describe_key(key) for key in self.differing)

    def _describe_key(self, key: str) -> str:
        if key not in self.follows_r:
            return key
        values = ", ".join(f"R={r}: {v}" for r, v in sorted(self.follows_r[key].items()))
        return f"{key} (follows R: {values})"


class GroupingError(ValueError):
    """A key said to follow R takes several values at one R, or is in no run's config."""


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


def values_by_r(runs: list[Run], key: str) -> dict[int, object]:
    """{R: value of `key`} when every run with the same R has the same value, else GroupingError."""
    if not any(key in run.config for run in runs):
        raise GroupingError(f"--follows-r {key}: no run's config has this key")
    by_r: dict[int, dict[str, object]] = {}  # R -> {repr(value): value}
    for run in runs:
        value = run.config.get(key, _ABSENT)
        by_r.setdefault(run.group_size, {})[repr(value)] = value
    for r, found in sorted(by_r.items()):
        if len(found) > 1:
            raise GroupingError(
                f"--follows-r {key}: runs with R={r} have several values "
                f"({', '.join(sorted(found))}); a key that follows R takes one value per R"
            )
    return {r: next(iter(found.values())) for r, found in by_r.items()}


def group_runs(runs: list[Run], basis: list[Run] | None = None,
               follows_r: list[str] | tuple[str, ...] = ()) -> Grouping:
    """Find the keys that differ within `basis` (default: all runs) and label every run with
    its variant (in place). The pipeline passes the analysed runs as basis, so that a failed
    run launched with other settings does not split the runs that are averaged. Keys in
    `follows_r` are part of the R axis (checked: one value per R within `basis`)."""
    basis = basis if basis and len(basis) > 1 else runs
    differing = differing_keys(basis)
    follows = {key: values_by_r(basis, key) for key in follows_r}
    variant_keys = [k for k in differing if k not in (GROUP_SIZE_KEY, SEED_KEY) and k not in follows]
    for run in runs:
        run.variant = variant_label(run, variant_keys)
    return Grouping(differing=differing, variant_keys=variant_keys,
                    follows_r={k: v for k, v in follows.items() if k in differing})
