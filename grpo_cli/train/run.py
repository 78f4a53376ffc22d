"""One run, start to finish: set up, resume, loop, record, and always leave an honest status.

`run.json` says `running` while the loop goes, `completed` at the end and `failed` (with the
error) on any exception, including a NaN loss or Ctrl-C; every row written before stays readable.
"""

from __future__ import annotations

import datetime as dt
import gc
import platform
import sys
import time
from pathlib import Path

import torch
from omegaconf import OmegaConf

import grpo_cli
from grpo_cli.results.writer import RunResults
from grpo_cli.train.memory import peak_memory_mb, reset_step_peak


def utc_now() -> str:
    return dt.datetime.now(dt.UTC).isoformat(timespec="seconds")


def versions() -> dict:
    import transformers

    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "grpo_cli": grpo_cli.__version__,
    }


def run_experiment(cfg, run_dir: Path, log=print) -> str:
    """Train one configuration into `run_dir`; return its final status."""
    results = RunResults(run_dir)
    previous = results.read_status()
    if previous and previous.get("status") == "completed" and cfg.resume:
        log(f"{run_dir}: already completed; skipping (set resume=false to start over)")
        return "completed"
    if not cfg.resume and results.checkpoint_path.exists():
        results.checkpoint_path.unlink()
    (results.run_dir / "config.yaml").write_text(OmegaConf.to_yaml(cfg, resolve=True))
    record = {
        "status": "running",
        "error": None,
        "started_at": utc_now(),
        "ended_at": None,
        "last_step": None,
        "stopped_by": None,
        "versions": versions(),
        "device": None,
        "seed": cfg.seed,
        "group_size": cfg.rollout.group_size,
        "estimator": cfg.algorithm.name,
        "model": cfg.model.name,
        "task": cfg.task.name,
        "experiment": cfg.experiment.name,
        "resumed_from": None,
        "gram_params": cfg.analysis.param_regex,
        "argv": sys.argv,
    }
    results.write_status(record)
    try:
        _train(cfg, results, record, log)
        record["status"] = "completed"
    except BaseException as error:  # noqa: BLE001 - recorded, then re-raised
        record["status"] = "failed"
        record["error"] = f"{type(error).__name__}: {error}"
        raise
    finally:
        gc.unfreeze()  # the next run in this process (a multirun) may collect this one's objects
        record["ended_at"] = utc_now()
        results.write_status(record)
    return record["status"]


def _train(cfg, results: RunResults, record: dict, log) -> None:
    from grpo_cli.train.alarms import AlarmMonitor
    from grpo_cli.train.checkpoint import load_checkpoint, save_checkpoint
    from grpo_cli.train.evaluate import evaluate
    from grpo_cli.train.progress import StepProgress
    from grpo_cli.train.setup import build_components, freeze_long_lived_objects
    from grpo_cli.train.trainer import step_seed

    parts = build_components(cfg, results.run_dir / "checkpoints" / "initial_layers.pt", log=log)
    device, loaded, trainer, probes = parts.device, parts.loaded, parts.trainer, parts.probes
    model = loaded.model
    record["device"] = str(device) + (
        f" ({torch.cuda.get_device_name(device)})" if device.type == "cuda" else ""
    )
    monitor = AlarmMonitor.from_config(cfg.alarms)

    start = 0
    if cfg.resume and results.checkpoint_path.exists():
        start = load_checkpoint(results.checkpoint_path, trainer, monitor)
        record["resumed_from"] = start
        log(f"resuming {results.run_dir} at step {start}")
    freeze_long_lived_objects()
    results.truncate_from(start)
    results.ensure_files()
    results.write_status(record)

    steps = cfg.algorithm.steps
    accuracy = None
    with StepProgress(steps, start, enabled=cfg.progress, label=results.run_dir.name) as progress:
        if start == 0:
            accuracy = _evaluate_into(results, evaluate, trainer, cfg, 0)
        for step in range(start, steps):
            reset_step_peak(device)
            clock = time.perf_counter()
            probe_now = probes is not None and probes.due(step, steps)
            output = trainer.step(step, capture_layers=probes.capture_layer_grads if probe_now else None)
            time_probe = 0.0
            if probe_now:
                probe_clock = time.perf_counter()
                probe_rows = probes.record(step, output, model)
                output.metrics.update(probe_rows.metrics)
                results.ranks.append(probe_rows.ranks)
                results.spectra.append(probe_rows.spectra)
                time_probe = time.perf_counter() - probe_clock
            time_eval = 0.0
            finished = step + 1
            if finished % cfg.analysis.eval_every == 0 or finished == steps:
                eval_clock = time.perf_counter()
                accuracy = _evaluate_into(
                    results, evaluate, trainer, cfg, finished, seed=step_seed(cfg.seed, finished, salt=7),
                )
                time_eval = time.perf_counter() - eval_clock
            output.timings.update(
                time_probe=time_probe,
                time_eval=time_eval,
                time_step=time.perf_counter() - clock,
                peak_memory_mb=peak_memory_mb(device),
            )
            results.metrics.append([output.metrics])
            results.timings.append([output.timings])
            events = monitor.update(step, output.metrics)
            for event in events:
                log(f"ALARM step {event.step}: {event.message}")
            results.events.append([vars(event) for event in events])
            record["last_step"] = step
            progress.advance(output.metrics["reward_mean"], accuracy)
            if finished % cfg.checkpoint_every == 0 or finished == steps or events:
                save_checkpoint(results.checkpoint_path, finished, trainer, monitor)
            results.write_status(record)
            if events and cfg.alarms.stop_on_alarm:
                record["stopped_by"] = events[0].alarm
                log(f"stopping at step {step}: alarms.stop_on_alarm=true")
                break


def _evaluate_into(results, evaluate, trainer, cfg, step: int, seed: int = 0):
    backend, tokenizer, task = trainer.backend, trainer.tokenizer, trainer.task
    with trainer.autocast():  # sample as training does (bf16 when model.autocast=bf16)
        row = evaluate(backend, tokenizer, task, cfg, seed)
    results.evals.append([{"step": step, **row}])
    return row["accuracy"]
