"""`grpo probe`: a training step's probes at fixed weights, for several group sizes R.

Issue 30: comparing R across separate training runs confounds R with each run's trajectory.
Here every R is measured on the same weights (a run's checkpoint, each checkpoint it kept, or
any HF model directory) and the same prompts: the prompts of step N depend on the seed and N
only, never on R. The probe is the training step itself, `TrainingLoop.run_step(update=False)`:
rollouts, rewards, advantages, the loss's forward and backward and every probe matrix, stopped
before the optimizer step, so its rows are those a training run records at that step, weights
and seed (tests/test_probe_checkpoint.py checks this to 1e-6).

Each R gets a results directory `<out>/R<R>` with the files `grpo run` writes (docs/results.md),
marked `"kind": "probe"` in run.json, one row per probed checkpoint at the step it continues
from (0 for a model directory); `grpo analyze <out>` judges them like a sweep. The `update` and
`grad_sum` matrices accumulate over training and are not probed.
"""

from __future__ import annotations

import gc
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from grpo_cli.config.errors import ConfigError, unknown_key_hint

ACCUMULATED = ("update", "grad_sum")  # matrices that sum over training: not probed


class ProbeTargetError(ValueError):
    """The path to probe is missing, or is neither a run, a checkpoint nor a model directory."""


@dataclass
class ProbeTarget:
    name: str  # label for the default output directory
    kind: str  # run | checkpoint | model
    cfg: DictConfig  # the run's config (run, checkpoint) or the composed one (model)
    checkpoints: list[tuple[int, Path | None]]  # (step, weights file); None: the model's own weights
    seed: int | None = None  # the probed run's training seed (None: a model directory)


def _run_config(run_dir: Path, overrides: list[str]) -> DictConfig:
    """A run's saved config.yaml under the schema, with `key=value` overrides."""
    from grpo_cli.config.schema import Config

    try:
        cfg = OmegaConf.merge(OmegaConf.structured(Config), OmegaConf.load(run_dir / "config.yaml"))
    except Exception as error:  # OmegaConf names the bad key or value
        raise ConfigError(f"{run_dir / 'config.yaml'}: {str(error).splitlines()[0]}") from None
    bad = [item for item in overrides if "=" not in item or "/" in item.split("=", 1)[0]]
    if bad:
        raise ConfigError(f"{bad[0]!r}: overrides on a run directory are key=value of its config")
    try:
        return OmegaConf.merge(cfg, OmegaConf.from_dotlist(list(overrides)))
    except Exception as error:  # the override's key or value, not the file
        hint = unknown_key_hint(error)
        raise ConfigError(f"{' '.join(overrides)}: {str(error).splitlines()[0]}"
                          + (f": {hint}" if hint else "")) from None


def _trained_seed(run_dir: Path) -> int | None:
    """The seed the run trained with (its saved config.yaml, before any probe override)."""
    seed = OmegaConf.load(run_dir / "config.yaml").get("seed")
    return None if seed is None else int(seed)


def _step_of(path: Path) -> int:
    """The step a checkpoint continues from; read as tensors and plain data only, so a file that
    needs more is refused unread (UnsafeCheckpointError, grpo_cli/train/checkpoint.py)."""
    from grpo_cli.train.checkpoint import CheckpointError, UnsafeCheckpointError, read_checkpoint

    try:
        return int(read_checkpoint(path)["next_step"])
    except UnsafeCheckpointError:
        raise
    except Exception as error:  # torch raises many types for a damaged file: input, exit 1
        detail = str(error).splitlines()[0] if str(error) else ""
        raise CheckpointError(f"{path}: not a readable grpo checkpoint ({type(error).__name__}: "
                              f"{detail[:200]})") from None


def resolve_target(path: Path, overrides: list[str], all_checkpoints: bool = False) -> ProbeTarget:
    """What `path` is: a checkpoint file, a run directory or an HF model directory."""
    path = Path(path)
    if not path.exists():
        raise ProbeTargetError(f"{path}: no such file or directory")
    if path.is_file():  # <run>/checkpoints/<name>.pt
        run_dir = path.parent.parent
        if not (run_dir / "config.yaml").is_file():
            raise ProbeTargetError(f"{path}: a checkpoint file must sit in <run>/checkpoints/ "
                                   f"beside the run's config.yaml ({run_dir / 'config.yaml'} missing)")
        cfg = _run_config(run_dir, overrides)
        return ProbeTarget(f"{run_dir.name}-{path.stem}", "checkpoint", cfg,
                           [(_step_of(path), path)], _trained_seed(run_dir))
    if (path / "config.yaml").is_file() and (path / "checkpoints").is_dir():
        folder = path / "checkpoints"
        if all_checkpoints:
            files = sorted(folder.glob("step_*.pt")) + [folder / "latest.pt"]
        else:
            files = [folder / "latest.pt"]
        by_step = {_step_of(file): file for file in files if file.is_file()}
        if not by_step:
            raise ProbeTargetError(f"{path}: the run saved no checkpoint ({folder} has no latest.pt)")
        return ProbeTarget(path.name, "run", _run_config(path, overrides), sorted(by_step.items()),
                           _trained_seed(path))
    if (path / "config.json").is_file():
        from grpo_cli.config.compose import compose_config

        if all_checkpoints:
            raise ProbeTargetError(f"{path}: --all-checkpoints needs a run directory, not a model")
        model = path.resolve()
        try:
            cfg = compose_config(["model=hf", f"model.path={model}", f"model.name={model.name}",
                                  *overrides])
        except Exception as error:  # Hydra names the bad override
            raise ConfigError(str(error).splitlines()[0]) from None
        return ProbeTarget(model.name, "model", cfg, [(0, None)])
    raise ProbeTargetError(
        f"{path}: not a run directory (config.yaml and checkpoints/), a checkpoint file or an "
        "HF model directory (config.json)"
    )


def probe_config(cfg: DictConfig, group_size: int, prompts: int | None, seed: int | None) -> DictConfig:
    """The run's config at one R: every probe on, every step, nothing accumulated over training."""
    from grpo_cli.config.schema import Config

    cfg = OmegaConf.merge(OmegaConf.structured(Config), OmegaConf.to_container(cfg, resolve=True))
    cfg.rollout.group_size = group_size
    if prompts is not None:
        cfg.rollout.prompts_per_step = prompts
    if seed is not None:
        cfg.seed = seed
    cfg.probes.enabled = True
    cfg.probes.every = 1
    cfg.probes.matrices = [m for m in cfg.probes.matrices if m not in ACCUMULATED]
    cfg.resume = False
    cfg.experiment.name = f"{cfg.experiment.name}_probe"
    return cfg


def parse_group_sizes(text: str) -> list[int]:
    """'2,4,8,16' -> [2, 4, 8, 16]; a clear error for anything else."""
    try:
        sizes = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise ConfigError(f"--group-sizes {text!r}: give integers separated by commas, e.g. 2,4,8,16") from None
    if not sizes or min(sizes) < 2:
        raise ConfigError(f"--group-sizes {text!r}: every R must be >= 2")
    return sorted(set(sizes))


def probe_checkpoint(
    path: Path,
    group_sizes: list[int],
    prompts: int | None = None,
    seed: int | None = None,
    out: Path | None = None,
    all_checkpoints: bool = False,
    overrides: list[str] | tuple[str, ...] = (),
    check: Callable[[DictConfig], None] | None = None,
    log=print,
) -> list[Path]:
    """Probe `path` at every R in `group_sizes`; return the results directories (one per R).

    `check` (the CLI passes grpo_cli.validate.validate_config) refuses a bad config before any
    model is built.
    """
    target = resolve_target(path, list(overrides), all_checkpoints)
    configs = {size: probe_config(target.cfg, size, prompts, seed) for size in group_sizes}
    for cfg in configs.values():  # every R checked before any model is built
        if check is not None:
            check(cfg)
    first = next(iter(configs.values()))
    out = Path(out) if out is not None else Path(first.results_dir) / "probe" / target.name
    _check_out(out)
    _check_sizes(configs[max(configs)], log)  # the largest R, before any R is probed
    written = []
    for size, cfg in configs.items():
        run_dir = out / f"R{size}"
        _probe_one(cfg, run_dir, target, path, log)
        written.append(run_dir)
        gc.collect()
    log(f"results: {out}")
    return written


def _check_out(out: Path) -> None:
    """ConfigError naming --out unless files can be created there."""
    try:
        out.mkdir(parents=True, exist_ok=True)
        (out / f".write-test-{os.getpid()}").touch()
        (out / f".write-test-{os.getpid()}").unlink()
    except OSError as error:
        raise ConfigError(f"--out {out}: cannot write there ({error.strerror or error})") from None


def _check_sizes(cfg: DictConfig, log) -> None:
    """The checks of a run's set-up that need no weights (record counts, prompt lengths, memory:
    grpo_cli/train/preflight.py), so that an R too large is refused before a smaller R is probed."""
    from grpo_cli.tasks import build_task
    from grpo_cli.train.preflight import check_before_building
    from grpo_cli.train.setup import resolve_device

    check_before_building(cfg, build_task(cfg.task), resolve_device(cfg.device), log)


def _probe_one(cfg: DictConfig, run_dir: Path, target: ProbeTarget, source: Path, log) -> None:
    from grpo_cli.algorithm.advantages import get_estimator
    from grpo_cli.results.lock import RunLock
    from grpo_cli.results.rows import run_record, utc_now
    from grpo_cli.results.writer import RunResults
    from grpo_cli.train.checkpoint import load_weights
    from grpo_cli.train.loop import TrainingLoop
    from grpo_cli.train.setup import build_components

    with RunLock(run_dir):
        results = RunResults(run_dir)
        for stale in (results.metrics, results.timings, results.evals, results.events,
                      results.ranks, results.spectra):
            stale.path.unlink(missing_ok=True)  # a probe is re-measured, never resumed
        results = RunResults(run_dir)
        (run_dir / "config.yaml").write_text(OmegaConf.to_yaml(cfg, resolve=True))
        record = run_record(
            trainer="grpo-probe", seed=cfg.seed, group_size=cfg.rollout.group_size,
            estimator_facts=get_estimator(cfg.algorithm.name).facts(), model=cfg.model.name,
            task=cfg.task.name, experiment=cfg.experiment.name, param_regex=cfg.probes.param_regex,
            weights=cfg.model.weights, reward=cfg.task.reward,
            initial_model={"kind": "checkpoint", "path": str(source), "shared": True},
            extra={"kind": "probe",
                   "probe": {"source": str(source), "source_kind": target.kind,
                             "source_seed": target.seed,  # the probed run's own seed (None: a model)
                             "checkpoints": {str(step): str(file) if file else None
                                             for step, file in target.checkpoints}}},
        )
        results.write_status(record)
        try:
            parts = build_components(cfg, run_dir / "checkpoints" / "initial_layers.pt", log=log)
            record["device"] = str(parts.device)
            results.ensure_files()
            loop = TrainingLoop(cfg, parts)
            for step, file in target.checkpoints:
                if file is not None:
                    load_weights(file, parts.model, parts.trainer.value_head, parts.device)
                    parts.backend.sync_weights(parts.model)
                done = loop.run_step(step, update=False)
                results.ranks.append(done.probe_rows.ranks)
                results.spectra.append(done.probe_rows.spectra)
                results.grad_norms.append(done.probe_rows.grad_norms)
                results.metrics.append([done.output.metrics])
                results.timings.append([done.timings])
                record["last_step"] = step
                log(f"R={cfg.rollout.group_size} step {step}: reward {done.output.metrics['reward_mean']:.3f}")
            record["status"] = "completed"
        except BaseException as error:  # noqa: BLE001 - recorded, then re-raised
            record["status"] = "failed"
            record["error"] = f"{type(error).__name__}: {error}"
            raise
        finally:
            record["ended_at"] = utc_now()
            results.write_status(record)
