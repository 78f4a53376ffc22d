"""Experiment trackers (grpo_cli/trackers/): each one's files are read back with its own reader
(TensorBoard's EventAccumulator, W&B's offline record file, MLflow's client) and hold the metrics
and the rank curves at the steps ranks.csv has; a sweep's members are grouped; a failing tracker
is dropped with one warning and the run goes on."""

import json
import math
import struct
from pathlib import Path

import pandas as pd
import pytest
from cli_helpers import grpo_run
from omegaconf import OmegaConf

from grpo_cli.trackers import RunIdentity, Trackers, open_trackers, rank_curves

SERIES = "rank/rollout_batch/erank_entropy"


def test_rank_curves_average_the_rows_of_each_chosen_matrix_and_measure():
    rows = [
        {"matrix": "layer", "layer": "a", "erank_entropy": 2.0, "stable_rank": 1.0},
        {"matrix": "layer", "layer": "b", "erank_entropy": 4.0, "stable_rank": float("nan")},
        {"matrix": "rollout_batch", "layer": "all", "erank_entropy": 1.5, "stable_rank": None},
    ]
    assert rank_curves(rows, ["layer/erank_entropy"]) == {"rank/layer/erank_entropy": 3.0}
    assert rank_curves(rows, ["all"]) == {
        "rank/layer/erank_entropy": 3.0, "rank/layer/stable_rank": 1.0,
        "rank/rollout_batch/erank_entropy": 1.5,
    }
    assert rank_curves(rows, ["update/erank_entropy"]) == {}


class Recording:
    name = "recording"

    def __init__(self):
        self.calls = []

    def scalars(self, step, values):
        self.calls.append((step, values))

    def text(self, step, tag, text):
        self.calls.append((step, tag, text))

    def close(self, status):
        self.calls.append(status)


class Broken(Recording):
    name = "broken"

    def scalars(self, step, values):
        raise ConnectionError("no network\nsecond line")


def test_a_failing_tracker_warns_once_and_the_others_go_on():
    good, broken, lines = Recording(), Broken(), []
    trackers = Trackers([broken, good], ["rollout_batch/erank_entropy"], log=lines.append)
    for step in range(3):
        trackers.step(step, {"step": step, "reward_mean": 0.5, "kl": float("nan")},
                      rank_rows=[{"matrix": "rollout_batch", "erank_entropy": 2.0}])
    trackers.close("completed")
    assert lines == ["WARNING tracker broken dropped (ConnectionError: no network); the run goes on, "
                     "its results directory has everything"]
    assert good.calls[0] == (0, {"train/reward_mean": 0.5, SERIES: 2.0})  # NaN kl left out
    assert [call[0] for call in good.calls[:3]] == [0, 1, 2] and good.calls[-1] == "completed"


def test_a_tracker_that_cannot_start_is_left_out_with_one_warning(tmp_path):
    pytest.importorskip("mlflow")
    cfg = OmegaConf.create({"mlflow": True, "tracking_uri": "nosuchscheme://x", "project": "p",
                            "rank_series": []})
    lines = []
    trackers = open_trackers(cfg, RunIdentity(tmp_path / "exp" / "run", "exp"), log=lines.append)
    assert not trackers and len(lines) == 1 and lines[0].startswith("WARNING tracker mlflow not started")


def test_an_unanswering_mlflow_server_is_given_up_within_seconds(tmp_path, monkeypatch):
    """A server that takes the connection and never answers (a hung or firewalled host): with
    MLflow's defaults (120 s timeout, 7 retries) the run waited minutes before it could start."""
    pytest.importorskip("mlflow")
    import socket
    import time

    from grpo_cli.trackers.mlflow_backend import FAST_FAIL

    for name in FAST_FAIL:  # as MLflow's defaults; restored (or removed) after the test
        monkeypatch.setenv(name, "")
        monkeypatch.delenv(name)
    with socket.socket() as silent:  # connections complete in the backlog; nothing ever answers
        silent.bind(("127.0.0.1", 0))
        silent.listen(16)
        cfg = OmegaConf.create({"mlflow": True, "tracking_uri": f"http://127.0.0.1:{silent.getsockname()[1]}",
                                "project": "p", "rank_series": []})
        lines = []
        began = time.monotonic()
        trackers = open_trackers(cfg, RunIdentity(tmp_path / "exp" / "run", "exp"), log=lines.append)
        elapsed = time.monotonic() - began
    assert elapsed < 60, elapsed  # loose: two 5 s timeouts and a 1 s backoff here
    assert not trackers and len(lines) == 1 and lines[0].startswith("WARNING tracker mlflow not started")
    assert lines[0].endswith("the run goes on without it")


def wandb_records(run_file: Path) -> list:
    """The records of a W&B offline run file: a 7-byte header, then LevelDB-log framed protobufs
    (32 KiB blocks; chunks typed full / first / middle / last)."""
    from wandb.proto import wandb_internal_pb2

    data, position, records, pending = run_file.read_bytes(), 7, [], b""
    assert data[:4] == b":W&B"
    while position + 7 <= len(data):
        if 32768 - position % 32768 < 7:  # block trailer
            position += 32768 - position % 32768
            continue
        _, length, kind = struct.unpack("<IHB", data[position:position + 7])
        chunk = data[position + 7:position + 7 + length]
        position += 7 + length
        pending = chunk if kind in (1, 2) else pending + chunk
        if kind in (1, 4):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            records.append(record)
    return records


def probe_steps(run_dir: Path) -> tuple[list[int], list[float]]:
    ranks = pd.read_csv(run_dir / "ranks.csv")
    means = ranks[ranks["matrix"] == "rollout_batch"].groupby("step")["erank_entropy"].mean()
    return list(means.index), list(means.values)


def test_a_sweep_reaches_every_tracker_grouped(tmp_path, cache_dir, monkeypatch):
    for package in ("tensorboard", "wandb", "mlflow"):
        pytest.importorskip(package)
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    results = tmp_path / "results"
    result = grpo_run(results, cache_dir, "rollout.group_size=2,4",
                      "logger=[tensorboard,wandb,mlflow]", multirun=True)
    assert result.exit_code == 0, result.output
    members = ["R2-grpo-s0", "R4-grpo-s0"]
    for name in members:
        assert json.loads((results / "smoke" / name / "run.json").read_text())["status"] == "completed"
    assert "WARNING" not in result.output, result.output

    # TensorBoard: one log dir per member under one root, read by tensorboard's own reader
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    for name in members:
        steps, means = probe_steps(results / "smoke" / name)
        events = EventAccumulator(str(results / "smoke" / "tensorboard" / name),
                                  size_guidance={"scalars": 0, "images": 0})
        events.Reload()
        ranks = events.Scalars(SERIES)
        assert [e.step for e in ranks] == steps and len(steps) >= 2
        assert all(math.isclose(e.value, m, rel_tol=1e-6) for e, m in zip(ranks, means, strict=True))
        metrics = pd.read_csv(results / "smoke" / name / "metrics.csv")
        assert [e.step for e in events.Scalars("train/reward_mean")] == list(metrics["step"])
        assert [e.step for e in events.Scalars("eval/accuracy")] == list(pd.read_csv(
            results / "smoke" / name / "eval.csv")["step"])
        assert "figures/effective_rank" in events.Tags()["images"]

    # W&B offline: one run file per member, in the experiment's group
    run_files = sorted((results / "smoke" / "wandb").glob("offline-run-*/run-*.wandb"))
    assert len(run_files) == 2
    by_name = {}
    for run_file in run_files:
        records = wandb_records(run_file)
        run = next(r.run for r in records if r.WhichOneof("record_type") == "run")
        assert run.run_group == "smoke"
        history = [{item.key or "/".join(item.nested_key): json.loads(item.value_json)
                    for item in r.history.item}
                   for r in records if r.WhichOneof("record_type") == "history"]
        by_name[run.display_name] = [(row["grpo_step"], row[SERIES]) for row in history if SERIES in row]
    for name in members:
        steps, means = probe_steps(results / "smoke" / name)
        assert [step for step, _ in by_name[name]] == steps
        assert all(math.isclose(v, m, rel_tol=1e-9) for (_, v), m in zip(by_name[name], means, strict=True))

    # MLflow file store, read back with MlflowClient: one parent run, a child per member
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=(results / "mlruns").resolve().as_uri())
    experiment = client.get_experiment_by_name("grpo-cli")
    runs = client.search_runs([experiment.experiment_id])
    parents = [r for r in runs if "mlflow.parentRunId" not in r.data.tags]
    children = {r.info.run_name: r for r in runs if "mlflow.parentRunId" in r.data.tags}
    assert len(parents) == 1 and sorted(children) == members
    for name, child in children.items():
        assert child.data.tags["mlflow.parentRunId"] == parents[0].info.run_id
        assert child.info.status == "FINISHED" and child.data.params["rollout.group_size"] in "24"
        steps, means = probe_steps(results / "smoke" / name)
        history = sorted(client.get_metric_history(child.info.run_id, SERIES), key=lambda m: m.step)
        assert [m.step for m in history] == steps
        assert all(math.isclose(m.value, v, rel_tol=1e-9) for m, v in zip(history, means, strict=True))
        assert "train/reward_mean" in child.data.metrics
        figures = [f.path for f in client.list_artifacts(child.info.run_id, "figures")]
        assert "figures/effective_rank.png" in figures


def test_alarms_reach_each_tracker_as_a_value_and_a_message():
    from grpo_cli.train.alarms import AlarmEvent

    good = Recording()
    event = AlarmEvent(step=7, alarm="entropy_collapse", value=0.2, message="entropy 0.2 < 0.5 for 50 steps")
    Trackers([good], [], log=print).step(7, {"step": 7, "entropy": 0.2}, alarms=[event])
    assert good.calls == [
        (7, {"train/entropy": 0.2, "alarm/entropy_collapse": 0.2}),
        (7, "alarm/entropy_collapse", "entropy 0.2 < 0.5 for 50 steps"),
    ]
