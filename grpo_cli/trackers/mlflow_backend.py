"""MLflow through `MlflowClient`: experiment = logger.project; one parent run per grpo experiment
(created once, under a file lock, by whichever member starts first) and one child run per member,
so a sweep reads as one nested group in the MLflow UI. The default store is a file store,
<results_dir>/mlruns (MLflow 3 wants MLFLOW_ALLOW_FILE_STORE=true for it, set here; use
logger.tracking_uri or MLFLOW_TRACKING_URI for a server or a database).

A server that cannot be reached is given up within seconds: MLflow's own defaults retry each
request 7 times with exponential backoff and a 120 s timeout (about 4 minutes before the run could
start, and as long again to stop on SIGTERM), so unless set in the environment, requests here are
retried once after 1 s and time out after 5 s (FAST_FAIL); the run then goes on without MLflow,
with one warning."""

from __future__ import annotations

import os
import time
from pathlib import Path

from filelock import FileLock
from mlflow.entities import Metric, Param, RunStatus
from mlflow.tracking import MlflowClient

GROUP_TAG = "grpo.experiment_dir"  # the parent run of every member of one experiment directory
FAST_FAIL = {  # MLflow's request settings (read per request), unless the environment sets them
    "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "1",
    "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1",
    "MLFLOW_HTTP_REQUEST_TIMEOUT": "5",
}


class MlflowBackend:
    name = "mlflow"

    def __init__(self, identity, tracking_uri: str, experiment_name: str):
        if tracking_uri.startswith("file:"):  # MLflow 3 keeps its file store behind this opt-in
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        for name, value in FAST_FAIL.items():
            os.environ.setdefault(name, value)
        self.client = MlflowClient(tracking_uri=tracking_uri)
        experiment = self.client.get_experiment_by_name(experiment_name)
        experiment_id = (experiment.experiment_id if experiment is not None
                         else self.client.create_experiment(experiment_name))
        group_dir = identity.run_dir.parent
        group_dir.mkdir(parents=True, exist_ok=True)
        with FileLock(str(group_dir / ".mlflow-parent.lock")):
            parent = self._parent_run(experiment_id, str(group_dir.resolve()), identity.experiment)
        self.run_id = self.client.create_run(
            experiment_id, run_name=identity.name,
            tags={"mlflow.parentRunId": parent, "grpo.run_dir": str(identity.run_dir.resolve())},
        ).info.run_id
        params = [Param(key, str(value)[:500]) for key, value in sorted(identity.params.items())]
        for start in range(0, len(params), 100):  # MLflow takes at most 100 params per batch
            self.client.log_batch(self.run_id, params=params[start:start + 100])
        self.alarms: list[str] = []
        self.where = f"{tracking_uri}, experiment {experiment_name!r}, run {self.run_id}"

    def _parent_run(self, experiment_id: str, group_dir: str, name: str) -> str:
        found = self.client.search_runs([experiment_id], filter_string=f"tags.`{GROUP_TAG}` = '{group_dir}'",
                                        max_results=1)
        if found:
            return found[0].info.run_id
        return self.client.create_run(experiment_id, run_name=name, tags={GROUP_TAG: group_dir}).info.run_id

    def scalars(self, step: int, values: dict[str, float]) -> None:
        now = int(time.time() * 1000)
        metrics = [Metric(tag, value, now, step) for tag, value in values.items()]
        for start in range(0, len(metrics), 1000):
            self.client.log_batch(self.run_id, metrics=metrics[start:start + 1000])

    def text(self, step: int, tag: str, text: str) -> None:
        self.alarms.append(f"step {step} {tag}: {text}")
        self.client.log_text(self.run_id, "\n".join(self.alarms) + "\n", "alarms.txt")

    def figures(self, paths: list[Path]) -> None:
        for path in paths:
            self.client.log_artifact(self.run_id, str(path), "figures")

    def close(self, status: str) -> None:
        final = {"completed": RunStatus.FINISHED, "interrupted": RunStatus.KILLED}.get(status, RunStatus.FAILED)
        final = RunStatus.to_string(final)
        self.client.set_terminated(self.run_id, status=final)
