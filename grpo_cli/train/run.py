"""One run, start to finish: set up, resume, loop, record, and always leave an honest status.

`run.json` says `running` while the loop goes, `completed` at the end, `interrupted` (with the
signal and the last step) on SIGTERM or SIGINT, and `failed` (with the error) on any exception,
including a NaN loss; every row written before stays readable, and a full disk still gets its
`failed` recorded (grpo_cli/results/writer.py keeps room for that write) and named in one line.
The first SIGTERM or Ctrl-C lets the step in progress finish and saves a checkpoint there (a
re-run resumes at the next step); a second one stops at once, and a re-run resumes from the last
checkpoint (`checkpoint_step`). The run holds its directory (grpo_cli/results/lock.py) from its
first write to its last, so two runs never share one.
"""

from __future__ import annotations

import errno
import gc
import signal
import threading
from contextlib import contextmanager
from pathlib import Path

from omegaconf import OmegaConf

from grpo_cli.algorithm.advantages import get_estimator
from grpo_cli.models.policy import initial_model_record
from grpo_cli.results.lock import RunLock
from grpo_cli.results.rows import run_record, utc_now
from grpo_cli.results.writer import RunResults
from grpo_cli.runtime.files import FileWriteError, disk_full_error
from grpo_cli.train.checkpoint import drop_previous
from grpo_cli.train.fault import Fault
from grpo_cli.train.resume_guard import check_resume


class RunInterrupted(KeyboardInterrupt):
    """SIGTERM (what SLURM and most schedulers send) or Ctrl-C: the run stops, resumable."""

    def __init__(self, signal_name: str = "SIGTERM"):
        super().__init__(signal_name)
        self.signal_name = signal_name


class StopRequests:
    """The first SIGTERM or SIGINT asks the loop to stop after the step in progress, with a
    checkpoint, so a re-run resumes exactly there (`checkpoint_every` may be far away); a second
    one stops at once (a re-run then resumes from the last checkpoint). During set-up (a warm
    start can take minutes) there is no step to finish and nothing to save: the first one stops
    at once. Main thread only, where signals land; elsewhere the default handlers stay."""

    def __init__(self, log=print):
        self.log = log
        self.requested: str | None = None  # the first signal's name
        self.training = False  # the loop has begun (set by _train once set-up is done)
        self.deferring = False  # inside deferred(): a stop at once waits for the block's end
        self.pending: str | None = None  # the signal that will stop the run at the block's end

    def _handle(self, signum, frame):
        name = signal.Signals(signum).name
        if (self.requested is not None or not self.training) and self.deferring:
            self.pending = name
            return
        if self.requested is not None or not self.training:
            raise RunInterrupted(name)
        self.requested = name
        self.log(f"{name} received: stopping after the step in progress, with a checkpoint "
                 f"(send it again to stop at once)")

    def stop_now_if_requested(self) -> None:
        if self.requested is not None:
            raise RunInterrupted(self.requested)

    @contextmanager
    def deferred(self):
        """A block no signal cuts in two (a checkpoint's renames and the record of its step, a
        few microseconds): a signal that stops the run at once takes effect at the block's end,
        so the status never names another checkpoint than the one on disk."""
        self.deferring = True
        try:
            yield
        finally:
            self.deferring = False
        pending, self.pending = self.pending, None
        if pending is not None:
            raise RunInterrupted(pending)

    @contextmanager
    def installed(self):
        if threading.current_thread() is not threading.main_thread():
            yield self
            return
        previous = {sig: signal.signal(sig, self._handle) for sig in (signal.SIGTERM, signal.SIGINT)}
        try:
            yield self
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)


def run_experiment(cfg, run_dir: Path, log=print) -> str:
    """Train one configuration into `run_dir`; return its final status.

    Raises RunLockedError, before touching anything, if another live run holds `run_dir`.
    """
    stops = StopRequests(log)
    with RunLock(run_dir), stops.installed():
        return _run_held(cfg, Path(run_dir), log, stops)


def _run_held(cfg, run_dir: Path, log, stops: StopRequests) -> str:
    check_resume(cfg, run_dir, log)  # ConfigError before anything is written: no mixed configs
    results = RunResults(run_dir)
    if _done(cfg, results, log):  # completed here, or taken from a completed copy (reuse_from)
        return "completed"
    if not cfg.resume:
        for stale in results.checkpoint_path.parent.glob("*.pt*"):
            if stale.name != "initial_layers.pt":
                stale.unlink()
    record = run_record(
        trainer="grpo-cli", seed=cfg.seed, group_size=cfg.rollout.group_size,
        estimator_facts=get_estimator(cfg.algorithm.name).facts(), model=cfg.model.name, task=cfg.task.name,
        experiment=cfg.experiment.name, param_regex=cfg.probes.param_regex,
        weights=cfg.model.weights, reward=cfg.task.reward, initial_model=initial_model_record(cfg),
    )
    try:
        (results.run_dir / "config.yaml").write_text(OmegaConf.to_yaml(cfg, resolve=True))
        results.write_status(record)
    except OSError as error:  # a disk full before the run begins
        if _disk_full(error):
            raise disk_full_error(error, run_dir) from None
        raise
    from grpo_cli.train.tracking import finish_trackers, start_trackers

    trackers = start_trackers(cfg, run_dir, log)  # off unless logger=...; never stops the run
    try:
        _train(cfg, results, record, log, stops, trackers)
        drop_previous(results.checkpoint_path)
        record["status"] = "completed"
        log(f"results: {run_dir}")
    except KeyboardInterrupt as error:  # Ctrl-C or SIGTERM: resumable, not a failure
        record["status"] = "interrupted"
        record["stopped_by"] = getattr(error, "signal_name", "SIGINT")
        resume_at = record["checkpoint_step"]
        where = (f"re-run the same command to resume at step {resume_at}" if resume_at
                 else "no checkpoint yet: re-running the same command starts over")
        log(f"interrupted by {record['stopped_by']} after step {record['last_step']}; "
            f"{where} ({run_dir})")
        raise
    except BaseException as error:  # noqa: BLE001 - recorded, then re-raised
        record["status"] = "failed"
        if _disk_full(error):  # a bare ENOSPC (a row, a table): named with the free space
            error = disk_full_error(error, run_dir)
            record["error"] = f"{type(error).__name__}: {error}{Fault.from_config(cfg).note()}"
            raise error from None
        record["error"] = f"{type(error).__name__}: {error}{Fault.from_config(cfg).note()}"
        raise
    finally:
        gc.unfreeze()  # the next run in this process (a multirun) may collect this one's objects
        record["ended_at"] = utc_now()
        _write_final_status(results, record, log)
        finish_trackers(trackers, cfg, run_dir, record["status"], log)
    if record["rehearsal"]:  # memory and time next to docs/gpu_memory_plan.md
        from grpo_cli.results.rehearsal import write_rehearsal_report

        log(write_rehearsal_report(run_dir, record, OmegaConf.to_container(cfg, resolve=True)))
    return record["status"]


def _done(cfg, results: RunResults, log) -> bool:
    """Whether there is nothing to train: the directory holds the completed run, or a completed
    copy of it under `reuse_from` was taken (train/reuse.py)."""
    from grpo_cli.train.reuse import find_source, take_run
    from grpo_cli.train.setup import device_label, resolve_device

    previous = results.read_status()
    if previous and previous.get("status") == "completed" and cfg.resume:
        log(f"{results.run_dir}: already completed; skipping (set resume=false to start over)")
        return True
    if not cfg.get("reuse_from"):
        return False
    source = find_source(cfg, results.run_dir, device_label(resolve_device(cfg.device)))
    if source is None:
        return False
    take_run(cfg, source, results)
    log(f"{results.run_dir}: the run {source} holds (every setting that changes results agrees, "
        "same device and versions); its files copied, not trained again (resume=false trains anew)")
    return True


def _disk_full(error: BaseException) -> bool:
    return (isinstance(error, OSError) and error.errno == errno.ENOSPC
            and not isinstance(error, FileWriteError))


def _write_final_status(results: RunResults, record: dict, log) -> None:
    """run.json's last write. If even that fails (a disk full past the status file's reserve,
    grpo_cli/results/writer.py), a run that failed says so in the log and its own error (the
    cause) stays the one raised; a completed run's failure to record it is raised."""
    try:
        results.write_status(record)
    except OSError as error:
        if record["status"] == "completed":
            if _disk_full(error):
                raise disk_full_error(error, results.run_dir) from None
            raise
        log(f"could not record status {record['status']!r} in {results.run_dir / 'run.json'}: "
            f"{type(error).__name__}: {error}")


def _train(cfg, results: RunResults, record: dict, log, stops: StopRequests, trackers) -> None:
    from grpo_cli.train.alarms import AlarmMonitor
    from grpo_cli.train.checkpoint import resume_checkpoint
    from grpo_cli.train.loop import TrainingLoop
    from grpo_cli.train.setup import (
        build_components,
        device_label,
        freeze_long_lived_objects,
        resolved_rollout,
    )

    parts = build_components(cfg, results.run_dir / "checkpoints" / "initial_layers.pt", log=log)
    device = parts.device
    loop = TrainingLoop(cfg, parts)
    record["device"] = device_label(device)
    record["rollout_resolved"] = resolved_rollout(cfg, parts.backend)  # auto settings, as chosen
    monitor = AlarmMonitor.from_config(cfg.alarms)

    start = 0
    resumed = None
    if cfg.resume:
        resumed = resume_checkpoint(results.checkpoint_path, parts.trainer, monitor, parts.probes, log=log)
    if resumed is not None:
        start = record["resumed_from"] = record["checkpoint_step"] = resumed
        log(f"resuming {results.run_dir} at step {start}")
    freeze_long_lived_objects()
    results.truncate_from(start)
    results.ensure_files()
    if start == 0 and cfg.keep_checkpoints:  # W_0: the weights every kept step is compared with
        from grpo_cli.train.checkpoint import save_weights_snapshot

        save_weights_snapshot(results.checkpoint_path.parent, 0, parts.trainer)
    results.write_status(record)

    stops.training = True  # from here a first signal finishes the step and saves a checkpoint
    _steps(cfg, loop, start, monitor, _Recorder(cfg, results, record, stops, trackers), log)


class _Recorder:
    """Where the loop's steps go: result tables, trackers, checkpoints and run.json."""

    def __init__(self, cfg, results: RunResults, record: dict, stops: StopRequests, trackers):
        self.cfg, self.results, self.record, self.stops, self.trackers = cfg, results, record, stops, trackers
        self.fault = Fault.from_config(cfg)

    def step(self, step: int, done, monitor, log) -> list:
        """One step's rows (probes, evaluation, metrics, timings, alarms) and trackers; return
        the alarms' events of this step."""
        results, output = self.results, done.output
        if done.probe_rows is not None:
            results.ranks.append(done.probe_rows.ranks)
            results.spectra.append(done.probe_rows.spectra)
            results.grad_norms.append(done.probe_rows.grad_norms)
        if done.eval_row is not None:
            results.evals.append([done.eval_row])
        results.metrics.append([output.metrics])
        results.timings.append([done.timings])
        events = monitor.update(step, output.metrics)
        for event in events:
            log(f"ALARM step {event.step}: {event.message}")
        results.events.append([vars(event) for event in events])
        self.trackers.step(step, output.metrics, done.eval_row,
                           done.probe_rows.ranks if done.probe_rows is not None else None, events)
        self.record["last_step"] = step
        return events

    def checkpoint(self, finished: int, trainer, monitor, probes) -> None:
        """The run's state after `finished` steps. Its write may take seconds (a second signal
        stops the run at once there: the last checkpoint stays whole and recorded); its renames
        and the record of its step are one deferred block."""
        from grpo_cli.train.checkpoint import (
            commit_checkpoint,
            save_weights_snapshot,
            write_checkpoint,
        )

        path = self.results.checkpoint_path
        temporary = write_checkpoint(path, finished, trainer, monitor, probes)
        with self.stops.deferred():
            commit_checkpoint(temporary, path)
            self.record["checkpoint_step"] = finished
        if self.cfg.keep_checkpoints:
            save_weights_snapshot(path.parent, finished, trainer)

    def end_step(self, step: int, finished: int, due: bool, state) -> None:
        """After step `step`'s rows: a checkpoint if `due`, run.json, then a stop if a signal
        asked for one. The stop request is read after the status is written, and the stop
        itself checkpoints, so a first signal that arrives at any point of the step ends the
        run with a checkpoint at `finished` (it once could land between the two and end the
        run without one)."""
        trainer, monitor, probes = state
        if due or self.stops.requested:
            self.checkpoint(finished, trainer, monitor, probes)
        self.results.write_status(self.record)
        self.fault.after_step_recorded(step)  # fault.kind=sigterm: a signal in that window
        if finished < self.cfg.train.steps and self.stops.requested is not None:
            if self.record["checkpoint_step"] != finished:
                self.checkpoint(finished, trainer, monitor, probes)
                self.results.write_status(self.record)
            self.stops.stop_now_if_requested()


def _steps(cfg, loop, start: int, monitor, recorder: _Recorder, log) -> None:
    """Steps `start`..train.steps - 1, each recorded, checkpointed when due, stopped on request."""
    from grpo_cli.train.progress import StepProgress

    steps, results = cfg.train.steps, recorder.results
    state = (loop.trainer, monitor, loop.probes)  # what a checkpoint saves
    accuracy = None
    with StepProgress(steps, start, enabled=cfg.progress, label=results.run_dir.name) as progress:
        if start == 0 and loop.eval_every > 0:  # the policy before any step
            row = loop.evaluate(0)
            results.evals.append([row])
            recorder.trackers.step(0, eval_row=row)
            accuracy = row["accuracy"]
        for step in range(start, steps):
            done = loop.run_step(step)
            events = recorder.step(step, done, monitor, log)
            if done.eval_row is not None:
                accuracy = done.eval_row["accuracy"]
            progress.advance(done.output.metrics["reward_mean"], accuracy)
            finished = step + 1
            due = finished % cfg.checkpoint_every == 0 or finished == steps or bool(events)
            recorder.end_step(step, finished, due, state)
            if events and cfg.alarms.stop_on_alarm:
                recorder.record["stopped_by"] = events[0].alarm
                log(f"stopping at step {step}: alarms.stop_on_alarm=true")
                break
