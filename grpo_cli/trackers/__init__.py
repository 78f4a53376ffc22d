"""Experiment trackers: a run's metrics, rank curves, alarms and figures sent to TensorBoard,
Weights & Biases and/or MLflow, each through its own client, imported only when chosen.

Off by default (`logger=none`); `logger=tensorboard`, `logger=[wandb,mlflow]` pick any set
(grpo_cli/config/schema.py LoggerConfig). The run directory stays the source of truth: the
trackers receive the rows the run has just written (grpo_cli/train/run.py), and a tracker that
fails (package missing, no network, bad key) is dropped with one warning while the run goes on.
Members of one experiment (a sweep) are grouped the way each tracker expects: one TensorBoard
log dir per run under one root, a W&B group, an MLflow parent run.
"""

from grpo_cli.trackers.fanout import RunIdentity, Trackers, open_trackers, rank_curves

__all__ = ["RunIdentity", "Trackers", "open_trackers", "rank_curves"]
